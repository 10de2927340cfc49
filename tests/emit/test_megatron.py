"""The Megatron-LM emitter: golden files, contract validation against megatron-core 0.16 (tests/emit/
megatron_validate.py) for the golden plans and the plans the planner picks, rejection of broken configs,
the partition forms, warnings and determinism."""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune import __version__
from autotune.catalog import load_hardware, load_model
from autotune.emit import EmitInput, emit
from autotune.emit.megatron import (FORBIDDEN_TOGETHER, FULL_RECOMPUTE_ONLY, GROUPS, MAINLINE_ONLY, emit_megatron,
                                    megatron_argv, node_layout)
from autotune.emit.megatron_partition import layout_string, partition_flags
from autotune.emit.megatron_forks import VOCAB_FORK_FLAGS, fork_flags, mainline_plan
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, check_plan

from .megatron_validate import (FORK_FLAGS, KNOWN_FLAGS, RUN_ENV, MegatronArgsError, Validated, validate_args,
                                validate_launch)
from .scenarios import GOLDEN, PLANNER_CASES, check_golden, planner_scenarios

#: megatron-core warns that Transformer Engine and Apex are missing (expected on CPU) and about deprecations.
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.skipif(shutil.which("bash") is None, reason="the launch scripts need bash")]


def _inp(model: str, gpu: str, job: JobSpec, plan: Plan) -> EmitInput:
    m, hw = load_model(model), load_hardware(gpu)
    check_plan(plan, m, job, plan.num_gpus, hw.gpus_per_node)
    return EmitInput(plan=plan, model=m, job=job, gpu=gpu, gpus_per_node=hw.gpus_per_node, step_time_s=2.5,
                     peak_memory_gib=40.0, mfu=0.4)


#: Megatron-only golden scenarios on top of the shared three: an interleaved layout, and Megatron FSDP with a
#: warning (GeGLU).
EXTRA_GOLDEN = {
    "layout_interleaved": _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=256, seq_len=8192),
                               Plan(tp=1, pp=4, dp=8, mbs=1, num_microbatches=32, schedule="interleaved", vpp=2,
                                    zero=1, vocab="balanced", layers_per_stage=(6, 10, 8, 8))),
    "fsdp_geglu": _inp("gemma2-9b", "h100-sxm", JobSpec(global_batch=32, seq_len=8192),
                       Plan(tp=2, pp=1, dp=4, mbs=1, num_microbatches=8, zero=3, sequence_parallel=True,
                            layers_per_stage=(42,), bucket_size=10_000_000)),
}
ALL_GOLDEN = {**GOLDEN, **EXTRA_GOLDEN}


