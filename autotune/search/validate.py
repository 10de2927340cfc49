"""An independent plan validator: re-derives degrees, divisibility, partition and memory for any plan (the
solver's or one written by hand) from the specs and the cost model, never from the solver."""

from __future__ import annotations

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import InvalidPlanError
from autotune.specs.plan import Plan, check_plan
from autotune.units import gib


def validate_plan(plan: Plan, cm: CostModel, gpus: int, *, allow_idle: bool = False,
                  allow_cross_node_tp: bool = False) -> Estimate:
    """Check every rule and every stage's memory; return the plan's estimate or raise InvalidPlanError."""
    check_plan(plan, cm.model, cm.job, gpus, cm.hw.gpus_per_node, allow_idle=allow_idle,
               allow_cross_node_tp=allow_cross_node_tp)
    est = cm.estimate(plan)
    if (problem := memory_problem(est)) is not None:
        raise InvalidPlanError(problem)
    return est


def memory_problem(est: Estimate) -> str | None:
    """The first stage over the usable memory, said with its terms; None when every stage fits."""
    for stage in est.stages:
        if stage.memory.total > est.usable_memory_bytes:
            return (f"stage {stage.index} needs {memory_summary(stage.memory.terms())} > "
                    f"{gib(est.usable_memory_bytes):.1f} GiB usable")
    return None


def memory_summary(terms: dict[str, int]) -> str:
    """'96.3 GiB (optimizer 41.0 GiB, activations 38.0 GiB, ...)', largest terms first."""
    total = sum(terms.values())
    parts = sorted(((v, k) for k, v in terms.items() if v > 0), reverse=True)
    return f"{gib(total):.1f} GiB (" + ", ".join(f"{k.replace('_', ' ')} {gib(v):.1f}" for v, k in parts) + ")"
