"""Plans: the strict reader and every rule of check_plan, each error naming the field and the fix."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest

from autotune.catalog import load_model
from autotune.errors import InvalidPlanError, SpecError
from autotune.specs.job import JobSpec
from autotune.specs.limits import MAX_BUCKET, MAX_GPUS
from autotune.specs.plan import (Plan, check_plan, chunk_layers, default_bucket, even_split, normalized,
                                 plan_from_dict)

MODEL = load_model("llama3-8b")  # 32 layers, 32 heads, 8 KV heads
JOB = JobSpec(global_batch=64, seq_len=4096)
GOOD = Plan(tp=2, pp=4, dp=4, mbs=1, num_microbatches=16, layers_per_stage=(8, 8, 8, 8))


def _check(plan: Plan, gpus: int = 32) -> None:
    check_plan(plan, MODEL, JOB, gpus, 8)


def test_a_good_plan_passes():
    _check(GOOD)
    _check(replace(GOOD, schedule="interleaved", vpp=2, zero=1, sequence_parallel=True, recompute="selective"))


@pytest.mark.parametrize(("change", "gpus", "message"), [
    ({"tp": 3, "dp": 3, "num_microbatches": 21, "mbs": 1}, 36, "tp 3 must divide num_heads 32 and num_kv_heads 8"),
    ({"tp": 16, "dp": 1, "num_microbatches": 64}, 64, "tp 16 must divide"),
    ({"dp": 2, "num_microbatches": 32}, 32, r"tp\*pp\*dp\*cp = 2\*4\*2\*1 = 16 GPUs, but --gpus is 32"),
    ({"num_microbatches": 15}, 32, "global batch 64 != dp 4 x mbs 1 x microbatches 15"),
    ({"mbs": 3}, 32, "global batch 64 != dp 4 x mbs 3"),
    ({"schedule": "interleaved", "vpp": 1}, 32, "interleaved schedule needs pp >= 2 and vpp >= 2"),
    ({"vpp": 2}, 32, "vpp 2 needs schedule 'interleaved'"),
    ({"schedule": "interleaved", "vpp": 2, "num_microbatches": 2, "mbs": 8}, 32,
     r"num_microbatches \(2\) divisible by pp \(4\)"),
    ({"zero": 2}, 32, "zero 2 shards gradients, which autotune does not cost with pipeline"),
    ({"zero": 3}, 32, "zero 3 shards gradients"),
    ({"zero": 4}, 32, "zero must be 0, 1, 2 or 3"),
    ({"layers_per_stage": (8, 8, 8, 7)}, 32, r"must be >= 0 and sum to num_layers 32 \(they sum to 31\)"),
    ({"layers_per_stage": (16, 16)}, 32, "layers_per_stage has 2 entries but pp is 4"),
    ({"layers_per_stage": (6, 10, 8, 8)}, 32, "vocab 'ends' means an even split"),
    ({"tp": 1, "dp": 8, "num_microbatches": 8, "sequence_parallel": True}, 32, "sequence_parallel needs tp > 1"),
    ({"cp": 3, "dp": 1, "num_microbatches": 64}, 24, "cp 3 needs seq_len divisible by 2\\*cp = 6"),
    ({"mbs": 0}, 32, "mbs must be >= 1"),
    ({"recompute_layers": 2}, 32, "recompute_layers applies only to recompute 'full'"),
    ({"recompute": "full", "recompute_layers": 9}, 32, r"recompute_layers must be in 1\.\.8"),
])
def test_each_rule_names_its_field(change, gpus, message):
    with pytest.raises(InvalidPlanError, match=message):
        _check(replace(GOOD, **change), gpus)


def test_v_half_with_odd_stage_counts_says_how_to_fix_it():
    """User-tester: an odd count on a stage was refused without a way out, and DeepSeek-V3's 61 layers can never
    be split into even counts."""
    v_half = replace(GOOD, schedule="v-half", vpp=2, layers_per_stage=(7, 9, 8, 8), vocab="balanced")
    with pytest.raises(InvalidPlanError, match="got \\[7, 9, 8, 8\\]; give --layers-per-stage with even counts"):
        _check(v_half)
    odd = replace(MODEL, num_layers=31)
    with pytest.raises(InvalidPlanError, match="their total is odd, so no split has that: use another schedule"):
        check_plan(replace(v_half, layers_per_stage=(7, 8, 8, 8)), odd, JOB, 32, 8)


def test_interleaved_chunks_may_be_empty():
    """Megatron's --pipeline-model-parallel-layout runs virtual stages without transformer layers (DeepSeek-V3's
    layouts end in a stage of the loss alone; NeMo's reduced-depth Llama 3.1 405B runs 30 layers on pp 4 x vp 8):
    a stage with fewer layers than vpp is a plan that runs, not an error."""
    _check(replace(GOOD, schedule="interleaved", vpp=16))
    assert chunk_layers(8, 16) == (1,) * 8 + (0,) * 8


def test_interleaved_chunks_may_differ_by_a_layer():
    """Megatron runs any layer count per virtual stage (--pipeline-model-parallel-layout); NeMo's Llama 3.1
    405B runs 126 layers on pp 8 x vpp 8, and Meta's on pp 16 with lighter first and last stages."""
    _check(replace(GOOD, schedule="interleaved", vpp=3))
    assert chunk_layers(8, 3) == (3, 3, 2)
    assert chunk_layers(15, 8) == (2, 2, 2, 2, 2, 2, 2, 1)
    assert chunk_layers(16, 4) == (4, 4, 4, 4)


