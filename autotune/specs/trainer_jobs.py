"""The job as each trainer runs it: which settings a trainer's emitted config keeps (its gradient buffers, Adam
states, multi-token prediction, kernels), checked before a search restricted to it and applied where a plan is
re-costed for it (the header of an emitted config, `check`'s reading). The plan-level rules are in trainers.py."""

from __future__ import annotations

from dataclasses import replace

from autotune.errors import SpecError
from autotune.specs.job import ATTENTION_NAMES, OWN_ATTENTION, JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.trainers import TRAINER_CAPS, TrainerCaps


def runs_mtp(model: ModelSpec, job: JobSpec) -> int:
    """The model's multi-token prediction modules job.trainer trains (0 where it has none: TrainerCaps.mtp)."""
    return model.mtp_layers if TRAINER_CAPS[job.trainer].mtp else 0


def runs_grad_reduce(trainer: str | None, dtype: str, asked: str | None = None) -> str:
    """JobSpec.grad_reduce as `trainer`'s emitted config runs it (`asked`, or fp32, where the config says): torchtitan's
    FSDP2 reduces in fp32 (training.mixed_precision_reduce takes float32 only); DeepSpeed's config sets no data_types
    or communication_data_type, so it accumulates and reduces gradients in the model's dtype (deepspeed 0.19
    engine.py get_data_types, communication_data_type: fp16, else bf16, its config having no fp8)."""
    if trainer == "torchtitan":
        return "fp32"
    if trainer == "deepspeed":
        return "fp16" if dtype == "fp16" else "bf16"
    return asked or "fp32"


def check_job_settings(caps: TrainerCaps | None, job: JobSpec) -> None:
    """A search restricted to a trainer (or fork), or costed with its kernels, prices only a token dispatcher and
    Adam state dtype it runs."""
    if caps is not None and job.moe_dispatcher not in caps.moe_dispatchers:
        raise SpecError(f"--moe-dispatcher {job.moe_dispatcher}: {caps.name} runs "
                        f"{', '.join(caps.moe_dispatchers)}; use --moe-dispatcher alltoall")
    if caps is not None and job.optimizer_states not in caps.optimizer_states:
        raise SpecError(f"--optimizer-states {job.optimizer_states}: {caps.name} keeps "
                        f"{', '.join(caps.optimizer_states)} Adam states; use --optimizer-states fp32")
    if caps is not None and caps.name == "deepspeed" and job.optimizer_states != "fp32" and job.dtype == "fp16":
        raise SpecError(f"--optimizer-states {job.optimizer_states} with --dtype fp16: DeepSpeed keeps 16-bit Adam "
                        "states with bf16 training only (bf16.bf16_optimizer_states); use --dtype bf16 or "
                        "--optimizer-states fp32")


def check_trainer_settings(caps: TrainerCaps | None, job: JobSpec) -> None:
    """A search restricted to a trainer (--trainer) prices only the gradient buffers and attention kernel its config
    runs (OWN_ATTENTION: torchtitan's cuDNN, Colossal-AI's FlashAttention-2). Not asked of --kernels alone: those
    price the trainer's kernels under any gradient dtype or attention kernel (an older torchtitan's
    FlashAttention-2)."""
    if caps is not None and caps.moe and not caps.name.startswith("megatron") and job.moe_capacity_factor:
        # (Megatron and its forks drop at a capacity; DeepSpeed and Colossal-AI configs refuse MoE models first)
        raise SpecError(f"--moe-capacity-factor {job.moe_capacity_factor:g}: {caps.name}'s MoE routes every token "
                        "(dropless), so its config drops none; leave the flag out (plan and estimate cost token "
                        f"dropping with --kernels {caps.name} and no --trainer)")
    runs = runs_grad_reduce(caps and caps.name, job.dtype, job.grad_reduce)
    if caps is not None and job.grad_reduce != runs:
        raise SpecError(f"--grad-reduce {job.grad_reduce}: {caps.name}'s config keeps {runs} gradient buffers with "
                        f"--dtype {job.dtype}; use --grad-reduce {runs} (its default)")
    own = OWN_ATTENTION.get(caps.name) if caps is not None else None
    if own is not None and job.attention_backend not in (None, own):
        why = {"torchtitan": "torchtitan asks SDPA for cuDNN attention first (its attention module)",
               "colossalai": "colossalai calls FlashAttention-2 itself"}.get(caps.name, f"{caps.name} fixes it")
        raise SpecError(f"--attention-backend {job.attention_backend}: {why}, so its config runs "
                        f"{ATTENTION_NAMES[own]}; leave the flag out (plan and estimate cost another kernel with "
                        f"--kernels {caps.name} and no --trainer)")