def expected_chunks(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """Each rank's layers split evenly into its vpp chunks, the first n % vpp one layer larger (the plan's
    definition)."""
    return tuple((n // plan.vpp + 1,) * (n % plan.vpp) + (n // plan.vpp,) * (plan.vpp - n % plan.vpp)
                 for n in plan.layers_per_stage)


def assert_matches_plan(inp: EmitInput, v: Validated, world_size: int) -> None:
    """What Megatron would run is the plan (zb-h1 and v-half as 1F1B over the same layers per rank): degrees,
    batch, partition per model chunk, recompute, ZeRO, shape."""
    p, m, a, c = mainline_plan(inp.plan), inp.model, v.args, v.config
    assert world_size == p.num_gpus
    assert (c.tensor_model_parallel_size, c.pipeline_model_parallel_size, c.context_parallel_size, v.dp) == \
        (p.tp, p.pp, p.cp, p.dp)
    assert (a.micro_batch_size, v.num_microbatches, v.vpp) == (p.mbs, p.num_microbatches, p.vpp)
    assert c.sequence_parallel == p.sequence_parallel
    assert v.chunk_layers == expected_chunks(p)
    assert v.embedding_at == (0, 0) and v.loss_at == (p.pp - 1, p.vpp - 1)
    if p.recompute == "full":
        r = p.recompute_layers
        assert v.recomputed_per_chunk == tuple(tuple(n if r is None else min(n, r) for n in rank)
                                               for rank in v.chunk_layers)
    assert c.recompute_granularity == (None if p.recompute == "none" else p.recompute)
    ddp = v.ddp_config
    assert ddp.use_distributed_optimizer == (p.zero >= 1) and ddp.overlap_grad_reduce
    assert ddp.use_megatron_fsdp == (p.zero >= 2) and ddp.bucket_size == p.bucket_size
    assert ddp.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}.get(p.zero, "no_shard")
    assert ddp.grad_reduce_in_fp32 == (inp.job.grad_reduce == "fp32")
    bf16_states = inp.job.optimizer_states != "fp32"
    assert a.use_precision_aware_optimizer == bf16_states
    assert (a.exp_avg_dtype, a.exp_avg_sq_dtype) == (("bf16", "bf16") if bf16_states else ("fp32", "fp32"))
    if bf16_states:  # megatron-core's use_precision_aware_optimizer_no_fp8_or_ds_fp8: remainders, no grad copy
        assert (a.fp8_recipe in (None, "delayed")) == (inp.job.optimizer_states == "bf16")
    assert (c.num_layers, c.hidden_size, c.num_attention_heads, c.num_query_groups, c.kv_channels,
            c.ffn_hidden_size) == (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
                                   m.ffn_hidden_size)
    assert c.gated_linear_unit == m.gated and c.add_bias_linear == (m.bias == "all")
    assert c.add_qkv_bias == (m.bias == "qkv") and c.normalization == {"rmsnorm": "RMSNorm"}.get(m.norm, "LayerNorm")
    assert a.untie_embeddings_and_output_weights == (not m.tied_embeddings)
    assert a.seq_length == inp.job.seq_len and (a.bf16, a.fp16) == (inp.job.dtype != "fp16", inp.job.dtype == "fp16")
    assert (a.fp8_format is not None) == (inp.job.dtype == "fp8")
    if m.vocab_size % p.tp == 0:
        assert v.padded_vocab == m.vocab_size
    if not getattr(a, "enable_vocab_parallel", False):  # the fork's core 0.9 has no --attention-backend
        assert a.attention_backend == ("fused" if inp.job.flash_attention else "unfused")
    assert a.position_embedding_type == {"rope": "rope", "alibi": "none"}.get(m.position_embedding, "learned_absolute")
    assert a.rotary_percent == (m.rotary_fraction if m.position_embedding == "rope" else 1.0)


def _validate(inp: EmitInput) -> None:
    """The script as emitted (with the vocabulary-parallel fork's flags, checked as the fork would) and, for
    mainline Megatron-LM, with VOCAB_PARALLEL=0."""
    script = dict(emit_megatron(inp).files)["launch_megatron.sh"]
    fork = bool(fork_flags(inp.plan))
    launch, v = validate_launch(script, fork=fork, tokenizer_vocab=inp.model.vocab_size)
    assert launch.argv == tuple(megatron_argv(inp, env=RUN_ENV))
    assert launch.env_cuda_max_connections == (None if inp.plan.zero >= 2 else "1")
    assert_matches_plan(inp, v, launch.world_size)
    if fork:
        launch, v = validate_launch(script, env={"VOCAB_PARALLEL": "0"}, tokenizer_vocab=inp.model.vocab_size)
        assert launch.argv == tuple(megatron_argv(inp, fork=False, env=RUN_ENV))
        assert_matches_plan(inp, v, launch.world_size)


# ---------------------------------------------------------------- golden files and validation


@pytest.mark.parametrize("scenario", sorted(ALL_GOLDEN))
def test_golden(scenario: str) -> None:
    check_golden(emit_megatron(ALL_GOLDEN[scenario]), "megatron", scenario)


@pytest.mark.parametrize("scenario", sorted(ALL_GOLDEN))
def test_golden_plans_validate(scenario: str) -> None:
    _validate(ALL_GOLDEN[scenario])


@pytest.mark.parametrize("name", [case[0] for case in PLANNER_CASES])
def test_planner_plans_validate(name: str) -> None:
    _validate(dict(planner_scenarios())[name])


def test_planner_scenarios_cover_the_features() -> None:
    plans = [inp.plan for _, inp in planner_scenarios()]
    forms = {partition_flags(p)[1] for p in plans}
    assert {"even split", "uneven first/last stage, equal middle stages",
            "explicit layout (virtual stages in order)"} <= forms
    assert any(p.vpp > 1 and partition_flags(p)[1] != "even split" for p in plans)
    assert {0, 1, 3} <= {p.zero for p in plans} and any(p.cp > 1 for p in plans)
    assert any(p.recompute == "selective" for p in plans)
    assert any(p.recompute == "full" and p.recompute_layers for p in plans)


def test_determinism() -> None:
    for inp in ALL_GOLDEN.values():
        first = emit_megatron(inp)
        assert emit_megatron(replace(inp, plan=replace(inp.plan))) == first
        assert [name for name, _ in first.files] == ["launch_megatron.sh", "sbatch_megatron.sh"]


def test_dispatch() -> None:
    pytest.importorskip("autotune.emit.torchtitan")  # emit() imports every emitter
    pytest.importorskip("autotune.emit.deepspeed")
    assert emit("megatron", GOLDEN["even"]) == emit_megatron(GOLDEN["even"])


# ---------------------------------------------------------------- the script's shape


def _arrays(script: str) -> dict[str, list[str]]:
    return {name: body.strip("\n").split("\n") for name, body in re.findall(r"^([A-Z_]+)=\(\n(.*?)\n\)$", script,
                                                                              re.S | re.M)}


@pytest.mark.parametrize("scenario", sorted(ALL_GOLDEN))
def test_one_flag_per_line_sorted_groups_no_forbidden_pairs(scenario: str) -> None:
    inp = ALL_GOLDEN[scenario]
    script = dict(emit_megatron(inp).files)["launch_megatron.sh"]
    arrays = _arrays(script)
    assert list(arrays) == [g for g in (*GROUPS, "MAINLINE_ARGS") if g in arrays]
    for lines in arrays.values():
        flags = [line.split()[0] for line in lines]
        assert all(line.startswith("    --") and line.count(" --") == 1 for line in lines)
        assert flags == sorted(flags)
    names = set(megatron_argv(inp, fork=False)) & KNOWN_FLAGS
    assert names == {a for a in megatron_argv(inp, fork=False) if a.startswith("--")}, "a flag mainline lacks"
    assert {a for a in megatron_argv(inp) if a.startswith("--")} - names <= FORK_FLAGS
    for a, b, _ in FORBIDDEN_TOGETHER:
        assert not {a, b} <= names
    if inp.plan.recompute != "full":
        assert not names & set(FULL_RECOMPUTE_ONLY)


def test_launch_script_refuses_the_wrong_node_count() -> None:
    script = dict(emit_megatron(GOLDEN["even"]).files)["launch_megatron.sh"]  # 16 GPUs = 2 nodes
    with pytest.raises(MegatronArgsError, match="set NNODES=2"):
        validate_launch(script, env={"NNODES": "1"})


@pytest.mark.parametrize("scenario", sorted(ALL_GOLDEN))
def test_sbatch_script(scenario: str) -> None:
    inp = ALL_GOLDEN[scenario]
    script = dict(emit_megatron(inp).files)["sbatch_megatron.sh"]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    nodes, per_node = node_layout(inp.plan.num_gpus, inp.gpus_per_node)
    directives = re.findall(r"^#SBATCH (\S+) (\S+)$", script, re.M)
    assert dict(directives) == {"--job-name": "autotune-megatron", "--nodes": str(nodes), "--ntasks-per-node": "1",
                                "--gpus-per-node": str(per_node)}
    assert script.index("#SBATCH") < script.index("\nset ")  # directives before the first command
    assert 'NODE_RANK="$SLURM_NODEID"' in script and "scontrol show hostnames" in script


def test_node_layout() -> None:
    assert node_layout(4, 8) == (1, 4) and node_layout(8, 8) == (1, 8) and node_layout(32, 8) == (4, 8)
    assert node_layout(12, 8) == (2, 6)


# ---------------------------------------------------------------- partitions


def _plan(layers: tuple[int, ...], vpp: int = 1) -> Plan:
    return Plan(tp=1, pp=len(layers), dp=1, mbs=1, num_microbatches=2 * len(layers), vpp=vpp,
                schedule="interleaved" if vpp > 1 else "1f1b", vocab="balanced", layers_per_stage=layers)


@pytest.mark.parametrize(("layers", "vpp", "flags"), [
    ((16, 16), 1, []),
    ((8, 8, 8, 8), 2, ["--num-virtual-stages-per-pipeline-rank 2"]),
    ((7, 9, 9, 7), 1, ["--decoder-first-pipeline-num-layers 7", "--decoder-last-pipeline-num-layers 7"]),
    ((6, 9, 9, 8), 1, ["--decoder-first-pipeline-num-layers 6", "--decoder-last-pipeline-num-layers 8"]),
    ((9, 9, 9, 5), 1, ["--decoder-last-pipeline-num-layers 5"]),
    ((15, 17), 1, ["--decoder-first-pipeline-num-layers 15", "--decoder-last-pipeline-num-layers 17"]),
    ((6, 10, 10, 6), 2, ["--decoder-first-pipeline-num-layers 6", "--decoder-last-pipeline-num-layers 6",
                         "--num-virtual-stages-per-pipeline-rank 2"]),
    ((7, 9, 8, 8), 1, ["--pipeline-model-parallel-layout Et*7|t*9|t*8|t*8L"]),
    ((0, 16, 16, 0), 1, ["--pipeline-model-parallel-layout E|t*16|t*16|L"]),
    ((0, 32), 1, ["--pipeline-model-parallel-layout E|t*32L"]),
    ((4, 0, 0, 28), 1, ["--pipeline-model-parallel-layout Et*4|||t*28L"]),
    ((6, 10, 8, 8), 2, ["--pipeline-model-parallel-layout Et*3|t*5|t*4|t*4|t*3|t*5|t*4|t*4L"]),
    ((2, 14, 14, 2), 2, ["--decoder-first-pipeline-num-layers 2", "--decoder-last-pipeline-num-layers 2",
                         "--num-virtual-stages-per-pipeline-rank 2"]),
    ((0, 16, 16), 2, ["--pipeline-model-parallel-layout E|t*8|t*8||t*8|t*8L"]),
])
def test_partition_forms(layers: tuple[int, ...], vpp: int, flags: list[str]) -> None:
    plan = _plan(layers, vpp)
    assert [f"{f} {v}" for f, v in partition_flags(plan)[0]] == flags
    model = replace(load_model("llama3-8b"), num_layers=sum(layers))
    inp = EmitInput(plan=plan, model=model, job=JobSpec(global_batch=plan.num_microbatches, seq_len=4096),
                    gpu="h100-sxm", gpus_per_node=8, step_time_s=1.0, peak_memory_gib=1.0, mfu=0.5)
    _validate(inp)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_partition_validates_and_is_kept(data) -> None:
    """Random partitions (empty stages included): the flags pass megatron-core and build exactly the plan's
    layers on every (rank, virtual stage)."""
    pp = data.draw(st.integers(2, 5), label="pp")
    vpp = data.draw(st.integers(1, 3), label="vpp")
    layers = tuple(vpp * data.draw(st.integers(0, 5), label=f"chunk layers {i}") for i in range(pp))
    if sum(layers) == 0:
        layers = (vpp,) + layers[1:]
    plan = _plan(layers, vpp)
    model = replace(load_model("llama3-8b"), num_layers=sum(layers))
    inp = EmitInput(plan=plan, model=model, job=JobSpec(global_batch=plan.num_microbatches, seq_len=4096),
                    gpu="h100-sxm", gpus_per_node=8, step_time_s=1.0, peak_memory_gib=1.0, mfu=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = validate_args(megatron_argv(inp), plan.num_gpus)
    assert v.chunk_layers == expected_chunks(plan) and v.vpp == vpp
    assert v.embedding_at == (0, 0) and v.loss_at == (pp - 1, vpp - 1)


def test_layout_is_in_virtual_order() -> None:
    assert layout_string(_plan((2, 4, 6), 2)) == "Et|t*2|t*3|t|t*2|t*3L"


# ---------------------------------------------------------------- broken configs are rejected

_UNEVEN = GOLDEN["uneven_vocab"]  # 32 GPUs, tp 2, pp 4, layers 7,9,9,7, full block recompute, ZeRO-1
_EVEN = GOLDEN["even"]  # 16 GPUs, tp 2, pp 2, 16+16, selective, ZeRO-1
_INTERLEAVED = GOLDEN["interleaved"]  # 8 GPUs, tp 2, pp 4, vpp 2, gbs 16, mbs 2


def _argv(inp: EmitInput, drop: tuple[str, ...] = (), add: tuple[str, ...] = (), **set_: str) -> list[str]:
    """The emitted arguments with flags dropped (with their values), values replaced, and flags added."""
    out, skip = [], False
    argv = megatron_argv(inp)
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        key = arg.lstrip("-").replace("-", "_")
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if arg in drop:
            skip = has_value
        elif key in set_:
            out += [arg, set_[key]]
            skip = True
        else:
            out.append(arg)
    return out + list(add)


_FIRST_LAST = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
BROKEN = {
    "layout with the wrong layer count": (_UNEVEN, _argv(_UNEVEN, drop=_FIRST_LAST, add=(
        "--pipeline-model-parallel-layout", "Et*7|t*9|t*9|t*6L")), 32, "must match num_layers"),
    "layout stages not a multiple of pp": (_UNEVEN, _argv(_UNEVEN, drop=_FIRST_LAST, add=(
        "--pipeline-model-parallel-layout", "Et*7|t*9|t*9|t*5|t*2L")), 32, "not divisible by pp"),
    "layout with first/last": (_UNEVEN, _argv(_UNEVEN, add=(
        "--pipeline-model-parallel-layout", "Et*7|t*9|t*9|t*7L")), 32, "cannot be set"),
    "first/last with account-for flags": (_UNEVEN, _argv(_UNEVEN, add=(
        "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")), 32,
        "set at the same time with account_for"),
    "full recompute without method": (_UNEVEN, _argv(_UNEVEN, drop=("--recompute-method",)), 32,
                                      "recompute_method must be"),
    "full recompute without layer count": (_UNEVEN, _argv(_UNEVEN, drop=("--recompute-num-layers",)), 32,
                                           "recompute_num_layers must be"),
    "selective with a method": (_EVEN, _argv(_EVEN, add=("--recompute-method", "uniform")), 16,
                                "selective recompute takes no"),
    "mbs times dp not dividing gbs": (_UNEVEN, _argv(_UNEVEN, micro_batch_size="3"), 32, "not divisible by micro"),
    "pp not dividing layers, no uneven flags": (_EVEN, _argv(_EVEN, num_layers="33"), 16,
                                                "divisible by the pipeline"),
    "VPP by layers with decoder-first": (_UNEVEN, _argv(_UNEVEN, add=(
        "--num-layers-per-virtual-pipeline-stage", "1")), 32, "with decoder-first/last"),
    "two VPP specifications": (_INTERLEAVED, _argv(_INTERLEAVED, add=(
        "--num-layers-per-virtual-pipeline-stage", "3")), 8, "at most one"),
    "zero 2 with pp > 1": (_UNEVEN, _argv(_UNEVEN, add=(
        "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads", "--no-gradient-accumulation-fusion",
        "--ckpt-format", "fsdp_dtensor")), 32, "with pp 4 > 1"),
    "param gather without distributed optimizer": (_UNEVEN, _argv(_UNEVEN, drop=("--use-distributed-optimizer",)),
                                                   32, "overlap-param-gather needs"),
    "first stage not divisible by vpp": (_INTERLEAVED, _argv(_INTERLEAVED, add=(
        "--decoder-first-pipeline-num-layers", "3")), 8, "divisible by virtual"),
    "middle layers without middle stages": (_EVEN, _argv(_EVEN, add=(
        "--decoder-first-pipeline-num-layers", "8", "--decoder-last-pipeline-num-layers", "6")), 16,
        "middle PP stages"),
    "empty first stage via first/last": (_UNEVEN, _argv(_UNEVEN, decoder_first_pipeline_num_layers="0"), 32,
                                         "larger than 0"),
    "unknown flag": (_UNEVEN, _argv(_UNEVEN, add=("--pipeline-parallel-size", "4")), 32, "unrecognized"),
    "bad choice": (_UNEVEN, _argv(_UNEVEN, recompute_method="everything"), 32, "invalid choice"),
    "world size not divisible": (_UNEVEN, _argv(_UNEVEN), 30, "not divisible by tp"),
    "cp with an odd sequence split": (_EVEN, _argv(_EVEN, seq_length="8190", add=("--context-parallel-size", "2")),
                                      32, "seq_length"),
    "interleaved with a short last micro-batch group": (_INTERLEAVED, _argv(_INTERLEAVED, global_batch_size="12"),
                                                        8, "smaller than pp"),
    "fp16 with bf16": (_EVEN, _argv(_EVEN, add=("--fp16",)), 16, "--fp16 and --bf16"),
    "query groups not dividing heads": (_UNEVEN, _argv(_UNEVEN, num_query_groups="3"), 32, "TransformerConfig"),
    "learned positions shorter than the sequence": (_INTERLEAVED, _argv(_INTERLEAVED, max_position_embeddings="1024"),
                                                     8, "max-position-embeddings"),
    "sequence parallel with tp 1 is dropped, not kept": None,
}


@pytest.mark.parametrize("name", [k for k, v in BROKEN.items() if v is not None])
def test_broken_configs_are_rejected(name: str) -> None:
    inp, argv, world, message = BROKEN[name]
    validate_args(megatron_argv(inp), inp.plan.num_gpus)  # the unbroken original passes
    with pytest.raises(MegatronArgsError, match=re.escape(message)):
        validate_args(argv, world)


def test_sequence_parallel_with_tp_1_is_silently_off() -> None:
    v = validate_args(_argv(_EVEN, tensor_model_parallel_size="1"), 8)
    assert v.config.sequence_parallel is False


# ---------------------------------------------------------------- warnings and fallbacks


def _warnings(inp: EmitInput) -> tuple[str, ...]:
    return emit_megatron(inp).warnings


def test_warnings_for_what_megatron_cannot_express() -> None:
    gemma = EXTRA_GOLDEN["fsdp_geglu"]
    assert any(w.startswith("geglu:") for w in _warnings(gemma))
    # Gemma 2's logit soft caps: megatron-core 0.16 has no option for them, so the script drops them, and says so
    assert ("gemma2-9b: its logit soft-capping (attention scores 50, final logits 30) is not in the megatron config "
            "(megatron-core 0.16 has no soft-cap option") in "\n".join(_warnings(gemma))
    assert _warnings(GOLDEN["even"]) == ()
    bert = _inp("bert-large", "v100-32gb", JobSpec(global_batch=8, seq_len=512),
                Plan(tp=1, pp=1, dp=8, mbs=1, num_microbatches=1, layers_per_stage=(24,)))
    assert any("not causal" in w for w in _warnings(bert))
    # ZeRO-3 with pp > 1 (the plan rules forbid it): emitted as ZeRO-1, with a warning, and still valid
    zero3_pp = replace(GOLDEN["uneven_vocab"], plan=replace(GOLDEN["uneven_vocab"].plan, zero=3))
    assert any(w.startswith("zero 3 with pp 4") for w in _warnings(zero3_pp))
    assert "--use-megatron-fsdp" not in megatron_argv(zero3_pp)
    validate_args(megatron_argv(zero3_pp), 32)
    # 12 GPUs on 8-GPU nodes: 2 nodes of 6
    twelve = _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=12, seq_len=4096),
                  Plan(tp=2, pp=2, dp=3, mbs=1, num_microbatches=4, layers_per_stage=(16, 16)))
    assert any("2 nodes" in w for w in _warnings(twelve))
    _validate(twelve)
    # flash attention off with cp > 1: the fused kernel, with a warning
    cp = _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=8, seq_len=8192, flash_attention=False),
              Plan(tp=2, pp=1, cp=2, dp=2, mbs=1, num_microbatches=4, layers_per_stage=(32,)))
    assert any("--attention-backend fused" in w for w in _warnings(cp))
    assert validate_args(megatron_argv(cp), 8).args.attention_backend == "fused"


