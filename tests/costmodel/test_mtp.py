"""Multi-token prediction (costmodel/mtp.py): DeepSeek-V3's MTP module, pinned to the published checkpoint size
and to hand sums, folded into the last stage's output block, and left out where the trainer has none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.estimate import CostModel
from autotune.costmodel.memory import embedding_params, head_params, moe_layer_params, total_params
from autotune.costmodel.mtp import mtp_params, mtp_total_params
from autotune.errors import InvalidPlanError, SpecError
from autotune.specs.job import JobSpec
from autotune.specs.model import model_from_dict
from autotune.specs.plan import Plan, check_plan, even_split

DEEPSEEK = load_model("deepseek-v3")
H100 = load_hardware("h100-sxm")
JOB = JobSpec(global_batch=1024, seq_len=4096)
#: Megatron-Bridge's DeepSeek-V3 pretrain layout on 1024 GPUs (recipes/deepseek/deepseek_v3.py, pp 16):
#: E+4 | 4 x 14 | 1 + mtp + loss
BRIDGE = Plan(tp=2, pp=16, dp=32, ep=64, etp=1, mbs=1, num_microbatches=32, zero=1, sequence_parallel=True,
              recompute="selective", vocab="balanced", layers_per_stage=(4,) * 15 + (1,))


def test_deepseek_v3_checkpoint_size() -> None:
    """The model card: the 685B checkpoint holds the 671B main model and a 14B MTP module, which stores its own
    copies of the embedding and the LM head (V x h each)."""
    table = embedding_params(DEEPSEEK)
    module = mtp_total_params(DEEPSEEK) + table + (head_params(DEEPSEEK) - DEEPSEEK.hidden_size)
    assert abs(module / 14e9 - 1) < 0.05
    assert abs((total_params(DEEPSEEK) + module) / 685e9 - 1) < 0.005


def test_module_parameters_by_hand() -> None:
    """enorm, hnorm and the final norm (h each, RMSNorm) and eh_proj (2h x h), beside one MoE layer."""
    h = 7168
    assert mtp_params(DEEPSEEK) == 3 * h + 2 * h * h
    assert mtp_params(DEEPSEEK, tp=2) == 3 * h + h * h
    assert mtp_total_params(DEEPSEEK) == 3 * h + 2 * h * h + moe_layer_params(DEEPSEEK)


def _stages(model, plan=BRIDGE, job=JOB):
    return CostModel(model, H100, job).estimate(plan).stages


def test_only_the_last_stage_pays_for_the_module() -> None:
    with_mtp, without = _stages(DEEPSEEK), _stages(replace(DEEPSEEK, mtp_layers=0))
    for a, b in zip(with_mtp[:-1], without[:-1]):
        assert (a.fwd_s, a.bwd_s, a.params, a.memory) == (b.fwd_s, b.bwd_s, b.params, b.memory)
    last, base = with_mtp[-1], without[-1]
    # one MoE layer beside the stage's one decoder layer, plus eh_proj, a second LM head and loss, and the
    # embedding: more than one layer's time, less than two layers' and two heads'
    cm = CostModel(DEEPSEEK, H100, JOB)
    layer = cm.mtp_layer(2, 1, 1, True, "1d", False, 64, 1)
    extra = (last.fwd_s + last.bwd_s) - (base.fwd_s + base.bwd_s)
    assert layer.fwd.seconds + layer.bwd.seconds < extra
    vocab = cm.vocab(2, 1, 1, True)
    assert extra < 2 * (layer.fwd.seconds + layer.bwd.seconds) + 2 * (vocab.head_time + vocab.embed_time)


def test_module_memory_by_hand() -> None:
    """Weights: the MoE layer (its 256/ep experts), enorm/hnorm/eh_proj/final norm over tp, and a copy of the
    input embedding (the last stage embeds the shifted tokens). The experts' optimizer state is sharded over the
    expert-data-parallel group (dp*tp/(ep*etp) = 1 here), the rest over dp."""
    with_mtp, without = _stages(DEEPSEEK), _stages(replace(DEEPSEEK, mtp_layers=0))
    cm = CostModel(DEEPSEEK, H100, JOB)
    layer = cm.mtp_layer(2, 1, 1, True, "1d", False, 64, 1)
    assert layer.expert_params == 256 // 64 * 3 * 7168 * 2048
    extra = layer.params + mtp_params(DEEPSEEK, 2) + embedding_params(DEEPSEEK, 2)
    assert with_mtp[-1].params - without[-1].params == extra
    assert with_mtp[-1].memory.weights - without[-1].memory.weights == 2 * extra
    assert BRIDGE.expert_dp == 1
    rest = extra - layer.expert_params
    optimizer = 12 * rest / 32 + 12 * layer.expert_params / 1  # fp32 master, m and v: 12 bytes per parameter
    assert with_mtp[-1].memory.optimizer - without[-1].memory.optimizer == pytest.approx(optimizer, abs=2)


def test_a_tied_model_holds_two_tables_on_a_last_stage_with_mtp() -> None:
    """megatron-core's GPTModel builds the embedding on the MTP stage and allocates the output layer's weight on
    every stage but the first (skip_weight_param_allocation = pre_process and tied): a tied model's separate
    last stage holds the tied duplicate and the MTP embedding, one stage alone holds the one table."""
    tied = replace(DEEPSEEK, tied_embeddings=True)
    table = embedding_params(DEEPSEEK, 2)
    cm = CostModel(tied, H100, JOB)
    module = cm.mtp_layer(2, 1, 1, True, "1d", False, 64, 1).params + mtp_params(DEEPSEEK, 2)
    with_mtp, without = _stages(tied), _stages(replace(tied, mtp_layers=0))
    assert with_mtp[-1].params - without[-1].params == module + table
    assert without[-1].params - without[-1].layers * cm.layer(2, 1, 1, True, "1d", False, 64, 1).params \
        >= table  # the tied duplicate
    vocab = cm.vocab(2, 1, 1, True, "1d", False, 64, 1)
    shared = CostModel(replace(tied, mtp_layers=0), H100, JOB).vocab(2, 1, 1, True)
    assert vocab.head_params_shared - shared.head_params_shared == module  # pp 1: the first stage's table only


def test_the_module_unbalances_an_even_split_and_the_planner_moves_layers_off_the_last_stage() -> None:
    """Why Megatron-Bridge's layouts give the last stage one decoder layer: with the MTP module, an even split's
    last stage is the bottleneck; the planner's balanced split takes layers off it and is faster."""
    from autotune.search.planner import search
    from autotune.search.space import SearchSpace
    even = replace(BRIDGE, vocab="ends", layers_per_stage=even_split(61, 16))
    planned = CostModel(DEEPSEEK, H100, JOB).estimate(even)
    assert planned.stages[-1].time_s > max(s.time_s for s in planned.stages[1:-1])
    space = SearchSpace(tp=(2,), pp=(16,), cp=(1,), ep=(64,), etp=(1,), mbs=(1,), schedule=("1f1b",),
                        recompute=("selective",), zero=(1,), vocab=("balanced",))
    best = search(DEEPSEEK, H100, JOB, 1024, space, top_k=0).best
    assert best.plan.layers_per_stage[-1] <= 2 < max(best.plan.layers_per_stage)
    assert best.step_time_s < planned.step_time_s