def test_uneven_split_is_fine_with_balanced_vocab():
    _check(replace(GOOD, layers_per_stage=(6, 10, 10, 6), vocab="balanced"))


def test_zero_2_and_3_are_fine_without_pipeline():
    for zero in (2, 3):
        _check(Plan(tp=2, pp=1, dp=16, mbs=1, num_microbatches=4, zero=zero, layers_per_stage=(32,)))


def test_tp_across_nodes_needs_the_flag():
    """tp 8 divides 32 heads and 8 KV heads; on 4-GPU nodes it crosses the node boundary."""
    plan = Plan(tp=8, pp=1, dp=4, mbs=1, num_microbatches=16, layers_per_stage=(32,))
    with pytest.raises(InvalidPlanError, match="tp 8 exceeds the 4 GPUs of a node"):
        check_plan(plan, MODEL, JOB, 32, 4)
    check_plan(plan, MODEL, JOB, 32, 4, allow_cross_node_tp=True)


def test_idle_gpus_only_when_allowed():
    with pytest.raises(InvalidPlanError, match="--gpus is 64"):
        _check(GOOD, 64)
    check_plan(GOOD, MODEL, JOB, 64, 8, allow_idle=True)


@pytest.mark.parametrize(("layers", "pp", "want"), [
    (32, 4, (8, 8, 8, 8)), (30, 4, (7, 8, 8, 7)), (10, 3, (3, 4, 3)), (5, 5, (1, 1, 1, 1, 1)), (7, 1, (7,)),
])
def test_even_split_puts_extra_layers_in_the_middle(layers, pp, want):
    got = even_split(layers, pp)
    assert got == want and sum(got) == layers and max(got) - min(got) <= 1


def test_plan_from_dict_is_strict_and_round_trips():
    assert plan_from_dict(GOOD.to_dict(), "plan.json") == GOOD
    assert plan_from_dict({"plan": GOOD.to_dict(), "step_time_s": 1.0}, "plan.json") == GOOD
    with pytest.raises(SpecError, match=r"plan.json: unknown key\(s\) pipeline"):
        plan_from_dict({**GOOD.to_dict(), "pipeline": 4}, "plan.json")
    data = GOOD.to_dict()
    del data["mbs"], data["layers_per_stage"]
    with pytest.raises(SpecError, match=r"missing key\(s\) layers_per_stage, mbs"):
        plan_from_dict(data, "plan.json")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("tp", 2.0, "tp must be an integer"),
    ("zero", True, "zero must be an integer"),
    ("schedule", "gpipe", "schedule must be one of 1f1b, interleaved"),
    ("recompute", "partial", "recompute must be one of none, selective, full"),
    ("sequence_parallel", 1, "sequence_parallel must be true or false"),
    ("layers_per_stage", [8, 8.5], "layers_per_stage must be a list of integers"),
])
def test_plan_from_dict_value_errors_name_the_field(key, value, message):
    with pytest.raises(InvalidPlanError, match=message):
        plan_from_dict({**GOOD.to_dict(), key: value}, "plan.json")


def test_normalized_drops_a_recompute_layers_that_covers_every_layer():
    plan = replace(GOOD, recompute="full", recompute_layers=8)
    assert normalized(plan).recompute_layers is None
    assert normalized(replace(plan, recompute_layers=3)).recompute_layers == 3


