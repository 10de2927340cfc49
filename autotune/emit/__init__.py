"""Emitters: a plan turned into the launch configuration of a real trainer (one module per trainer).

Emitters are pure and deterministic: they take an `EmitInput` (the plan, the specs and the predicted figures
for the header) and return an `EmitResult` (file names and contents, plus one-line warnings for whatever the
trainer cannot express; the closest valid configuration is emitted instead). Writing files is the CLI's job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from autotune.emit.asrun import run_figures, what_runs
from autotune.errors import SpecError
from autotune.specs.job import ATTENTION_NAMES, JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import DEFAULT_BUCKET, Plan
from autotune.specs.trainers import (TORCHTITAN_MOE_MODELS, TRAINER_CAPS, TrainerCaps, runs_default_bucket,
                                     runs_otherwise)

TRAINERS = ("megatron", "torchtitan", "deepspeed", "colossalai")


@dataclass(frozen=True, slots=True, kw_only=True)
class EmitInput:
    """Everything an emitter may use."""

    plan: Plan
    model: ModelSpec
    job: JobSpec
    gpu: str
    """Hardware name (for the header)."""
    gpus_per_node: int
    step_time_s: float
    """Predicted step time, for the header."""
    peak_memory_gib: float
    """Predicted peak memory per GPU, for the header."""
    mfu: float
    reestimate: Callable[..., tuple[float, float, float]] | None = field(default=None, compare=False)
    """(step time s, peak GiB, MFU) of another plan under the same model, hardware and job: the header then
    states the prediction for the plan a trainer really runs when it differs from `plan` (emit/common.py)."""
    train_tokens: float = 1e12
    """Tokens to train (the LR schedule's length); the default is autotune.search.scaling.DEFAULT_TRAIN_TOKENS."""
    mock_data: bool = False
    """Synthetic data and no tokenizer (smoke runs); otherwise the launch files require DATA_PATH etc."""
    usable_memory_gib: float = 0.0
    """Usable memory per GPU, for a warning when the config as its trainer runs it does not fit (0: unknown)."""
    searched_for: str | None = None
    """The trainer the plan was searched for (plan --trainer, plan.json's "trainer"), whose config's model
    (trainer_jobs.as_run_model) the figures are for; None: the model as given."""


@dataclass(frozen=True, slots=True)
class EmitResult:
    """Files to write (relative name, content), sorted by name, and what the trainer could not express."""

    files: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...] = ()


def emit(trainer: str, inp: EmitInput, *, torchtitan_format: str = "cli") -> EmitResult:
    """Dispatch to the trainer's emitter (imported on demand: each module is independent). Only Colossal-AI
    runs 2-D/2.5-D/3-D tensor parallelism; for the others such a plan is emitted as 1-D, with a warning."""
    caps = TRAINER_CAPS.get(trainer)
    if inp.model.is_moe and trainer not in ("megatron", "torchtitan", "deepspeed"):
        # Colossal-AI's MoE plugin is not emitted: a dense config of an MoE model would silently train something
        # else. torchtitan emits its own MoE models and refuses others; deepspeed.py says why it refuses them.
        raise SpecError(f"--trainer {trainer}: autotune emits mixture-of-experts models ({inp.model.name}) for "
                        "Megatron-LM and torchtitan only; use --trainer megatron")
    if caps is not None and inp.plan.tp_mode not in caps.tp_modes:
        flat = replace(inp.plan, tp_mode="1d")
        figures = inp.reestimate(flat, inp.job) if inp.reestimate is not None else None
        flat_inp = replace(inp, plan=flat) if figures is None else replace(
            inp, plan=flat, step_time_s=figures[0], peak_memory_gib=figures[1], mfu=figures[2])
        result = emit(trainer, flat_inp, torchtitan_format=torchtitan_format)
        warning = (f"{trainer} has only 1-D (Megatron-style) tensor parallelism: the plan's {inp.plan.tp_mode} "
                   f"tensor parallelism over {inp.plan.tp} GPUs is emitted as 1-D tp {inp.plan.tp} (its predicted "
                   "time does not hold); use --trainer colossalai for the grid")
        return EmitResult(result.files, (warning, *result.warnings))
    result = _emit_one(trainer, inp, torchtitan_format)
    # Megatron's emitter says it itself, and torchtitan's lists it among what its llama3 lacks
    softcap = softcap_warning(trainer, inp.model) if trainer not in ("megatron", "torchtitan") else None
    extra = tuple(w for w in (full_attention_warning(trainer, inp), softcap, dispatcher_warning(caps, inp),
                              bucket_warning(caps, inp), *communication_warnings(caps, inp),
                              capacity_warning(trainer, inp), mtp_warning(trainer, inp),
                              rope_scaling_warning(trainer, inp),
                              state_precision_warning(trainer, inp, torchtitan_format),
                              attention_warning(trainer, inp, torchtitan_format),
                              memory_warning(trainer, inp, torchtitan_format)) if w)
    return EmitResult(result.files, (*result.warnings, *extra)) if extra else result