def test_trainers_without_mtp_leave_it_out() -> None:
    torchtitan = replace(JOB, trainer="torchtitan")
    assert CostModel(DEEPSEEK, H100, torchtitan).mtp_layers == 0
    plan = replace(BRIDGE, tp_overlap=False)
    a = CostModel(DEEPSEEK, H100, torchtitan).estimate(plan)
    b = CostModel(replace(DEEPSEEK, mtp_layers=0), H100, torchtitan).estimate(plan)
    assert a.step_time_s == b.step_time_s and a.peak_memory_bytes == b.peak_memory_bytes


def test_vocabulary_parallelism_cannot_split_the_module() -> None:
    plan = replace(BRIDGE, vocab="parallel", layers_per_stage=even_split(61, 16))
    with pytest.raises(InvalidPlanError, match="multi-token prediction"):
        check_plan(plan, DEEPSEEK, JOB, 1024, 8)


@pytest.mark.parametrize(("changes", "message"), [
    ({"mtp_layers": -1}, "mtp_layers must be a whole number >= 0"),
    ({"mtp_layers": 1.5}, "mtp_layers must be a whole number >= 0"),
    ({"mtp_layers": 17}, "mtp_layers 17 exceeds the maximum of 16"),
    ({"mtp_layers": 1, "causal": False}, "mtp_layers 1 needs a causal language model")])
def test_bad_mtp_fields_name_the_field(changes, message) -> None:
    data = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_heads": 4, "ffn_hidden_size": 512,
            "vocab_size": 1000, "activation": "swiglu", "norm": "rmsnorm", "tied_embeddings": False, **changes}
    with pytest.raises(SpecError, match=message):
        model_from_dict(data, "model.json")


def test_module_flops_by_hand() -> None:
    """Besides its layer, a module's forward is eh_proj (2 x T x 2h x h/tp), enorm and hnorm on the T/tp
    sequence-parallel tokens (5 FLOPs per element each, RMSNorm), the final norm, the LM head (2 x T x h x V/tp)
    and the cross-entropy (5 per logit); its backward doubles every GEMM."""
    from autotune.costmodel.layer import layer_shape
    from autotune.costmodel.mtp import mtp_passes

    shape = layer_shape(DEEPSEEK, JOB, tp=2, cp=1, mbs=1, sp=True)
    t, h, v = 4096, 7168, 129280
    passes = mtp_passes(DEEPSEEK, H100, "bf16", shape)
    gemms = 2 * t * 2 * h * h / 2 + 2 * t * h * v / 2
    norms = 3 * 5 * (t / 2) * h
    assert passes.fwd.flops == pytest.approx(gemms + norms + 5 * t * v / 2)
    assert passes.bwd.flops > 2 * gemms
    assert passes.comm_s > 0 and mtp_passes(DEEPSEEK, H100, "bf16", layer_shape(
        DEEPSEEK, JOB, tp=1, cp=1, mbs=1, sp=False)).comm_s == 0