@pytest.mark.parametrize(("group", "gpus_per_node", "ok"), [
    (1, 4, True),   # no dispatch at all
    (2, 8, True), (4, 8, True), (8, 8, True), (4, 4, True), (2, 6, True),
    (3, 6, False), (6, 12, False),  # no intranode kernels for 3, 5, 6 or 7 ranks
    (8, 4, False),  # an 8-GPU intranode group over two 4-GPU nodes
    (4, 6, False),  # consecutive groups of 4 straddle 6-GPU nodes
    (16, 8, True), (24, 8, True), (64, 8, True), (128, 8, True), (160, 8, True), (16, 16, True), (32, 16, True),
    (16, 4, False),  # rank // 8 would call two 4-GPU nodes one
    (40, 8, False), (256, 8, False),  # no dispatch config for these sizes
])
def test_deepep_groups_follow_deepeps_own_limits(group: int, gpus_per_node: int, ok: bool) -> None:
    """deep_ep 1.0.0 (PyPI): csrc/deep_ep.cpp asserts a group below 8 or a multiple of 8 and takes rank % 8 as
    the NVLink rank; Buffer.get_dispatch_config has configs for 16, 24, 32, 64, 128, 144, 160 ranks across
    nodes; its intranode kernels are instantiated for 2, 4 and 8 ranks (SWITCH_RANKS)."""
    from autotune.specs.experts import deepep_group_issue

    assert (deepep_group_issue(group, gpus_per_node) == "") is ok


def test_check_plan_refuses_a_deepep_group_it_cannot_run() -> None:
    model = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch=64, seq_len=4096, moe_dispatcher="deepep")
    plan = Plan(tp=1, pp=1, dp=16, mbs=1, num_microbatches=4, layers_per_stage=(48,), ep=16, zero=1)
    check_plan(plan, model, job, 16, 8)
    with pytest.raises(InvalidPlanError, match="deepep MoE dispatcher: .*nodes of 4 GPUs"):
        check_plan(plan, model, job, 16, 4)
    check_plan(plan, model, replace(job, moe_dispatcher="alltoall"), 16, 4)  # NCCL's all-to-all runs anywhere


def test_a_sequence_past_the_learned_positions_is_refused():
    """gpt3-175b's learned table has 2048 rows: a longer sequence has no position embedding to train with."""
    from autotune.catalog import load_model
    from autotune.specs.plan import positions_issue

    gpt3 = load_model("gpt3-175b")
    assert positions_issue(gpt3, 2048) is None and positions_issue(load_model("llama3-8b"), 10**6) is None  # rope
    assert positions_issue(gpt3, 2049) == ("--seq-len 2049 exceeds the 2048 learned positions of gpt3-175b "
                                           "(max_position_embeddings); use --seq-len <= 2048")


def test_the_default_bucket_is_each_trainers_own():
    """Megatron-Core grows its bucket with the data-parallel group, max(40M, 1M x dp); DeepSpeed's is 5e8
    elements; torchtitan and Colossal-AI set none (costed at 40M). Pinned to the trainers' own sources where
    they are installed (`make trainers`)."""
    assert [default_bucket("megatron", dp) for dp in (1, 40, 41, 512, 4096)] == [
        40_000_000, 40_000_000, 41_000_000, 512_000_000, 4_096_000_000]
    assert default_bucket("deepspeed", 4096) == 500_000_000
    assert default_bucket("torchtitan", 4096) == default_bucket("colossalai", 4096) == 40_000_000
    ddp = pytest.importorskip("megatron.core.distributed.distributed_data_parallel",
                              reason="megatron-core is installed by `make trainers`")
    assert "bucket_size = max(40000000, 1000000 * dp_group.size())" in inspect.getsource(ddp)
    zero = pytest.importorskip("deepspeed.runtime.zero.config", reason="deepspeed is installed by `make trainers`")
    assert zero.DeepSpeedZeroConfig.model_fields["reduce_bucket_size"].default == 500_000_000


def test_megatrons_default_bucket_past_two_billion_is_a_valid_plan():
    """At dp 4096 Megatron's default bucket is 4.1B parameters, past the 2^31 of other integer fields."""
    plan = replace(GOOD, tp=1, pp=1, dp=4096, num_microbatches=1, layers_per_stage=(32,),
                   bucket_size=default_bucket("megatron", 4096))
    check_plan(plan, MODEL, JobSpec(global_batch=4096, seq_len=4096), 4096, 8)
    assert default_bucket("megatron", MAX_GPUS) <= MAX_BUCKET
    with pytest.raises(InvalidPlanError, match="bucket_size 1048576000001 exceeds 1,048,576,000,000 parameters"):
        check_plan(replace(plan, bucket_size=MAX_BUCKET + 1), MODEL, JobSpec(global_batch=4096, seq_len=4096), 4096, 8)