def test_block_and_position_encoding_a_megatron_config_can_and_cannot_express() -> None:
    """RoPE on part of each head is --rotary-percent (Megatron-LM's flag, GPTModel's rotary_percent); megatron-core
    0.16 has neither a parallel attention/MLP block nor ALiBi, so those configs train a sequential block and no
    position encoding (--position-embedding-type none, the cost predicted), each with a warning; the launch
    validates either way."""
    base = GOLDEN["even"]
    neox = replace(base, model=replace(base.model, rotary_fraction=0.25, parallel_block=True, name="neox-like"))
    alibi = replace(base, model=replace(base.model, position_embedding="alibi", name="bloom-like"))
    argv = megatron_argv(neox)
    assert argv[argv.index("--rotary-percent") + 1] == "0.25"
    assert [w for w in _warnings(neox) if w.startswith("parallel block:")] and not [
        w for w in _warnings(neox) if "ALiBi" in w]
    argv = megatron_argv(alibi)
    assert argv[argv.index("--position-embedding-type") + 1] == "none"
    assert "--rotary-percent" not in argv and "--rotary-base" not in argv
    assert any(w.startswith("ALiBi: megatron-core 0.16 has no ALiBi") for w in _warnings(alibi))
    assert "--rotary-percent" not in megatron_argv(base)
    _validate(neox)
    _validate(alibi)