def as_run_job(job: JobSpec, trainer: str, fmt: str | None = None) -> JobSpec:
    """The job as `trainer`'s emitted config runs it (what `check` reads back from the file): the trainer's own
    kernels, and the settings its emitter fixes. torchtitan: SDPA's cuDNN attention, fp32 gradient reduction
    (FSDP2's default), FP8 in the 0.2.x TOML (float8 converters; the 0.3.0 command line has no flag for it, so
    only the config function autotune writes for a Llama 3 model converts: emit/asrun.what_runs); DeepSpeed:
    fp16 or bf16 (no FP8), fused kernels, gradients in that dtype (runs_grad_reduce); only Megatron drops tokens at
    a capacity factor; Adam states as the trainer keeps them (TrainerCaps.optimizer_states; torchtitan's bf16 moments
    in its 0.3.0 overrides, not the 0.2.x TOML; DeepSpeed's bf16 master weights and states with bf16 training), else
    fp32; the attention kernel its code fixes (OWN_ATTENTION: Colossal-AI's FlashAttention-2), DeepSpeed keeping
    the job's; NCCL all-to-alls where the trainer has no other token dispatcher (DeepEP is Megatron's).
    `fmt`: torchtitan's format, "cli" (the default) or "toml"."""
    out = replace(job, trainer=trainer,  # type: ignore[arg-type]
                  attention_backend=None if trainer in OWN_ATTENTION else job.attention_backend)
    caps = TRAINER_CAPS.get(trainer)
    kept = caps is not None and job.optimizer_states in caps.optimizer_states and not (
        (trainer == "torchtitan" and fmt == "toml") or (trainer == "deepspeed" and job.dtype == "fp16"))
    if not kept:
        out = replace(out, optimizer_states="fp32")
    if trainer != "megatron":  # only Megatron's config drops tokens at a capacity (emit: capacity_warning)
        out = replace(out, moe_capacity_factor=0.0, moe_pad_to_capacity=False)
    if caps is not None and out.moe_dispatcher not in caps.moe_dispatchers:  # DeepEP: Megatron's flex dispatcher
        out = replace(out, moe_dispatcher="alltoall")
    if trainer == "torchtitan":
        return replace(out, dtype="fp8" if job.dtype == "fp8" and fmt == "toml" else "bf16", flash_attention=True,
                       grad_reduce="fp32")
    if trainer == "deepspeed":
        dtype = "fp16" if job.dtype == "fp16" else "bf16"
        return replace(out, dtype=dtype, flash_attention=True, fused_kernels=True,
                       grad_reduce=runs_grad_reduce(trainer, dtype))
    return out


def as_run_model(model: ModelSpec, trainer: str, seq_len: int) -> ModelSpec:
    """The model as `trainer`'s emitted config builds it: only torchtitan builds a sliding-window model's window
    (its gpt-oss), the others attend over the whole sequence in every layer (emit warns so; check costs it so;
    plan and scale with --trainer search it so). No longer the catalog's shape, it drops catalog_name (only
    torchtitan's registry reads it, and torchtitan keeps the window)."""
    if trainer == "torchtitan" or not model.sliding_window_layers or model.sliding_window >= seq_len:
        return model
    return replace(model, sliding_window=0, sliding_window_layers=0, catalog_name="")


def as_run(model: ModelSpec, trainer: str | None, seq_len: int) -> tuple[ModelSpec, list[str]]:
    """The model a search for `trainer` costs (as_run_model; the model itself without a trainer) and the note
    that says what changed (none, or as_run_note's one)."""
    if not trainer:
        return model, []
    note = as_run_note(model, trainer, seq_len)
    return as_run_model(model, trainer, seq_len), [note] if note else []


def as_run_note(model: ModelSpec, trainer: str, seq_len: int) -> str | None:
    """What as_run_model changes, said before a search for `trainer` (plan/scale --trainer), or None."""
    if as_run_model(model, trainer, seq_len) is model:
        return None
    return (f"{model.name}: {trainer}'s config builds no sliding window, so its {model.sliding_window_layers} "
            f"windowed layers are planned as full attention over {seq_len} tokens (torchtitan builds the window)")
