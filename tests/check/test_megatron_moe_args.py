"""Megatron's MoE and latent-attention flags read back: --moe-layer-freq against Megatron's own meaning (an int N:
megatron-core's gpt_layer_specs rule i % N == 0; a list: the Python expression Megatron-LM's argparse evaluates),
the latent-attention defaults against the argparse mirror of tests/emit, and every MoE catalog model's emitted
launch script, read back without autotune's header, as the same model and plan."""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from autotune.catalog import load_hardware, load_model
from autotune.check.megatron_args import read_megatron
from autotune.check.megatron_moe_args import MLA_DEFAULTS, layer_pattern, pattern_fields
from autotune.check.understood import read_config, understand
from autotune.costmodel.estimate import CostModel
from autotune.emit import emit
from autotune.errors import SpecError
from autotune.specs.job import JobSpec
from autotune.specs.trainer_jobs import as_run_model
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan
from emit.megatron_validate import parser  # tests/emit: the argparse mirror of Megatron-LM's flags
from emit.test_megatron import _inp

EXPRESSIONS = ("([0]*3+[1]*58)", "([1]*32)", "[0,1,0,1,0,1]", "([0]*1+[1]*4+[0,1]*2)", "[1]*6", " ( [0]*2 + [1]*4 ) ")


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_list_expressions_mean_what_python_evaluates(text: str) -> None:
    expected = eval(text, {"__builtins__": {}})  # noqa: S307 - Megatron-LM's moe_freq_type evaluates it
    assert layer_pattern(text, len(expected)) == expected


@pytest.mark.parametrize("step,layers", [(1, 8), (2, 48), (2, 47), (3, 10), (4, 4)])
def test_an_integer_puts_moe_first_in_each_group_as_megatron_core(step: int, layers: int) -> None:
    # megatron/core/models/gpt/gpt_layer_specs.py: [1 if (i % config.moe_layer_freq == 0) else 0 ...]
    assert layer_pattern(str(step), layers) == [1 if i % step == 0 else 0 for i in range(layers)]


@pytest.mark.parametrize("text,layers,message", [
    ("([0]*3+[1]*57)", 61, "gives 60 layers, --num-layers 61"),
    ("[0]*4", 4, "has no MoE layer"),
    ("list(range(4))", 4, "use an integer or a list expression"),
    ("[2,1]", 2, "use an integer or a list expression"),
    ("([1]*99999999)", 8, "a repeat of 99999999 exceeds --num-layers 8"),
    ("0", 8, "must be >= 1"),
])
def test_bad_patterns_are_one_line_errors(text: str, layers: int, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("*", r"\*").replace("(", r"\(")):
        layer_pattern(text, layers)


def _pattern(first: int, step: int, layers: int) -> list[int]:
    spec = replace(load_model("mixtral-8x7b"), num_layers=layers, first_dense_layers=first, moe_layer_freq=step)
    return [int(spec.is_moe_layer(i)) for i in range(layers)]


@pytest.mark.parametrize("first,step,layers", [(3, 1, 61), (0, 1, 32), (0, 2, 48), (1, 2, 9), (2, 3, 14), (0, 4, 4)])
def test_every_pattern_a_model_has_is_read_exactly(first: int, step: int, layers: int) -> None:
    notes: list[str] = []
    got = pattern_fields(_pattern(first, step, layers), "--moe-layer-freq", notes)
    assert _pattern(got["first_dense_layers"], got["moe_layer_freq"], layers) == _pattern(first, step, layers)
    assert notes == []
    if (first, step, layers) != (0, 4, 4):  # [0,0,0,1] is also 3 dense layers then MoE: the smaller step is read
        assert got == {"first_dense_layers": first, "moe_layer_freq": step}