def test_unfused_kernels_and_fp8() -> None:
    inp = _inp("gpt-1.7b", "h100-sxm", JobSpec(global_batch=8, seq_len=2048, dtype="fp8", flash_attention=False,
                                                fused_kernels=False),
               Plan(tp=2, pp=1, dp=4, mbs=1, num_microbatches=2, layers_per_stage=(24,)))
    argv = megatron_argv(inp)
    assert {"--no-masked-softmax-fusion", "--no-bias-dropout-fusion", "--no-bias-gelu-fusion"} <= set(argv)
    assert argv[argv.index("--fp8-format") + 1] == "hybrid" and "--bf16" in argv
    _validate(inp)


@pytest.mark.parametrize("grad_reduce", ["fp32", "bf16"])
@pytest.mark.parametrize("states", ["fp32", "bf16", "bf16-moments"])
def test_gradient_and_optimizer_state_precision(grad_reduce: str, states: str) -> None:
    """The job's gradient-buffer and Adam-state dtypes are what the config runs: --grad-reduce-in-bf16, and the
    precision-aware optimizer with bf16 moments (bf16 main gradients beside bf16 buffers, as DeepSeek-V3's recipe)."""
    inp = _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=64, seq_len=4096, grad_reduce=grad_reduce,
                                                 optimizer_states=states),
               Plan(tp=2, pp=2, dp=2, mbs=1, num_microbatches=32, zero=1, sequence_parallel=True,
                    layers_per_stage=(16, 16)))
    argv = megatron_argv(inp)
    assert ("--grad-reduce-in-bf16" in argv) == (grad_reduce == "bf16")
    assert ("--main-grads-dtype" in argv) == (states == grad_reduce == "bf16")
    assert ("--fp8-recipe" in argv) == (states == "bf16-moments")
    _validate(inp)


