"""Emitters: a plan turned into the launch configuration of a real trainer (one module per trainer).

Emitters are pure and deterministic: they take an `EmitInput` (the plan, the specs and the predicted figures
for the header) and return an `EmitResult` (file names and contents, plus one-line warnings for whatever the
trainer cannot express; the closest valid configuration is emitted instead). Writing files is the CLI's job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan

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


@dataclass(frozen=True, slots=True)
class EmitResult:
    """Files to write (relative name, content), sorted by name, and what the trainer could not express."""

    files: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...] = ()


def emit(trainer: str, inp: EmitInput, *, torchtitan_format: str = "cli") -> EmitResult:
    """Dispatch to the trainer's emitter (imported on demand: each module is independent). Only Colossal-AI
    runs 2-D/2.5-D/3-D tensor parallelism; for the others such a plan is emitted as 1-D, with a warning."""
    if trainer in TRAINERS and trainer != "colossalai" and inp.plan.tp_mode != "1d":
        result = emit(trainer, replace(inp, plan=replace(inp.plan, tp_mode="1d")),
                      torchtitan_format=torchtitan_format)
        warning = (f"{trainer} has only 1-D (Megatron-style) tensor parallelism: the plan's {inp.plan.tp_mode} "
                   f"tensor parallelism over {inp.plan.tp} GPUs is emitted as 1-D tp {inp.plan.tp} (its predicted "
                   "time does not hold); use --trainer colossalai for the grid")
        return EmitResult(result.files, (warning, *result.warnings))
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
    from autotune.errors import SpecError

    raise SpecError(f"--trainer {trainer!r}: unknown trainer; use one of {', '.join(TRAINERS)}")
