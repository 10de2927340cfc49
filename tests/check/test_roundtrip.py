"""Round trip: every golden plan and planner scenario of tests/emit, emitted for each trainer, read back by
`check`, gives the plan the trainer runs and the same estimate JSON, byte for byte.

The plan the trainer runs is the planned one wherever its emitter writes no approximation. Where the emitter
warns that it wrote the closest config instead (e.g. V-Half as 1F1B on mainline Megatron-LM, ZeRO-1 as FSDP2
under torchtitan, selective recompute as whole-layer checkpointing under DeepSpeed), `as_run` below states the
config's own meaning, rule by rule, from the emitters' documented mappings; the fixed-point test then checks
independently that re-emitting the recovered plan reproduces the same trainer settings.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.catalog import load_hardware
from autotune.check.understood import read_config, understand
from autotune.costmodel.estimate import CostModel
from autotune.emit import EmitInput, emit
from autotune.emit.torchtitan_mapping import MOE_REGISTRY, REGISTRY
from autotune.errors import SpecError
from autotune.render.common import dump_json
from autotune.render.estimate import estimate_json
from autotune.search.trainers import reestimator
from autotune.specs.trainer_jobs import as_run_model
from autotune.specs.job import JobSpec
from autotune.specs.plan import DEFAULT_BUCKET, Plan, check_plan, is_even_split
from autotune.units import gib
from emit.scenarios import GOLDEN, planner_scenarios  # tests/emit (pytest puts tests/ on the path)

TRAINERS = (("megatron", None, "launch_megatron.sh"), ("torchtitan", "toml", "torchtitan.toml"),
            ("torchtitan", "cli", "launch_torchtitan.sh"), ("torchtitan", "cli", "torchtitan_overrides.txt"),
            ("deepspeed", None, "ds_config.json"))


def _vocab(plan: Plan) -> str:
    return "ends" if is_even_split(plan.layers_per_stage) else "balanced"


def as_run(plan: Plan, trainer: str, fmt: str | None, inp: EmitInput) -> Plan:
    """The plan the emitted config runs (the emitters' documented approximations, see the module docstring)."""
    p = plan
    if p.recompute == "full" and p.recompute_layers is not None and p.recompute_layers >= max(p.layers_per_stage):
        p = replace(p, recompute_layers=None)
    if trainer == "megatron":
        if p.schedule in ("zb-h1", "v-half"):  # megatron_forks.mainline_plan
            p = replace(p, schedule="1f1b", vpp=1)
        return p
    if p.vocab == "parallel":
        p = replace(p, vocab=_vocab(p))
    if trainer == "deepspeed":
        p = replace(p, schedule="1f1b", vpp=1, tp_overlap=False)
        if p.recompute != "none":
            p = replace(p, recompute="full", recompute_layers=None)
        return p
    # torchtitan
    if p.schedule == "zb-h1":
        p = replace(p, schedule="1f1b")
    ddp_ok = fmt == "cli" or p.cp > 1 or p.tp * p.pp == 1
    if p.dp == 1:
        p = replace(p, zero=0)
    elif p.zero in (1, 2) or (p.zero == 0 and not ddp_ok):  # FSDP2 without resharding: ZeRO-2-like
        p = replace(p, zero=2 if p.pp == 1 else 1)
    p = replace(p, bucket_size=DEFAULT_BUCKET)
    if fmt == "toml" and p.tp > 1:
        p = replace(p, sequence_parallel=True)
    if not inp.job.fused_kernels:
        p = replace(p, tp_overlap=False)
    if p.recompute == "full" and p.recompute_layers is not None:
        chunks = [n // p.vpp for n in p.layers_per_stage if n]
        every = max(1, min(n // min(p.recompute_layers, n) for n in chunks)) if fmt == "toml" else 1
        p = replace(p, recompute_layers=max(1, min(chunks) // every) if every > 1 else None)
        if p.recompute_layers is not None and p.recompute_layers >= max(p.layers_per_stage):
            p = replace(p, recompute_layers=None)
    return p


def as_run_job(inp: EmitInput, trainer: str, fmt: str | None):
    job = replace(inp.job, trainer=trainer)
    # Megatron's precision-aware optimizer keeps bf16 Adam states; torchtitan 0.3.0's fused_opt_states_bf16 keeps
    # bf16 moments beside fp32 parameters (the 0.2.x TOML has no such optimizer)
    tt_moments = trainer == "torchtitan" and fmt != "toml" and inp.job.optimizer_states == "bf16-moments"
    # DeepSpeed's bf16_master_weights_and_grads + bf16_optimizer_states: bf16 training's master weights and moments
    ds_states = trainer == "deepspeed" and inp.job.dtype != "fp16" and inp.job.optimizer_states == "bf16"
    if trainer != "megatron" and not (tt_moments or ds_states):
        job = replace(job, optimizer_states="fp32")
    if trainer == "megatron":  # the script names its loss kernel (--cross-entropy-loss-fusion), which check reads
        job = replace(job, cross_entropy=job.runs_cross_entropy)
    if trainer == "torchtitan":  # FP8: the TOML's converters, or the config function written for a Llama 3 model
        from autotune.emit.torchtitan_mapping import float8_on_command_line

        fp8 = inp.job.dtype == "fp8" and (fmt == "toml" or float8_on_command_line(inp.model))
        dtype = "fp8" if fp8 else "bf16"
        job = replace(job, dtype=dtype, flash_attention=True, grad_reduce="fp32")
    if trainer == "deepspeed":  # no data_types in the config: gradients accumulate and reduce in the model dtype
        dtype = "fp16" if inp.job.dtype == "fp16" else "bf16"
        job = replace(job, dtype=dtype, flash_attention=True, fused_kernels=True, grad_reduce=dtype)
    return job


def _scenarios() -> list[tuple[str, EmitInput]]:
    return list(GOLDEN.items())


def _read_back(tmp: Path, inp: EmitInput, trainer: str, fmt: str | None, name: str):
    result = emit(trainer, inp, torchtitan_format=fmt or "cli")
    for fname, content in result.files:
        (tmp / fname).write_text(content)
    path = tmp / name
    kind, reading, got_fmt = read_config(path, trainer if name.endswith(".txt") else None, inp.plan.num_gpus)
    assert kind == trainer
    # DeepSpeed's JSON never names the model; torchtitan's overrides do only through a registry config function
    names_model = trainer == "megatron" or fmt == "toml" or (name.endswith(".sh") and (
        inp.model.name in REGISTRY or inp.model.name in MOE_REGISTRY))  # torchtitan's config function or ours
    model_arg = None if names_model else inp.model.name
    u = understand(path, reading, trainer=kind, fmt=got_fmt, gpus=inp.plan.num_gpus, model_arg=model_arg,
                   seq_len_arg=inp.job.seq_len if trainer == "deepspeed" else None)
    return u


def _estimate_text(model, gpu: str, job, plan: Plan) -> str:
    hw = load_hardware(gpu)
    return dump_json(estimate_json(CostModel(model, hw, job).estimate(plan), model, hw, job))


def _check_roundtrip(tmp: Path, inp: EmitInput, trainer: str, fmt: str | None, name: str) -> None:
    u = _read_back(tmp, inp, trainer, fmt, name)
    expected = as_run(inp.plan, trainer, fmt, inp)
    assert u.plan == expected, f"{trainer}/{name}: read {u.plan}, expected {expected}"
    model = as_run_model(inp.model, trainer, inp.job.seq_len)  # a window only torchtitan builds
    assert u.model == model
    job = as_run_job(inp, trainer, fmt)
    if name == "torchtitan_overrides.txt" and job.dtype != u.job.dtype:  # FP8 is the launch's config function's
        assert (u.job.dtype, job.dtype) == ("bf16", "fp8") and any(n.startswith("no --config: ") for n in u.notes)
        job = replace(job, dtype="bf16")
    assert u.job == job
    hw = load_hardware(inp.gpu)
    check_plan(u.plan, u.model, u.job, u.plan.num_gpus, hw.gpus_per_node, allow_cross_node_tp=True)
    assert _estimate_text(u.model, inp.gpu, u.job, u.plan) == _estimate_text(model, inp.gpu, job, expected)


@pytest.mark.parametrize("trainer,fmt,name", TRAINERS, ids=[t[2] for t in TRAINERS])
@pytest.mark.parametrize("scenario", list(GOLDEN))
def test_golden_roundtrip(tmp_path: Path, scenario: str, trainer: str, fmt: str | None, name: str) -> None:
    _check_roundtrip(tmp_path, GOLDEN[scenario], trainer, fmt, name)


@pytest.mark.slow
@pytest.mark.parametrize("trainer,fmt,name", TRAINERS, ids=[t[2] for t in TRAINERS])
def test_planner_roundtrip(tmp_path: Path, trainer: str, fmt: str | None, name: str) -> None:
    for scenario, inp in planner_scenarios():
        if trainer == "deepspeed" and inp.plan.zero >= 2 and inp.plan.pp > 1:
            continue  # DeepSpeed refuses to emit it (no file to check)
        case = tmp_path / scenario
        case.mkdir()
        if trainer == "megatron" and not inp.model.causal:  # pretrain_gpt.py trains a causal decoder only
            with pytest.raises(SpecError, match="closest catalog model, bert-large, differs in causal True vs False"):
                _check_roundtrip(case, inp, trainer, fmt, name)
            continue
        _check_roundtrip(case, inp, trainer, fmt, name)


@pytest.mark.parametrize("trainer,fmt,name", TRAINERS, ids=[t[2] for t in TRAINERS])
@pytest.mark.parametrize("scenario", list(GOLDEN))
def test_fixed_point(tmp_path: Path, scenario: str, trainer: str, fmt: str | None, name: str) -> None:
    """Re-emitting the plan read back writes the same trainer settings (all but the header comments)."""
    inp = GOLDEN[scenario]
    u = _read_back(tmp_path, inp, trainer, fmt, name)
    again = emit(trainer, replace(inp, plan=u.plan, job=u.job), torchtitan_format=fmt or "cli")
    first = emit(trainer, replace(inp, job=u.job), torchtitan_format=fmt or "cli")

    def body(files: tuple[tuple[str, str], ...]) -> dict[str, str]:
        out = {}
        for fname, text in files:
            if fname.endswith(".json"):
                doc = json.loads(text)
                doc.pop("_autotune", None)
                out[fname] = json.dumps(doc, sort_keys=True)
            else:
                out[fname] = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        return out

    assert body(again.files) == body(first.files)


GOLDEN_DIR = Path(__file__).resolve().parents[1] / "emit" / "golden"
ON_DISK = [(t, f, n, d) for t, f, n, d in (
    ("megatron", None, "launch_megatron.sh", "megatron"), ("torchtitan", "toml", "torchtitan.toml", "torchtitan/toml"),
    ("torchtitan", "cli", "launch_torchtitan.sh", "torchtitan/cli"), ("deepspeed", None, "ds_config.json", "deepspeed"))]


@pytest.mark.parametrize("trainer,fmt,name,where", ON_DISK, ids=[d for *_, d in ON_DISK])
@pytest.mark.parametrize("scenario", list(GOLDEN))
def test_golden_files_on_disk(scenario: str, trainer: str, fmt: str | None, name: str, where: str) -> None:
    """The golden files themselves (tests/emit/golden/<trainer>/<scenario>/), read where they lie."""
    path = GOLDEN_DIR / where / scenario / name
    if not path.is_file():
        pytest.skip(f"no golden {path}")
    inp = GOLDEN[scenario]
    kind, reading, got_fmt = read_config(path, None, inp.plan.num_gpus)
    names_model = trainer == "megatron" or fmt == "toml" or (trainer == "torchtitan" and inp.model.name in REGISTRY)
    u = understand(path, reading, trainer=kind, fmt=got_fmt, gpus=inp.plan.num_gpus,
                   model_arg=None if names_model else inp.model.name,
                   seq_len_arg=inp.job.seq_len if trainer == "deepspeed" else None)
    assert (kind, u.plan, u.model) == (trainer, as_run(inp.plan, trainer, fmt, inp), inp.model)
    job = as_run_job(inp, trainer, fmt)
    assert _estimate_text(u.model, inp.gpu, u.job, u.plan) == _estimate_text(inp.model, inp.gpu, job, u.plan)


#: Mixture-of-experts plans (issue 14) for the trainers that run them: Megatron every MoE catalog model, torchtitan
#: the ones it ships (emit/torchtitan_mapping.py MOE_REGISTRY); DeepSpeed's MoE lives in model code (refused).
MOE_PLANS = {
    "deepseek-v3": Plan(tp=1, pp=8, dp=16, ep=16, etp=1, mbs=1, num_microbatches=64, zero=1, recompute="full",
                        vocab="balanced", layers_per_stage=(7, 8, 8, 8, 8, 8, 8, 6)),
    "qwen3-30b-a3b": Plan(tp=1, pp=2, dp=8, ep=8, etp=1, mbs=1, num_microbatches=32, zero=1,
                          layers_per_stage=(24, 24)),
    "qwen3-235b-a22b": Plan(tp=1, pp=2, dp=64, ep=16, etp=1, mbs=1, num_microbatches=16, zero=1,
                            layers_per_stage=(47, 47)),
    "gpt-oss-120b": Plan(tp=1, pp=4, dp=16, ep=8, etp=1, mbs=1, num_microbatches=32, zero=1,
                         layers_per_stage=(9, 9, 9, 9)),
    "mixtral-8x7b": Plan(tp=2, pp=1, dp=8, ep=8, etp=1, mbs=1, num_microbatches=16, zero=1, sequence_parallel=True,
                         layers_per_stage=(32,)),
}
MOE_TRAINERS = [(model, t) for model in MOE_PLANS for t in TRAINERS[:4]
                if t[0] == "megatron" or model in ("deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b")]


@pytest.mark.parametrize("model,trainer", MOE_TRAINERS, ids=[f"{m}-{t[2]}" for m, t in MOE_TRAINERS])
def test_moe_roundtrip(tmp_path: Path, model: str, trainer: tuple) -> None:
    """An MoE plan emitted for a trainer reads back as the plan that trainer runs, on the same catalog model."""
    from emit.test_megatron import _inp

    plan = MOE_PLANS[model]
    inp = _inp(model, "h100-sxm", JobSpec(global_batch=plan.dp * plan.mbs * plan.num_microbatches, seq_len=4096),
               plan)
    _check_roundtrip(tmp_path, inp, *trainer)


_PREDICTED = re.compile(r"predicted: step ([\d.]+) s, peak memory ([\d.]+) GiB per GPU, MFU ([\d.]+)%"
                        r"( \(re-estimated)?")


@pytest.mark.parametrize("trainer,fmt,name", TRAINERS, ids=[t[2] for t in TRAINERS])
@pytest.mark.parametrize("scenario", list(GOLDEN))
def test_header_states_what_check_predicts(tmp_path: Path, scenario: str, trainer: str, fmt: str | None,
                                           name: str) -> None:
    """A file's header predicts what `check` predicts for the file: where the trainer runs another plan or other
    kernels than the plan was priced with (a plan searched for Megatron emitted for DeepSpeed), the header is
    re-estimated for what it runs; otherwise it repeats the plan's own figures, for a plan and job check reads
    back unchanged."""
    inp = GOLDEN[scenario]
    hw = replace(load_hardware(inp.gpu), gpus_per_node=inp.gpus_per_node)
    inp = replace(inp, reestimate=reestimator(CostModel(inp.model, hw, inp.job)))
    u = _read_back(tmp_path, inp, trainer, fmt, name)
    found = _PREDICTED.search((tmp_path / name).read_text())
    if found is None:  # a bare file of overrides has no header
        assert name.endswith(".txt")
        return
    step, peak, mfu, again = found.groups()
    if again is None:  # a Megatron script names the loss kernel its job leaves to the trainer
        named = replace(inp.job, cross_entropy=inp.job.runs_cross_entropy) if trainer == "megatron" else inp.job
        assert (u.plan, u.job) == (inp.plan, named)
        return
    est = CostModel(u.model, hw, u.job).estimate(u.plan)
    assert (step, peak, mfu) == (f"{est.step_time_s:.3f}", f"{gib(est.peak_memory_bytes):.1f}", f"{100 * est.mfu:.1f}")


@pytest.mark.parametrize("capacity,pad", [(1.1, False), (1.5, True)])
def test_moe_capacity_factor_roundtrip(tmp_path: Path, capacity: float, pad: bool) -> None:
    """A Megatron MoE config with a capacity factor reads back with it: the same job, plan and estimate."""
    from emit.test_megatron import _inp

    plan = MOE_PLANS["mixtral-8x7b"]
    job = JobSpec(global_batch=plan.dp * plan.mbs * plan.num_microbatches, seq_len=4096, moe_capacity_factor=capacity,
                  moe_pad_to_capacity=pad)
    _check_roundtrip(tmp_path, _inp("mixtral-8x7b", "h100-sxm", job, plan), *TRAINERS[0])


#: Job settings a launch config must carry (the Megatron script once dropped --grad-reduce bf16): each variant of
#: the default job, emitted for every trainer and read back.
JOB_VARIANTS = {"fp8": {"dtype": "fp8"}, "fp16": {"dtype": "fp16"}, "no-flash": {"flash_attention": False},
                "unfused": {"fused_kernels": False}, "bf16-grads": {"grad_reduce": "bf16"},
                "bf16-states": {"optimizer_states": "bf16"},
                "bf16-grads-and-states": {"grad_reduce": "bf16", "optimizer_states": "bf16"},
                "fp16-grads": {"dtype": "fp16", "grad_reduce": "fp16"},
                "bf16-moments": {"optimizer_states": "bf16-moments"}}


@pytest.mark.parametrize("trainer,fmt,name", TRAINERS, ids=[t[2] for t in TRAINERS])
@pytest.mark.parametrize("variant", list(JOB_VARIANTS))
def test_every_job_setting_roundtrips(tmp_path: Path, variant: str, trainer: str, fmt: str | None, name: str) -> None:
    """What the config runs is what `check` reads back, for every job setting the cost model prices: the job as
    the trainer's emitted config runs it (as_run_job: the trainer's own kernels and what its config can say)."""
    inp = GOLDEN["even"]
    _check_roundtrip(tmp_path, replace(inp, job=replace(inp.job, **JOB_VARIANTS[variant])), trainer, fmt, name)


@pytest.mark.parametrize("grad_reduce", ["fp32", "bf16"])
def test_optimizer_state_precision_roundtrip(tmp_path: Path, grad_reduce: str) -> None:
    """A Megatron config with bf16 Adam states (and bf16 or fp32 gradient buffers) reads back as the same job,
    plan and estimate."""
    from emit.test_megatron import _inp

    plan = Plan(tp=2, pp=2, dp=2, mbs=1, num_microbatches=32, zero=1, sequence_parallel=True,
                layers_per_stage=(16, 16))
    job = JobSpec(global_batch=64, seq_len=4096, grad_reduce=grad_reduce, optimizer_states="bf16")
    _check_roundtrip(tmp_path, _inp("llama3-8b", "h100-sxm", job, plan), *TRAINERS[0])


def test_the_bf16_405b_config_function_reads_back_as_its_model(tmp_path: Path) -> None:
    """The launch trains Llama 3 405B through a config function of its own (llama3_405b_bf16, torchtitan's turns on
    Float8): `check` reads it back as that model without --model."""
    from emit.test_megatron import _inp

    plan = Plan(tp=8, pp=16, dp=8, mbs=1, num_microbatches=128, zero=1, sequence_parallel=True,
                layers_per_stage=(7,) + (8,) * 14 + (7,))
    inp = _inp("llama3-405b", "h200", JobSpec(global_batch=1024, seq_len=8192, trainer="torchtitan"), plan)
    u = _read_back(tmp_path, inp, "torchtitan", None, "launch_torchtitan.sh")
    assert u.model.name == "llama3-405b"


@pytest.mark.parametrize("trainer,fmt,name", TRAINERS[1:3], ids=[t[2] for t in TRAINERS[1:3]])
@pytest.mark.parametrize("ep,etp", [(1, 1), (8, 2)])
def test_moe_header_states_what_check_predicts_for_torchtitans_expert_layout(tmp_path: Path, trainer: str,
                                                                               fmt: str | None, name: str, ep: int,
                                                                               etp: int) -> None:
    """torchtitan lays experts out by ep alone once ep > 1 (0.2.x's TOML: etp = tp allowed) and over tp with ep 1:
    a qwen3-30b-a3b plan of tp 2 with etp 1 (ep 1) or etp 2 (ep 8) is emitted as it runs, and the header's
    re-estimate is what `check` predicts for the file (reviewer and user-tester: 6.4 vs 3.5 s, 8.9 vs 3.7 s)."""
    from emit.test_megatron import _inp

    plan = Plan(tp=2, pp=1, dp=32, ep=ep, etp=etp, mbs=2, num_microbatches=8, zero=1, sequence_parallel=True,
                layers_per_stage=(48,))
    inp = _inp("qwen3-30b-a3b", "h100-sxm", JobSpec(global_batch=512, seq_len=4096), plan)
    hw = replace(load_hardware(inp.gpu), gpus_per_node=inp.gpus_per_node)
    inp = replace(inp, reestimate=reestimator(CostModel(inp.model, hw, inp.job)))
    u = _read_back(tmp_path, inp, trainer, fmt, name)
    step, peak, mfu, _ = _PREDICTED.search((tmp_path / name).read_text()).groups()
    est = CostModel(u.model, hw, u.job).estimate(u.plan)
    assert (step, peak, mfu) == (f"{est.step_time_s:.3f}", f"{gib(est.peak_memory_bytes):.1f}", f"{100 * est.mfu:.1f}")
    assert u.plan.etp == (2 if ep == 1 or fmt == "toml" else 1)


def test_latent_attention_reads_its_norms_flag_as_the_published_model(tmp_path: Path) -> None:
    """With --multi-latent-attention, --qk-layernorm builds the latents' norms (megatron-core gpt_layer_specs:
    LayerNormLinear up-projections; Megatron-Bridge's DeepSeek-V3 provider sets qk_layernorm=True), not per-head
    ones: the emitted DeepSeek-V3 script carries it and reads back as deepseek-v3 (user-tester: it left the flag
    out, and a script giving it could not be checked). A script without it is read the same, with a note."""
    from emit.test_megatron import _inp

    plan = MOE_PLANS["deepseek-v3"]
    inp = _inp("deepseek-v3", "h100-sxm", JobSpec(global_batch=plan.dp * plan.num_microbatches, seq_len=4096), plan)
    (name, script), *_ = emit("megatron", inp).files
    assert " --qk-layernorm" in script
    for text, noted in ((script, False), (script.replace(" --qk-layernorm", ""), True)):
        path = tmp_path / name
        path.write_text(text)
        kind, reading, fmt = read_config(path, None, plan.num_gpus)
        u = understand(path, reading, trainer=kind, fmt=fmt, gpus=plan.num_gpus, model_arg=None, seq_len_arg=None)
        assert u.model == inp.model and not u.model.qk_norm
        assert any("--multi-latent-attention without --qk-layernorm" in n for n in u.notes) is noted