@pytest.mark.parametrize("drop, add, why", [
    (("--use-distributed-optimizer", "--overlap-param-gather"), (), "only supported with distributed optimizer"),
    (("--use-precision-aware-optimizer",), (), "can only be fp32 when not using precision-aware optimizer"),
])
def test_precision_aware_optimizer_rules_are_megatron_cores(drop, add, why) -> None:
    inp = _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=64, seq_len=4096, optimizer_states="bf16"),
               Plan(tp=2, pp=2, dp=2, mbs=1, num_microbatches=32, zero=1, sequence_parallel=True,
                    layers_per_stage=(16, 16)))
    with pytest.raises(MegatronArgsError, match=why):
        validate_args(_argv(inp, drop=drop, add=add), 8)


def test_targets_megatron_core_0_16() -> None:
    """The validator checks against the megatron-core the header names; another version needs a new look at
    TRAINERS.md section 1 before the target string changes."""
    from importlib.metadata import version

    from autotune.emit.megatron import TARGET

    assert version("megatron-core").startswith("0.16.") and "megatron-core 0.16" in TARGET
    for name, content in emit_megatron(GOLDEN["even"]).files:
        assert f"# generated by autotune {__version__} for megatron ({TARGET})" in content.splitlines()[:10], name


# ---------------------------------------------------------------- what mainline Megatron-LM lacks

