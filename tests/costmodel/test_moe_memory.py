"""MoE models with dense layers (DeepSeek-V3's dense-first layers, Llama 4 Maverick's alternating pattern): the
partition's mean layer syncs and steps the model's exact parameters, and a stage's memory is charged for the most
MoE layers its consecutive layers can hold, checked against every window of the real layer pattern."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.estimate import CostModel
from autotune.costmodel.memory import dense_layer_params, moe_layer_params
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, chunk_layers

H100 = load_hardware("h100-sxm")
JOB = JobSpec(global_batch=256, seq_len=4096)
MAVERICK = load_model("llama4-maverick")


def _layer(model, ep=8):
    return CostModel(model, H100, JOB).layer(1, 1, 1, False, "1d", False, ep, 1)


@pytest.mark.parametrize("name", ["llama4-maverick", "deepseek-v3"])
def test_the_mean_layer_holds_the_models_parameters(name: str) -> None:
    """Gradient sync and the optimizer step run over L x the mean layer: the model's layers, summed exactly."""
    model = load_model(name)
    layer = _layer(model)
    exact = model.num_moe_layers * moe_layer_params(model, 1, 8, 1) + model.num_dense_layers * dense_layer_params(model)
    assert model.num_layers * layer.params == pytest.approx(exact, abs=model.num_layers)


@pytest.mark.parametrize(("freq", "first"), [(2, 0), (3, 0), (2, 3), (4, 1), (1, 3)])
def test_every_window_of_the_pattern_fits_its_charge(freq: int, first: int) -> None:
    """Brute force: for every stage length n and every first layer, the MoE layers in the window, charged at
    the MoE layer and the rest at the dense one, never exceed n x memory_params + surplus_params."""
    model = replace(MAVERICK, moe_layer_freq=freq, first_dense_layers=first)
    layer, moe, dense = _layer(model), moe_layer_params(model, 1, 8, 1), dense_layer_params(model)
    kinds = [model.is_moe_layer(i) for i in range(model.num_layers)]
    tight = False
    for n in range(1, model.num_layers + 1):
        for start in range(model.num_layers - n + 1):
            k = sum(kinds[start:start + n])
            held = k * moe + (n - k) * dense
            charged = n * layer.stage_params + layer.surplus_params
            assert held <= charged, (n, start)
            tight |= charged - held < (moe - dense)  # within one MoE layer of the worst window
    assert tight


def test_maverick_stage_memory_is_not_twice_its_experts() -> None:
    """A pipeline stage of 12 Maverick layers holds 6 MoE layers; the charge is at most half an MoE layer more
    (the surplus), where counting every layer as MoE would double the experts."""
    plan = Plan(tp=1, pp=4, dp=8, ep=8, mbs=1, num_microbatches=32, zero=1, layers_per_stage=(12, 12, 12, 12))
    est = CostModel(MAVERICK, H100, JOB).estimate(plan)
    moe, dense = moe_layer_params(MAVERICK, 1, 8, 1), dense_layer_params(MAVERICK)
    middle = est.stages[1]
    held = 6 * moe + 6 * dense
    assert middle.memory.weights == pytest.approx(2 * (held + (moe - dense) / 2), abs=8)
    assert middle.memory.weights < 0.65 * 2 * 12 * moe  # every layer charged as MoE: the old overcount


def _rank_layers(plan: Plan) -> list[list[int]]:
    """The layer indices each rank holds: its layers split into vpp chunks, virtual stage c * pp + r being
    rank r's chunk c, the layers dealt out in virtual order (Megatron's interleaved assignment)."""
    chunks = [list(chunk_layers(n, plan.vpp)) for n in plan.layers_per_stage]
    ranks: list[list[int]] = [[] for _ in range(plan.pp)]
    first = 0
    for c in range(plan.vpp):
        for r in range(plan.pp):
            ranks[r] += range(first, first + chunks[r][c])
            first += chunks[r][c]
    return ranks


@pytest.mark.parametrize(("pp", "vpp", "layers"), [(8, 6, (6,) * 8), (8, 2, (6,) * 8), (4, 3, (12,) * 4),
                                                    (4, 1, (12,) * 4), (2, 4, (24, 24))])
