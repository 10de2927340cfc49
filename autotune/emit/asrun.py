"""What an emitted config runs: the plan and job its trainer runs in place of the planned ones, and the predicted
figures of that. One implementation for everything that must describe the file as it runs: the header
(emit/common.py), the out-of-memory warning (emit/__init__.py) and the checkpoint interval (emit/runfiles.py).

What runs is specs/trainers.py's as_run (the closest configuration the trainer expresses) and
specs/trainer_jobs.py's as_run_job (the kernels and state precisions it runs; 16-bit Adam states only at a ZeRO
stage the trainer keeps them under), then what the output format changes further: torchtitan's 0.2.x TOML
(emit/torchtitan_mapping.py toml_runs). This module imports EmitInput for typing only, so the package's
__init__ can import it without a cycle (common.py imports the package for EmitInput).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan
from autotune.specs.trainer_jobs import as_run_job, as_run_model
from autotune.specs.trainers import EMITTED_CAPS, as_run

if TYPE_CHECKING:
    from autotune.emit import EmitInput

#: `runs(planned, as run)`: what an output format changes of the plan its trainer otherwise runs.
Runs = Callable[[Plan, Plan], Plan]
#: (step time s, peak memory GiB per GPU, MFU)
Figures = tuple[float, float, float]


@dataclass(frozen=True, slots=True)
class AsRun:
    """The plan, job and model an emitted config runs, and what of the difference the cost model cannot express."""

    plan: Plan
    job: JobSpec
    notes: tuple[str, ...] = ()
    model: ModelSpec | None = None
    """The model as the config builds it (trainer_jobs.as_run_model: a sliding window only torchtitan builds)."""


def format_runs(trainer: str, fmt: str | None) -> Runs | None:
    """What `trainer`'s output format `fmt` changes further (None: nothing): torchtitan's 0.2.x TOML."""
    if trainer == "torchtitan" and fmt == "toml":
        from autotune.emit.torchtitan_mapping import toml_runs  # imports the package: not at module level

        return toml_runs
    return None


def what_runs(inp: EmitInput, trainer: str, fmt: str | None = None) -> AsRun:
    """The plan and job the config `trainer` gets (in format `fmt`) runs; inp.plan and inp.job where it runs them."""
    caps = EMITTED_CAPS.get(trainer)
    plan, notes = as_run(caps, inp.plan, inp.model) if caps is not None else (inp.plan, ())
    runs = format_runs(trainer, fmt)
    if runs is not None:
        plan = runs(inp.plan, plan)
    job = as_run_job(inp.job, trainer, fmt)
    if trainer == "torchtitan" and fmt != "toml" and inp.job.dtype == "fp8":  # a config function converts to FP8
        from autotune.emit.torchtitan_mapping import float8_on_command_line

        job = replace(job, dtype="fp8" if float8_on_command_line(inp.model) else job.dtype)
    if plan.zero not in job.state_zero_stages:  # e.g. Megatron FSDP, which keeps fp32 main weights and moments
        job = replace(job, optimizer_states="fp32")
    return AsRun(plan, job, tuple(notes), as_run_model(inp.model, trainer, inp.job.seq_len))


def as_planned(inp: EmitInput, run: AsRun) -> bool:
    """Whether the config runs the plan, job and model as they were priced (the same attention kernel counts as
    the same, whether a job names it or leaves it to the trainer: JobSpec.runs_attention)."""
    def kernel_named(job: JobSpec) -> tuple[JobSpec, str | None]:
        return replace(job, attention_backend=None), job.runs_attention

    planned = inp.model if inp.searched_for is None else as_run_model(inp.model, inp.searched_for, inp.job.seq_len)
    return (run.plan == inp.plan and kernel_named(run.job) == kernel_named(inp.job)
            and run.model in (None, planned))


def run_figures(inp: EmitInput, run: AsRun) -> Figures | None:
    """The predicted figures of what runs: inp's own where it runs the plan as planned, else re-estimated through
    inp.reestimate (None when there is none to call)."""
    if as_planned(inp, run):
        return inp.step_time_s, inp.peak_memory_gib, inp.mfu
    return None if inp.reestimate is None else inp.reestimate(run.plan, run.job, run.model)