_VP, _VH = GOLDEN["vocab_parallel"], GOLDEN["v_half"]


def _plan_with(inp: EmitInput, **changes) -> EmitInput:
    return replace(inp, plan=replace(inp.plan, **changes))


def test_vocab_parallel_flags_sit_in_a_fork_block() -> None:
    script = dict(emit_megatron(_VP).files)["launch_megatron.sh"]
    block = script[script.index("# ---- vocabulary parallelism"):script.index("torchrun ")]
    assert "sail-sg/VocabularyParallelism" in block and "HEAD 6191c3b" in block and "VOCAB_PARALLEL=0" in block
    assert 'VOCAB_PARALLEL="${VOCAB_PARALLEL:-1}"' in block and "FORK_ARGS+=(--enable-vocab-parallel)" in block
    assert script.count("--enable-vocab-parallel") == block.count("--enable-vocab-parallel")
    assert [f for f, _ in fork_flags(_VP.plan)] == list(VOCAB_FORK_FLAGS)
    argv = megatron_argv(_VP)
    assert argv[-1] == "--enable-vocab-parallel" and "--untie-embeddings-and-output-weights" in argv
    assert int(argv[argv.index("--make-vocab-size-divisible-by") + 1]) % (_VP.plan.tp * _VP.plan.pp) == 0
    v = validate_args(argv, 16, fork=True, tokenizer_vocab=_VP.model.vocab_size)
    assert v.args.enable_vocab_parallel and v.padded_vocab == _VP.model.vocab_size
    assert not set(argv) & set(MAINLINE_ONLY), "the fork's core 0.9 arguments.py lacks these"
    assert set(MAINLINE_ONLY) & set(megatron_argv(_VP, fork=False))
    assert fork_flags(GOLDEN["even"].plan) == [] and "FORK_ARGS" not in dict(emit_megatron(GOLDEN["even"]).files)[
        "launch_megatron.sh"]


