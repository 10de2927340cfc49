"""Which trainers run a plan, and the best plan of each trainer that does not run the winner.

`plan` without --trainer searches everything autotune models; the winner may need a schedule, a vocabulary
placement or a ZeRO stage some trainers lack (specs/trainers.py). For each such trainer the same search is run
again restricted to what it runs (the same job, kernels and pins), so the output can show what each trainer
would get. Trainers that run the winner need no search of their own: nothing restricted can beat it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import InfeasibleError, SolverLimitError, SpecError
from autotune.search.pins import check_space
from autotune.search.planner import DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT, PlanResult, search
from autotune.search.space import SearchSpace, for_trainer
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan
from autotune.specs.profile import Profile
from autotune.specs.trainer_jobs import as_run_model, runs_grad_reduce
from autotune.specs.trainers import TRAINER_CAPS, runs_otherwise, unsupported
from autotune.units import gib


@dataclass(frozen=True, slots=True)
class TrainerBest:
    """One trainer's answer to a search made without --trainer."""

    trainer: str
    unsupported: tuple[str, ...]
    """What of the winning plan the trainer does not run (empty: it runs the winner as planned)."""
    best: Estimate | None
    """Its own best plan when it cannot run the winner; None when it runs the winner or nothing of its fits."""
    status: str
    """RUNS (the winner), OPTIMAL or FEASIBLE (its own search), INFEASIBLE (nothing it runs fits), PINS (the
    pins ask for something it never runs)."""
    note: str = ""
    """Why there is no plan (INFEASIBLE, PINS)."""


def best_per_trainer(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, space: SearchSpace,
                     winner: Plan, *, profile: Profile | None = None, work_limit: float = DEFAULT_WORK_LIMIT,
                     time_limit_s: float = DEFAULT_TIME_LIMIT_S, own_kernels: bool = True
                     ) -> tuple[TrainerBest, ...]:
    """Every trainer (no forks) in table order: whether it runs `winner`, else its own best plan, costed with its
    own kernels (what `plan --trainer T` returns) unless own_kernels is False (--kernels was given)."""
    out = []
    for name, caps in TRAINER_CAPS.items():
        why = (*unsupported(caps, winner, model, job), *runs_otherwise(caps, winner, job))
        built = as_run_model(model, name, job.seq_len)  # as its config builds it: only torchtitan builds windows
        if built is not model:
            why += (f"sliding window: {name}'s config builds none (full attention in every layer)",)
        grads = runs_grad_reduce(name, job.dtype, job.grad_reduce)
        if grads != job.grad_reduce:  # the gradient buffers its config keeps (DeepSpeed: the model dtype)
            why += (f"{job.grad_reduce} gradient buffers: {name}'s config keeps {grads}",)
        if not why:
            out.append(TrainerBest(name, (), None, "RUNS"))
            continue
        restricted = for_trainer(space, caps)
        own = replace(job, trainer=name) if own_kernels else job
        if own.moe_dispatcher not in caps.moe_dispatchers:  # what it runs instead: NCCL's all-to-all
            own = replace(own, moe_dispatcher="alltoall")
        if own.optimizer_states not in caps.optimizer_states:  # and Adam's usual fp32 state
            own = replace(own, optimizer_states="fp32")
        own = replace(own, grad_reduce=grads)  # its gradient buffers
        try:
            check_space(restricted, built, own, gpus, hw.gpus_per_node)
            result = search(built, hw, own, gpus, restricted, top_k=0, profile=profile, work_limit=work_limit,
                            time_limit_s=time_limit_s)
        except SpecError as exc:
            out.append(TrainerBest(name, why, None, "PINS", str(exc)))
            continue
        except InfeasibleError as exc:
            out.append(TrainerBest(name, why, None, "INFEASIBLE", str(exc)))
            continue
        except SolverLimitError as exc:
            if not isinstance(exc.result, PlanResult):
                out.append(TrainerBest(name, why, None, "INFEASIBLE", str(exc)))
                continue
            result = exc.result
        out.append(TrainerBest(name, why, result.best, result.status))
    return tuple(out)


def reestimator(cm: CostModel) -> Callable[..., tuple[float, float, float]]:
    """(step time s, peak GiB per GPU, MFU) of a plan and job under cm's model, GPU and profile: what an emitted
    file's header states for the plan a trainer really runs, with the kernels it runs and the model as it builds
    it (`model`, default cm's: emit/common.py header_lines)."""
    models = {(cm.job, cm.model): cm}

    def figures(plan: Plan, job: JobSpec, model: ModelSpec | None = None) -> tuple[float, float, float]:
        key = (job, cm.model if model is None else model)
        if key not in models:
            models[key] = CostModel(key[1], cm.hw, job, cm.profile)
        est = models[key].estimate(plan)
        return est.step_time_s, gib(est.peak_memory_bytes), est.mfu
    return figures
