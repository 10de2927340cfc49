"""The planner: enumerate outer candidates, bound them, and let CP-SAT solve the survivors' partitions.

Branch and bound over candidates. Each candidate gets a lower bound on its step time (work spread
perfectly over the stages) and a necessary memory check. Candidates are visited in order of their bound;
each is solved by CP-SAT with the current K-th best step time as a cutoff, so the solver only has to prove
"nothing better here". Once the next bound reaches that threshold every remaining candidate is pruned. If
every solve ended OPTIMAL or INFEASIBLE, the best plan is optimal over the whole space under the cost model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import InfeasibleError, SolverLimitError, SpecError
from autotune.search.partition import solve_partition
from autotune.search.space import Candidate, SearchSpace, enumerate_candidates
from autotune.search.tables import CandidateCosts, base_plan, candidate_costs, lower_bound, memory_possible
from autotune.search.validate import memory_summary, validate_plan
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import even_split
from autotune.units import SOLVER_TIME_UNIT_S, gib


@dataclass(frozen=True, slots=True)
class RunnerUp:
    """A plan that lost, and why."""

    estimate: Estimate
    reason: str


@dataclass(frozen=True, slots=True)
class SearchStats:
    candidates: int
    """Outer candidates enumerated."""
    pruned_memory: int
    """Dropped because no partition could fit in memory (necessary-condition check)."""
    pruned_bound: int
    """Dropped because their lower bound could not beat the plans already found."""
    solved: int
    """CP-SAT solves run."""
    wall_s: float


@dataclass(frozen=True, slots=True)
class PlanResult:
    best: Estimate
    status: str
    """OPTIMAL (proven over the whole space) or FEASIBLE (time limit hit first)."""
    gap: float
    """Relative gap between the best plan and the best bound left unexplored (0 when OPTIMAL)."""
    runners_up: tuple[RunnerUp, ...]
    stats: SearchStats


Progress = Callable[[int, int], None]


def strategy_key(est: Estimate) -> tuple:
    """Plans that differ only in partition, bucket or ZeRO/SP details count as one strategy for runners-up."""
    p = est.plan
    return (p.tp, p.pp, p.dp, p.cp, p.mbs, p.schedule, p.vpp, p.recompute)


def search(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, space: SearchSpace, *, top_k: int = 3,
           time_limit_s: float = 60.0, progress: Progress | None = None) -> PlanResult:
    """Find the fastest plan that fits, and prove it optimal (raises InfeasibleError / SolverLimitError)."""
    if time_limit_s <= 0:
        raise SpecError(f"--time-limit must be > 0 seconds, got {time_limit_s}")
    if gpus <= 0:
        raise SpecError(f"--gpus must be > 0, got {gpus}")
    start = time.perf_counter()
    cm = CostModel(model, hw, job)
    L = model.num_layers
    feasible, too_big = _bounded_candidates(cm, gpus, space)
    total = len(feasible) + len(too_big)
    if total == 0:
        raise InfeasibleError(_empty_space_message(gpus, space, hw))
    found: dict[tuple, Estimate] = {}
    solved = pruned_bound = 0
    status, open_bound = "OPTIMAL", math.inf
    for pos, (lb, _, cc) in enumerate(feasible):
        threshold = _threshold(found, top_k)
        if lb >= threshold:
            pruned_bound = len(feasible) - pos
            break
        remaining = time_limit_s - (time.perf_counter() - start)
        if remaining <= 0:
            status, open_bound = "FEASIBLE", lb
            break
        if progress:
            progress(pos + 1, len(feasible))
        res = solve_partition(cc, L, space.buckets, time_limit_s=remaining, cutoff=_cutoff(threshold, cc),
                              pinned=space.layers_per_stage)
        solved += 1
        if res.status in ("OPTIMAL", "FEASIBLE"):
            est = validate_plan(base_plan(cc.cand, res.layers, res.bucket, res.recompute_layers), cm, gpus,
                                allow_idle=space.allow_idle, allow_cross_node_tp=space.allow_cross_node_tp)
            key = strategy_key(est)
            if key not in found or est.step_time_s < found[key].step_time_s:
                found[key] = est
        if res.status in ("FEASIBLE", "UNKNOWN"):
            status, open_bound = "FEASIBLE", min(open_bound, lb)
    stats = SearchStats(total, len(too_big), pruned_bound, solved, time.perf_counter() - start)
    ranked = sorted(found.values(), key=lambda e: e.step_time_s)
    if not ranked:
        if status != "OPTIMAL":
            raise SolverLimitError(f"no plan found within --time-limit {time_limit_s:g} s; raise it")
        raise InfeasibleError(_infeasible_message(cm, too_big + feasible, space))
    best = ranked[0]
    gap = 0.0 if status == "OPTIMAL" else max(0.0, (best.step_time_s - open_bound) / best.step_time_s)
    runners = tuple(RunnerUp(e, f"slower by {100 * (e.step_time_s / best.step_time_s - 1):.1f}%")
                    for e in ranked[1:top_k + 1])
    runners += _memory_losers(cm, too_big, best, top_k)
    return PlanResult(best, status, gap, runners, stats)


def _bounded_candidates(cm: CostModel, gpus: int, space: SearchSpace):
    """Every candidate with its bound, split into those that may fit (sorted by bound) and those that cannot."""
    L = cm.model.num_layers
    feasible, too_big = [], []
    for idx, cand in enumerate(enumerate_candidates(cm.model, cm.job, gpus, cm.hw.gpus_per_node, space)):
        cc = candidate_costs(cm, cand)
        entry = (lower_bound(cc, L), idx, cc)
        (feasible if memory_possible(cc, L) else too_big).append(entry)
    feasible.sort(key=lambda e: (e[0], e[1]))
    too_big.sort(key=lambda e: (e[0], e[1]))
    return feasible, too_big


def _threshold(found: dict[tuple, Estimate], top_k: int) -> float:
    """Step time a candidate must beat to matter: the (K+1)-th best distinct strategy so far."""
    times = sorted(e.step_time_s for e in found.values())
    return times[top_k] if len(times) > top_k else math.inf


def _cutoff(threshold: float, cc: CandidateCosts) -> int | None:
    """The threshold in the solver's scaled objective, with slack for the rounding of its coefficients."""
    if math.isinf(threshold):
        return None
    slack = 4 * cc.cand.vpp * (cc.cand.pp + 4) * (cc.cand.num_microbatches + 2)
    return int(threshold / SOLVER_TIME_UNIT_S * cc.cand.vpp) + slack