def test_mainline_megatron_rejects_the_fork_flags() -> None:
    script = dict(emit_megatron(_VP).files)["launch_megatron.sh"]
    with pytest.raises(MegatronArgsError, match="unrecognized arguments: --enable-vocab-parallel"):
        validate_launch(script)
    launch, _ = validate_launch(script, env={"VOCAB_PARALLEL": "0"})  # the documented way to run on mainline
    assert "--enable-vocab-parallel" not in launch.argv


_FORK_BROKEN = {
    "vocab parallel with pp 1": (("--pipeline-model-parallel-size", "1"), 16, "needs pipeline-model-parallel-size"),
    "vocab parallel with VPP": (("--num-virtual-stages-per-pipeline-rank", "2"), 16, "virtual pipeline stages"),
    "vocab divisor not a multiple of tp*pp": (("--make-vocab-size-divisible-by", "4"), 16, "multiple of tp*pp = 8"),
    "layer redistribution without a count": (("--enable-layer-redistribution",), 16, "--final-stage-num-layers"),
}


@pytest.mark.parametrize("name", list(_FORK_BROKEN))
def test_fork_rules_are_replayed(name: str) -> None:
    add, world, message = _FORK_BROKEN[name]
    argv = megatron_argv(_VP) + list(add)  # argparse: a later value wins
    if name == "vocab parallel with pp 1":
        argv += ["--tensor-model-parallel-size", "2"]
        world = 4
    with pytest.raises(MegatronArgsError, match=re.escape(message)):
        validate_args(argv, world, fork=True)


