"""Invariants of the planner's answer, over drawn small instances: more memory never lowers the best throughput,
and more GPUs (idle ones allowed) never make a fitting job infeasible nor its best plan slower. Both follow from
the search being exact: the plans that fit with less are still there with more."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from autotune.errors import InfeasibleError
from autotune.search.planner import PlanResult, search
from autotune.search.space import SearchSpace
from ._instances import Instance, instances, with_memory

RANDOM = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
#: The solver rounds time coefficients to 1 ns; the compared step times are >= tens of microseconds.
REL = 1e-6
#: TP overlap pinned off, as in the brute-force tests: the invariants do not depend on it, and it halves the work.
SPACE = SearchSpace(tp_overlap=(False,))


def _best(inst: Instance, space: SearchSpace = SPACE) -> PlanResult | None:
    try:
        res = search(inst.model, inst.hw, inst.job, inst.gpus, space, top_k=0, time_limit_s=30)
    except InfeasibleError:
        return None
    assert res.status == "OPTIMAL"
    return res


@RANDOM
@given(inst=instances(gpus=st.sampled_from((1, 2, 4)), fractions=(0.3, 0.45, 0.6, 1.0)),
       more=st.sampled_from((1.25, 2.0, 8.0)))
def test_more_memory_never_lowers_the_best_throughput(inst: Instance, more: float) -> None:
    """The same job on a GPU with more usable memory: whatever fit still fits, so the best step is no longer."""
    less = _best(inst)
    richer = replace(inst, hw=with_memory(inst.hw, int(inst.hw.usable_memory_bytes * more)))
    best = _best(richer)
    if less is None:
        event("nothing fits with less memory")
        return
    assert best is not None, f"fits with {inst.hw.usable_memory_bytes} bytes, not with {more}x"
    assert best.best.step_time_s <= less.best.step_time_s * (1 + REL)
    event("faster with more memory" if best.best.step_time_s < less.best.step_time_s * (1 - REL) else "as fast")


@RANDOM
@given(inst=instances(gpus=st.sampled_from((1, 2, 3, 4)), fractions=(0.45, 0.6, 1.0, 4.0)),
       extra=st.sampled_from((1, 2, 4)))
def test_more_gpus_never_make_the_best_plan_infeasible(inst: Instance, extra: int) -> None:
    """With idle GPUs allowed, every plan on n GPUs runs on n + extra: if the job fits on n it fits on more, and
    its best step is no longer."""
    space = replace(SPACE, allow_idle=True)
    fewer = _best(inst, space)
    more = _best(replace(inst, gpus=inst.gpus + extra), space)
    if fewer is None:
        event("nothing fits on the fewer GPUs")
        return
    assert more is not None, f"fits on {inst.gpus} GPUs, not on {inst.gpus + extra}"
    assert more.best.step_time_s <= fewer.best.step_time_s * (1 + REL)
    assert more.best.plan.num_gpus <= inst.gpus + extra