def _min_memory_plan(cm: CostModel, c: Candidate):
    """The even split with the most recomputation the candidate allows: its smallest-memory plan."""
    layers = even_split(cm.model.num_layers, c.pp)
    if any(n % c.vpp for n in layers):
        layers = tuple([cm.model.num_layers // c.pp] * c.pp) if cm.model.num_layers % c.pp == 0 else layers
    r = max(layers) // c.vpp if c.full_max else 0
    return base_plan(c, layers, r=r)


def _memory_losers(cm: CostModel, too_big, best: Estimate, top_k: int) -> tuple[RunnerUp, ...]:
    """Candidates whose bound beat the winner but that cannot fit: which term on which stage overflows."""
    out = []
    for lb, _, cc in too_big:
        if lb >= best.step_time_s or len(out) >= top_k:
            break
        plan = _min_memory_plan(cm, cc.cand)
        if any(n % plan.vpp for n in plan.layers_per_stage):
            continue
        est = cm.estimate(plan)
        worst = max(est.stages, key=lambda s: s.memory.total)
        out.append(RunnerUp(est, f"out of memory: stage {worst.index} needs "
                                 f"{memory_summary(worst.memory.terms())} > {gib(est.usable_memory_bytes):.1f} GiB"))
    return tuple(out)


def _infeasible_message(cm: CostModel, entries, space: SearchSpace) -> str:
    """What is short and by how much, for the candidate that comes closest to fitting."""
    best = None
    for _, _, cc in entries:
        plan = _min_memory_plan(cm, cc.cand)
        if any(n % plan.vpp for n in plan.layers_per_stage):
            continue
        est = cm.estimate(plan)
        if best is None or est.peak_memory_bytes < best.peak_memory_bytes:
            best = est
    if best is None:
        return "no plan in the search space: relax the pins (--tp/--pp/--mbs/...)"
    worst = max(best.stages, key=lambda s: s.memory.total)
    fixes = ["add GPUs"]
    if space.recompute is not None and "full" not in space.recompute:
        fixes.append("allow --recompute full")
    if space.zero is not None and 3 not in space.zero:
        fixes.append("allow ZeRO-3 (--zero 3)")
    fixes.append("or a shorter --seq-len")
    return (f"no plan fits: the smallest needs {memory_summary(worst.memory.terms())} on stage {worst.index}; "
            f"{gib(best.usable_memory_bytes):.1f} GiB usable per GPU: {', '.join(fixes)}")


def _empty_space_message(gpus: int, space: SearchSpace, hw: HardwareSpec) -> str:
    pins = {k: getattr(space, k) for k in ("tp", "pp", "dp", "cp", "mbs", "vpp", "schedule", "zero")
            if getattr(space, k) is not None}
    hint = f" with pins {pins}" if pins else ""
    return (f"no valid plan for {gpus} GPUs{hint}: the degrees cannot multiply to the GPU count, divide the "
            f"heads and the batch; check --gpus, --global-batch and the pins (tp <= {hw.gpus_per_node} per node)")