@pytest.mark.parametrize("step,layers,expected", [(2, 48, (0, 2)), (2, 47, (23, 1)), (3, 10, (6, 1))])
def test_other_patterns_keep_their_moe_count_with_a_note(step: int, layers: int, expected) -> None:
    bits = layer_pattern(str(step), layers)  # Megatron's int: MoE first in each group, which no model spec has
    notes: list[str] = []
    got = pattern_fields(bits, f"--moe-layer-freq {step}", notes)
    assert (got["first_dense_layers"], got["moe_layer_freq"]) == expected
    assert sum(_pattern(*expected, layers)) == sum(bits)  # hand count: ceil(layers / step) MoE layers
    assert sum(bits) == -(-layers // step)
    assert len(notes) == 1 and f"{sum(bits)} MoE layers of {layers}" in notes[0]


def test_latent_attention_defaults_are_megatron_lms() -> None:
    args = parser().parse_args(["--multi-latent-attention"])  # the argparse mirror (tests/emit)
    for flag, default in MLA_DEFAULTS.items():
        assert getattr(args, flag[2:].replace("-", "_")) == default
    assert args.q_lora_rank is None
    base = ("python pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --swiglu "
            "--num-experts 8 --moe-ffn-hidden-size 512 --moe-grouped-gemm --multi-latent-attention")
    found = read_megatron(base).model_fields
    assert found is not None
    assert (found["q_lora_rank"], found["kv_lora_rank"], found["qk_nope_head_dim"], found["qk_rope_head_dim"],
            found["v_head_dim"], found["head_dim"]) == (0, 32, 128, 64, 128, 128 + 64)
    found = read_megatron(base + " --kv-channels 96 --q-lora-rank 256 --kv-lora-rank 128").model_fields
    # megatron-core's MLA builds its heads of qk-head-dim + qk-pos-emb-head-dim and never reads kv_channels
    # (transformer/multi_latent_attention.py q_head_dim): a recipe's --kv-channels changes nothing
    assert found is not None and (found["head_dim"], found["q_lora_rank"], found["kv_lora_rank"]) == (192, 256, 128)


MOE_CASES = {
    "deepseek-v3": Plan(tp=8, pp=8, dp=16, ep=64, etp=1, mbs=1, num_microbatches=256, zero=1, sequence_parallel=True,
                        recompute="full", vocab="balanced", layers_per_stage=(7, 8, 8, 8, 8, 8, 8, 6)),
    "qwen3-30b-a3b": Plan(tp=1, pp=2, dp=8, ep=8, etp=1, mbs=1, num_microbatches=32, zero=1, layers_per_stage=(24, 24)),
    "mixtral-8x7b": Plan(tp=2, pp=1, dp=8, ep=8, etp=1, mbs=1, num_microbatches=16, zero=1, sequence_parallel=True,
                         layers_per_stage=(32,)),
    "gpt-oss-120b": Plan(tp=1, pp=4, dp=16, ep=8, etp=1, mbs=1, num_microbatches=32, zero=1,
                         layers_per_stage=(9, 9, 9, 9)),
    "qwen3-235b-a22b": Plan(tp=4, pp=2, dp=128, ep=16, etp=4, mbs=1, num_microbatches=32, zero=1,
                            sequence_parallel=True, recompute="selective", layers_per_stage=(47, 47)),
}


def _without_header(tmp_path: Path, name: str, plan: Plan, edit=lambda text: text) -> Path:
    """The emitted launch script with autotune's comments removed (so nothing names the model), edited."""
    inp = _inp(name, "h100-sxm", JobSpec(global_batch=plan.dp * plan.mbs * plan.num_microbatches, seq_len=4096), plan)
    text = dict(emit("megatron", inp).files)["launch_megatron.sh"]
    path = tmp_path / "launch_megatron.sh"
    path.write_text(edit("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))))
    return path


def _understood(path: Path, gpus: int, model_arg: str | None = None):
    kind, reading, fmt = read_config(path, None, gpus)
    return understand(path, reading, trainer=kind, fmt=fmt, gpus=gpus, model_arg=model_arg, seq_len_arg=None)


@pytest.mark.parametrize("name", sorted(MOE_CASES))
def test_moe_launch_scripts_read_back_as_their_model(tmp_path: Path, name: str) -> None:
    plan = MOE_CASES[name]
    u = _understood(_without_header(tmp_path, name, plan), plan.num_gpus)
    assert u.model == as_run_model(load_model(name), "megatron", 4096) and u.plan == plan  # no window: GPT-OSS
    assert bool([n for n in u.notes if "sets no attention window" in n]) == bool(load_model(name).sliding_window)
    assert not [n for n in u.notes if "unknown flag" in n], u.notes  # every flag the emitter writes is known
    assert u.job.moe_imbalance == JobSpec(global_batch=1, seq_len=1).moe_imbalance  # learned routing: the default


def test_a_script_without_mtp_checks_the_model_without_it(tmp_path: Path) -> None:
    """--mtp-num-layers is what the script trains, not the model's shape: DeepSeek-V3's flags without it are
    still the catalog deepseek-v3 (even named with --model), checked without the module, so faster."""
    plan = MOE_CASES["deepseek-v3"]
    path = _without_header(tmp_path, "deepseek-v3", plan, lambda t: t.replace(" --mtp-num-layers 1", ""))
    for model_arg in (None, "deepseek-v3"):
        u = _understood(path, plan.num_gpus, model_arg)
        assert u.model == replace(load_model("deepseek-v3"), mtp_layers=0) and u.plan == plan
    with_mtp = _understood(_without_header(tmp_path, "deepseek-v3", plan), plan.num_gpus)
    assert with_mtp.model.mtp_layers == 1
    step = {n: CostModel(u.model, load_hardware("h100-sxm"), u.job).estimate(u.plan).step_time_s
            for n, u in (("without", u), ("with", with_mtp))}
    assert step["without"] < step["with"]


def test_a_latent_attention_model_outside_the_catalog_keeps_its_shape(tmp_path: Path) -> None:
    """DeepSeek-V3's flags with a smaller query rank and one dense layer first: not the catalog's deepseek-v3,
    so checked as the shape the flags give, latent attention and dense-first layer included."""
    def edit(text: str) -> str:
        return (text.replace("--q-lora-rank 1536", "--q-lora-rank 768")
                .replace("'([0]*3+[1]*58)'", "'([0]*1+[1]*60)'")
                .replace("--tokenizer-type HuggingFaceTokenizer", "--tokenizer-type NullTokenizer --vocab-size 129279"))
    path = _without_header(tmp_path, "deepseek-v3", MOE_CASES["deepseek-v3"], edit)
    u = _understood(path, 1024)
    expected = replace(load_model("deepseek-v3"), q_lora_rank=768, first_dense_layers=1)
    differ = [f.name for f in fields(ModelSpec) if getattr(u.model, f.name) != getattr(expected, f.name)]
    assert set(differ) <= {"name", "source", "rope_theta", "norm_eps", "init_std", "rope_scaling",
                           "rope_scaling_factor"}, differ
    assert any("matches no catalog model" in n for n in u.notes)
    with pytest.raises(SpecError, match="q_lora_rank 768 vs 1536"):  # and --model says so
        _understood(path, 1024, "deepseek-v3")


def test_forced_balanced_routing_capacity_and_what_is_costed_otherwise(tmp_path: Path) -> None:
    def edit(text: str) -> str:
        return text.replace("--moe-grouped-gemm", "--moe-router-force-load-balancing --moe-expert-capacity-factor 1.5"
                            " --moe-pad-expert-input-to-capacity --moe-aux-loss-coeff 1e-2 --moe-permute-fusion")
    plan = MOE_CASES["mixtral-8x7b"]
    u = _understood(_without_header(tmp_path, "mixtral-8x7b", plan, edit), plan.num_gpus)
    assert (u.job.moe_imbalance, u.job.moe_capacity_factor, u.job.moe_pad_to_capacity) == (1.0, 1.5, True)
    assert u.job.moe_load == 1.5  # padded: every expert runs its capacity
    notes = " | ".join(u.notes)
    assert "no --moe-grouped-gemm" in notes and "unknown flag" not in notes


def test_two_shared_experts_are_megatrons_one_total_width(tmp_path: Path) -> None:
    """--moe-shared-expert-intermediate-size 4096 is DeepSeek-V3's shared MLP at twice the width or two shared
    experts of 2048 (DeepSeek-V2-Lite style): the same shape; --model of the two-expert spelling is accepted."""
    from autotune.check.understood import shape_diffs

    spec = replace(load_model("deepseek-v3"), num_shared_experts=2)
    found = {"num_shared_experts": 1, "shared_expert_ffn_hidden_size": 4096, "num_layers": 61}
    assert shape_diffs(found, spec, 4096) == []
    assert shape_diffs({**found, "shared_expert_ffn_hidden_size": 2048}, spec, 4096) == [
        "shared-expert width 2048 vs 4096"]


def test_uniform_recompute_of_an_mtp_model_says_the_module_is_costed_stored(tmp_path: Path) -> None:
    """The emitter writes every-layer recompute of an MTP model as block (multi_token_prediction.py recomputes the
    module under uniform only); a hand-written uniform reads back as the same plan, with a note saying so."""
    plan = MOE_CASES["deepseek-v3"]
    emitted = _understood(_without_header(tmp_path, "deepseek-v3", plan), plan.num_gpus)
    assert not [n for n in emitted.notes if "MTP module" in n]

    def uniform(text: str) -> str:
        block = "--recompute-method block\n    --recompute-num-layers 8"
        assert block in text
        return text.replace(block, "--recompute-method uniform\n    --recompute-num-layers 1")
    u = _understood(_without_header(tmp_path, "deepseek-v3", plan, uniform), plan.num_gpus)
    assert u.plan == plan and [n for n in u.notes if "also recomputes the MTP module" in n]


@pytest.mark.parametrize(("old", "new", "message"), [
    ("--num-experts 8", "", "--expert-model-parallel-size 8 without --num-experts: megatron-core refuses"),
    ("--moe-grouped-gemm", "--moe-grouped-gemm --moe-pad-expert-input-to-capacity",
     "--moe-pad-expert-input-to-capacity without --moe-expert-capacity-factor"),
    ("--moe-token-dispatcher-type alltoall", "--moe-token-dispatcher-type foo",
     "--moe-token-dispatcher-type 'foo': use one of allgather, alltoall, flex"),
    ("--moe-grouped-gemm", "--moe-grouped-gemm --moe-router-load-balancing-type bogus",
     "--moe-router-load-balancing-type 'bogus': use one of aux_loss, seq_aux_loss"),
])
def test_moe_flags_megatron_core_refuses_are_refused(tmp_path: Path, old: str, new: str, message: str) -> None:
    """What megatron-core's TransformerConfig raises at start-up (user-tester: each was checked as if it ran)."""
    plan = MOE_CASES["mixtral-8x7b"]
    path = _without_header(tmp_path, "mixtral-8x7b", plan)
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        _understood(path, plan.num_gpus)
    assert "\n" not in str(err.value)


def test_expert_parallel_size_is_read_as_argparse_reads_it() -> None:
    """'+2' and ' 2' are 2 to argparse, so refused without experts; '01' is 1 and '²' is no number (reviewer:
    str.isdigit took '²' and crashed on int)."""
    from autotune.check.megatron_moe_args import _moe_flag_rules

    for value in ("+2", " 2", "2"):
        with pytest.raises(SpecError, match="without --num-experts"):
            _moe_flag_rules({"--expert-model-parallel-size": value})
    for value in ("01", "1", "\u00b2", "${EP}"):
        _moe_flag_rules({"--expert-model-parallel-size": value})