def test_interleaved_ranks_are_charged_for_every_chunk(pp: int, vpp: int, layers: tuple[int, ...]) -> None:
    """Brute force over Megatron's interleaved assignment: with pp 8 and one layer per chunk, rank 1 holds only
    Maverick's MoE layers (1, 9, 17, ...); every rank's weights are charged at least what its layers hold."""
    plan = Plan(tp=4, pp=pp, dp=64 // (4 * pp), ep=8, mbs=1, num_microbatches=8 * pp, zero=1,
                schedule="interleaved" if vpp > 1 else "1f1b", vpp=vpp, layers_per_stage=layers)
    est = CostModel(MAVERICK, H100, JobSpec(global_batch=64 // (4 * pp) * 8 * pp, seq_len=4096)).estimate(plan)
    moe, dense = moe_layer_params(MAVERICK, 4, 8, 1), dense_layer_params(MAVERICK, 4)
    for r, held in enumerate(_rank_layers(plan)):
        k = sum(MAVERICK.is_moe_layer(i) for i in held)
        vocab = est.stages[r].params - len(held) * CostModel(MAVERICK, H100, JOB).layer(
            4, 1, 1, False, "1d", False, 8, 1).params
        assert est.stages[r].memory.weights >= 2 * (k * moe + (len(held) - k) * dense + vocab), (r, k)


def test_dense_first_layers_of_stage_0_are_charged_as_dense_by_hand() -> None:
    """Megatron-Bridge's DeepSeek-V3 recipe at 1024 H100s: stage 0 holds the embedding, the 3 dense-first layers
    and 1 MoE layer (tp 2, ep 64, etp 1); its weights are 2 bytes per parameter of exactly those (memory.py's
    layer counts, not the partition's mean layer), where stage 1 holds 4 MoE layers."""
    model, tp = load_model("deepseek-v3"), 2
    plan = Plan(tp=tp, pp=16, dp=32, mbs=1, num_microbatches=128, zero=1, sequence_parallel=True, vocab="balanced",
                layers_per_stage=(4,) * 15 + (1,), ep=64, etp=1)
    est = CostModel(model, H100, JobSpec(global_batch=4096, seq_len=4096)).estimate(plan)
    moe, dense = moe_layer_params(model, tp, 64, 1), dense_layer_params(model, tp)
    embedding = model.vocab_size * model.hidden_size // tp
    assert est.stages[0].memory.weights == 2 * (3 * dense + moe + embedding)
    assert est.stages[1].memory.weights == 2 * 4 * moe
    # the optimizer term: the dense layers' 12 bytes over dp 32; the MoE layer's experts unsharded (expert dp 1)
    experts = model.num_experts // 64 * (3 * model.hidden_size * model.moe_ffn_hidden_size)
    expected = 12 * (3 * dense + moe - experts + embedding) / 32 + 12 * experts
    assert est.stages[0].memory.optimizer == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("vpp", [1, 2])
def test_a_first_chunk_shorter_than_the_dense_layers_is_credited_for_what_it_holds(vpp: int) -> None:
    """With 2 layers per chunk on rank 0, 2 of DeepSeek-V3's 3 dense layers sit there (the third opens rank 1, whose
    stage is charged an MoE layer for it, as the planner charges it)."""
    model = load_model("deepseek-v3")
    layers = (2 * vpp,) + (4,) * 14 + (61 - 2 * vpp - 56,)
    schedule = "interleaved" if vpp > 1 else "1f1b"
    plan = Plan(tp=2, pp=16, dp=32, mbs=1, num_microbatches=128, zero=1, sequence_parallel=True, vocab="balanced",
                layers_per_stage=layers, ep=64, etp=1, schedule=schedule, vpp=vpp)
    est = CostModel(model, H100, JobSpec(global_batch=4096, seq_len=4096)).estimate(plan)
    moe, dense = moe_layer_params(model, 2, 64, 1), dense_layer_params(model, 2)
    embedding = model.vocab_size * model.hidden_size // 2
    assert est.stages[0].memory.weights == 2 * (2 * dense + (2 * vpp - 2) * moe + embedding)


def test_a_dense_layer_larger_than_an_moe_layer_is_charged_its_own_size() -> None:
    """DeepSeek-V3 at tp 1, ep 64: a dense-first layer (an 18432-wide MLP whole on the GPU) holds more than an MoE
    layer with 4 of its 256 experts, so stage 0's credit is negative in weights and gradients: the stage is
    still charged exactly 3 dense + 1 MoE layers and the embedding."""
    model = load_model("deepseek-v3")
    plan = Plan(tp=1, pp=16, dp=64, mbs=1, num_microbatches=64, zero=1, vocab="balanced",
                layers_per_stage=(4,) * 15 + (1,), ep=64, etp=1)
    est = CostModel(model, H100, JobSpec(global_batch=4096, seq_len=4096)).estimate(plan)
    moe, dense = moe_layer_params(model, 1, 64, 1), dense_layer_params(model, 1)
    assert dense > moe
    embedding = model.vocab_size * model.hidden_size
    assert est.stages[0].memory.weights == 2 * (3 * dense + moe + embedding)


def test_deepep_buffer_is_what_its_intranode_dispatch_asserts() -> None:
    """DeepEP 1.0.0's intranode dispatch asserts its NVLink buffer holds, per channel (megatron-core's 20 SMs, two
    a channel), NVLink rank (at most 8) and received token (256 up to 8 ranks, 288 up to 64), the token's 2-byte
    hidden, its 4-byte source index and top-k int64 indices and fp32 weights. DeepSeek-V3 (hidden 7168, top-8):
    10 x 8 x 256 x 14436 bytes at ep 8; charged once per GPU; none with the alltoall dispatcher."""
    from autotune.costmodel.layer import layer_shape
    from autotune.costmodel.moe import deepep_buffer_bytes

    model = load_model("deepseek-v3")
    job = JobSpec(global_batch=64, seq_len=4096, moe_dispatcher="deepep")
    per_token = 2 * 7168 + 4 + 8 * (8 + 4)
    for ep, recv in ((8, 256), (16, 288), (64, 288)):
        shape = layer_shape(model, job, tp=1, cp=1, mbs=1, sp=False, ep=ep)
        assert deepep_buffer_bytes(model, shape) == 10 * 8 * recv * per_token
    nccl = layer_shape(model, JobSpec(global_batch=64, seq_len=4096), tp=1, cp=1, mbs=1, sp=False, ep=8)
    assert deepep_buffer_bytes(model, nccl) == 0