def dispatcher_warning(caps: TrainerCaps | None, inp: EmitInput) -> str | None:
    """The job was priced with a token dispatcher this trainer does not run (DeepEP outside Megatron): its
    config exchanges tokens with NCCL all-to-alls, slower than the header's figures."""
    p = inp.plan
    if caps is None or not inp.model.is_moe or p.ep * p.etp == 1 or inp.job.moe_dispatcher in caps.moe_dispatchers:
        return None
    return (f"the step was priced with the {inp.job.moe_dispatcher} token dispatcher, which {caps.name} does not "
            f"run: its config uses {', '.join(caps.moe_dispatchers)}; the header's figures are re-estimated for "
            "what it runs")


def bucket_warning(caps: TrainerCaps | None, inp: EmitInput) -> str | None:
    """The plan chose a gradient bucket the trainer's config cannot set (TrainerCaps.gradient_buckets): it runs
    the default one, as `check` reads it back and the header re-estimates (specs/trainers.py as_run)."""
    if caps is None or not runs_default_bucket(caps, inp.plan):
        return None
    return (f"bucket {inp.plan.bucket_size:,} parameters: {caps.name}'s config sets no gradient bucket, so it is "
            f"costed at the default {DEFAULT_BUCKET:,}; the header's figures are re-estimated for what it runs")


def communication_warnings(caps: TrainerCaps | None, inp: EmitInput) -> list[str]:
    """The plan was costed with a data-parallel overlap the trainer does not run (a reduction after the backward, a
    weights' gather in the optimizer step: trainers.runs_otherwise); the header re-estimates it as the trainer runs."""
    if caps is None:
        return []
    return [f"{line}; the header's figures are re-estimated for what it runs"
            for line in runs_otherwise(caps, inp.plan, inp.job) if not line.startswith("bucket ")]


def capacity_warning(trainer: str, inp: EmitInput) -> str | None:
    """A capacity factor only Megatron's config expresses: torchtitan's MoE routes dropless (the header
    re-estimates it so: specs/trainer_jobs.py as_run_job)."""
    if trainer == "megatron" or not inp.model.is_moe or not inp.job.moe_capacity_factor:
        return None
    return (f"--moe-capacity-factor {inp.job.moe_capacity_factor:g}: {trainer}'s MoE routes every token (dropless); "
            "the config sets no capacity, as the header's figures assume")


def memory_warning(trainer: str, inp: EmitInput, fmt: str | None) -> str | None:
    """The config as its trainer runs it (what the header re-estimates: emit/asrun.py, with torchtitan's TOML
    adjustments) is predicted not to fit in a GPU's usable memory."""
    if not inp.usable_memory_gib:
        return None
    figures = run_figures(inp, what_runs(inp, trainer, fmt))
    peak = inp.peak_memory_gib if figures is None else figures[1]
    if peak <= inp.usable_memory_gib:
        return None
    return (f"the config as {trainer} runs it is predicted to need {peak:.1f} GiB per GPU, over the "
            f"{inp.usable_memory_gib:.1f} GiB usable: it will run out of memory (plan with --trainer {trainer})")