def test_untied_embeddings_are_required_by_the_fork() -> None:
    argv = [a for a in megatron_argv(_VP) if a != "--untie-embeddings-and-output-weights"]
    with pytest.raises(MegatronArgsError, match="requires --untie-embeddings-and-output-weights"):
        validate_args(argv, 16, fork=True)


def test_vocab_divisor_multiple_of_tp_pp_pads_when_it_must() -> None:
    """A vocabulary that tp*pp does not divide: the fork's divisor forces Megatron to pad, with a warning."""
    inp = replace(_VP, model=replace(_VP.model, vocab_size=50260))  # 50260 = 4 * 12565
    argv = megatron_argv(inp)
    divisor = int(argv[argv.index("--make-vocab-size-divisible-by") + 1])
    assert divisor % 8 == 0
    assert any(w.startswith("vocab parallel: sail-sg/VocabularyParallelism needs --make-vocab-size-divisible-by")
               for w in emit_megatron(inp).warnings)
    assert validate_args(argv, 16, fork=True, tokenizer_vocab=50260).padded_vocab % (divisor * 2) == 0


@pytest.mark.parametrize("schedule", ["zb-h1", "v-half"])
def test_zero_bubble_schedules_run_as_1f1b(schedule: str) -> None:
    inp = _VH if schedule == "v-half" else _plan_with(_VH, schedule="zb-h1", vpp=1)
    argv = megatron_argv(inp)
    assert not {a for a in argv if "virtual" in a or "zero-bubble" in a}, "no VPP and no invented flags"
    assert ["--decoder-first-pipeline-num-layers", "6"] == argv[argv.index("--decoder-first-pipeline-num-layers"):][:2]
    v = validate_args(argv, 8)
    assert v.vpp == 1 and v.chunk_layers == ((6,), (8,), (8,), (10,))
    (warning,) = emit_megatron(inp).warnings
    assert warning.startswith(f"schedule {schedule}: mainline Megatron-LM has no ")
    assert "sail-sg/zero-bubble-pipeline-parallelism" in warning and "none are emitted" in warning
    assert "emitted 1F1B with the same layers per rank (6,8,8,10)" in warning
    script = dict(emit_megatron(inp).files)["launch_megatron.sh"]
    assert f"# schedule: the plan's {schedule} runs as 1F1B here" in script


def test_v_half_with_vocab_parallel() -> None:
    inp = _plan_with(_VP, schedule="v-half", vpp=2)
    warnings = emit_megatron(inp).warnings
    assert [w.split(":")[0] for w in warnings] == ["schedule v-half", "vocab parallel", "vocab parallel with v-half"]
    assert "branch v-half-vocab" in warnings[2]
    _validate(inp)


@pytest.mark.parametrize("steps", [1, 2, 19, 25])
def test_short_runs_pass_megatrons_scheduler(steps: int) -> None:
    """--train-tokens of a few steps: warm-up stays below the decay steps, which Megatron's
    OptimizerParamScheduler asserts (a one-step run failed at start-up with warm-up 1 = decay 1)."""
    inp = ALL_GOLDEN["even"]
    inp = replace(inp, train_tokens=steps * inp.job.global_batch * inp.job.seq_len)
    _validate(inp)
    script = dict(emit_megatron(inp).files)["launch_megatron.sh"]
    assert f"--train-iters {steps}" in script and f"--lr-warmup-iters {min(max(1, steps // 10), steps - 1)}" in script


@pytest.mark.parametrize(("kernel", "flags"), [
    (None, ["--cross-entropy-loss-fusion"]),
    ("te", ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]), ("unfused", [])])
def test_the_loss_kernel_costed_is_the_one_written(kernel, flags) -> None:
    """The script turns on the loss fusion the job was costed with (the native one unless it says otherwise), and
    megatron-core's TransformerConfig takes it."""
    inp = _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=16, seq_len=4096, cross_entropy=kernel),
               Plan(tp=1, pp=1, dp=8, mbs=1, num_microbatches=2, zero=1, layers_per_stage=(32,)))
    argv = megatron_argv(inp)
    written = [a for i, a in enumerate(argv) if a.startswith("--cross-entropy")
               or (i and argv[i - 1] == "--cross-entropy-fusion-impl")]
    assert sorted(written) == sorted(flags)
    v = validate_args(argv, 8)
    assert v.config.cross_entropy_loss_fusion == bool(flags)
    assert v.config.cross_entropy_fusion_impl == (kernel if kernel == "te" else "native")