def state_precision_warning(trainer: str, inp: EmitInput, fmt: str | None = None) -> str | None:
    """Gradient buffers or Adam states the trainer's config keeps otherwise than planned (torchtitan reduces in fp32,
    DeepSpeed in the model dtype: specs/trainer_jobs.py runs_grad_reduce; 16-bit states only where the trainer keeps
    them, at a ZeRO stage it keeps them under): the header re-estimates what it runs (emit/asrun.py what_runs)."""
    run = what_runs(inp, trainer, fmt).job
    lost = [f"--{flag} {getattr(inp.job, name)} ({trainer}'s config keeps {getattr(run, name)})"
            for name, flag in (("grad_reduce", "grad-reduce"), ("optimizer_states", "optimizer-states"))
            if getattr(inp.job, name) != getattr(run, name)]
    if not lost and trainer == "megatron" and inp.plan.vocab == "parallel" and inp.job.optimizer_states != "fp32":
        return (f"--optimizer-states {inp.job.optimizer_states} with vocabulary parallelism: the fork's flags "
                "(core_v0.10.0's and its own) do not record --use-precision-aware-optimizer, so with VOCAB_PARALLEL=1 "
                "the script may stop on it; plan with --fork vocab-parallel for a plan the fork runs")
    if not lost:
        return None
    more = run.grad_bytes > inp.job.grad_bytes or (run.optimizer_states == "fp32" != inp.job.optimizer_states)
    return (f"{' and '.join(lost)}: the header's figures are re-estimated for what it runs "
            f"({'more' if more else 'less'} memory than planned)")


def attention_warning(trainer: str, inp: EmitInput, fmt: str | None = None) -> str | None:
    """The plan was costed with another attention kernel than the trainer's code runs (JobSpec.runs_attention:
    Megatron's and torchtitan's cuDNN, Colossal-AI's FlashAttention-2), or with one a DeepSpeed config cannot
    choose (the model code's SDPA call does; `check` costs PyTorch's own choice)."""
    planned, runs = inp.job.runs_attention, what_runs(inp, trainer, fmt).job.runs_attention
    if planned != runs:
        return (f"the plan was costed with {ATTENTION_NAMES[planned]} attention; {trainer}'s code runs "
                f"{ATTENTION_NAMES[runs]}: the header's figures are re-estimated for what it runs")
    if trainer == "deepspeed" and inp.job.attention_backend not in (None, "cudnn"):
        return (f"the plan was costed with {ATTENTION_NAMES[planned]} attention, which a DeepSpeed config cannot "
                "choose (the model code's SDPA call does: cuDNN on Hopper from PyTorch 2.9); `autotune check` of this "
                "file costs cuDNN")
    return None


def mtp_warning(trainer: str, inp: EmitInput) -> str | None:
    """Multi-token prediction modules only Megatron's config trains (TrainerCaps.mtp): the others' run leaves
    them out, as the header's re-estimate does (the cost model drops them for that trainer)."""
    caps = TRAINER_CAPS.get(trainer)
    if not inp.model.mtp_layers or (caps is not None and caps.mtp):
        return None
    return (f"{inp.model.name}: its {inp.model.mtp_layers} multi-token prediction module(s) are not trained by "
            f"{trainer}; the config leaves them out, as the header's figures do (--trainer megatron trains them)")


def rope_scaling_warning(trainer: str, inp: EmitInput) -> str | None:
    """A model whose config.json carries YaRN rope scaling (a released DeepSeek-V3 or GPT-OSS checkpoint) or
    linear scaling (Gemma 3's global layers): only torchtitan's own models of the YaRN ones build it. Megatron's
    config trains plain RoPE, which is what pretraining at the original context does but not what continuing the
    released checkpoint needs; DeepSpeed's and Colossal-AI's configs hand the model code its type and factor (the
    code must build it)."""
    m = inp.model
    if m.rope_scaling not in ("yarn", "linear") or (
            trainer == "torchtitan" and m.rope_scaling == "yarn" and m.known_as in TORCHTITAN_MOE_MODELS):
        return None
    kind = {"yarn": "YaRN", "linear": "linear (position interpolation)"}[m.rope_scaling]
    if trainer in ("deepspeed", "colossalai"):
        extra = " (not its beta_fast/beta_slow or original context)" if m.rope_scaling == "yarn" else ""
        return (f"{m.name}: {kind} rope scaling (factor {m.rope_scaling_factor:g}) is written into the {trainer} "
                f"config's model hyperparameters by type and factor only{extra}: the model code must build it")
    return (f"{m.name}: its {kind} rope scaling (factor {m.rope_scaling_factor:g}) is not in the {trainer} config, "
            f"which trains plain RoPE (base {m.rope_theta:g}): right for pretraining, not for continuing a "
            f"checkpoint trained with it (set the trainer's RoPE scaling options for that)")


def full_attention_warning(trainer: str, inp: EmitInput) -> str | None:
    """A model with sliding-window layers (window shorter than the sequence) is costed windowed, but only
    torchtitan builds such models itself (its gpt-oss model); the other emitters write no window setting, so
    their trainer attends over the whole sequence in every layer."""
    m = inp.model
    if trainer == "torchtitan" or not m.sliding_window_layers or m.sliding_window >= inp.job.seq_len:
        return None
    said = (f"{m.name}: {m.sliding_window_layers} of {m.num_layers} layers attend over a {m.sliding_window}-token "
            f"{'chunk' if m.chunked_attention else 'window'}, but the {trainer} config sets none, so they run full "
            f"attention over {inp.job.seq_len} tokens")
    if inp.searched_for is not None and inp.searched_for != "torchtitan":
        return said + f", as the plan was searched for {inp.searched_for}"
    return said + ": the header's figures are re-estimated for what it runs"


def softcap_warning(trainer: str, model: ModelSpec) -> str | None:
    """Logit soft-capping (Gemma 2's tanh caps on the attention scores and the final logits) that no emitted config
    sets: megatron-core 0.16's TransformerConfig has no soft-cap field (nor Megatron-LM a flag), torchtitan's
    llama3 has none (emit/torchtitan_mapping.py names it), and DeepSpeed's and Colossal-AI's hyperparameters do
    not list it. The cost is the same (the caps are not costed); what trains is another model."""
    caps = [f"{what} {cap:g}" for what, cap in (("attention scores", model.attn_logit_softcap),
                                                 ("final logits", model.final_logit_softcap)) if cap]
    if not caps:
        return None
    why = ("megatron-core 0.16 has no soft-cap option and Megatron-LM no flag for it" if trainer == "megatron"
           else f"the {trainer} config has no setting for it")
    return (f"{model.name}: its logit soft-capping ({', '.join(caps)}) is not in the {trainer} config ({why}), so "
            "the run trains without it: same cost as predicted, but not the published model's logits")


def _emit_one(trainer: str, inp: EmitInput, torchtitan_format: str) -> EmitResult:
    if trainer == "colossalai":
        from autotune.emit.colossalai import emit_colossalai

        return emit_colossalai(inp)
    if trainer == "megatron":
        from autotune.emit.megatron import emit_megatron

        return emit_megatron(inp)
    if trainer == "torchtitan":
        from autotune.emit.torchtitan import emit_torchtitan

        return emit_torchtitan(inp, fmt=torchtitan_format)
    if trainer == "deepspeed":
        from autotune.emit.deepspeed import emit_deepspeed

        return emit_deepspeed(inp)
    raise SpecError(f"--trainer {trainer!r}: unknown trainer; use one of {', '.join(TRAINERS)}")
