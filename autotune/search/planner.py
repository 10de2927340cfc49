"""The planner: enumerate outer candidates, bound them, and let CP-SAT solve the survivors' partitions.

Branch and bound over candidates. Each candidate gets an O(1) lower bound on its step time (work spread
perfectly over the stages). Candidates are visited in order of their bound from a heap; on its first visit a
candidate gets its per-stage terms, a necessary memory check and a refined bound (the recomputation memory
forces and the pivot paths of the schedule allow) and goes back on the heap; on its second CP-SAT solves the
relaxation of its partition problem (the pivot paths only) with the best step time so far as a cutoff, so the
solver only has to prove "nothing better here"; a candidate whose relaxed plan is not exact goes back with the
relaxation's bound and, if it is still the most promising, gets the exact loop (search/partition.py). When the
smallest bound left reaches the best plan, every remaining candidate is pruned. If every solve ended OPTIMAL
or INFEASIBLE, the best plan is optimal over the whole space under the cost model (the simulated step time).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import InfeasibleError, SolverLimitError, SpecError
from autotune.search.partition import solve_partition
from autotune.search.space import Candidate, SearchSpace, enumerate_candidates
from autotune.search.bounds import (forced_recompute_s, memory_possible, pivot_path_floor, quick_bound,
                                    stage_time_floor)
from autotune.search.tables import candidate_costs, to_plan
from autotune.search.validate import memory_summary, validate_plan
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import even_split
from autotune.specs.profile import Profile
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
    pruned_bound: int
    """Dropped because their lower bound could not beat the plans already found."""
    pruned_memory: int
    """Dropped because no partition can fit in memory (necessary-condition check)."""
    solved: int
    """CP-SAT solves run."""
    wall_s: float


@dataclass(frozen=True, slots=True)
class PlanResult:
    best: Estimate
    status: str
    """OPTIMAL (proven over the whole space) or FEASIBLE (time limit hit first)."""
    gap: float
    """Relative gap between the best plan and the smallest bound left unexplored (0 when OPTIMAL)."""
    runners_up: tuple[RunnerUp, ...]
    stats: SearchStats


Progress = Callable[[int, int], None]


def candidate_key(c: Candidate) -> tuple:
    """Candidates that differ only in ZeRO stage, SP or vocabulary pin count as one strategy: the runners-up
    list the best plan of each distinct strategy."""
    return (c.tp_mode, c.tp, c.pp, c.dp, c.cp, c.mbs, c.schedule, c.vpp, c.base)


def search(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, space: SearchSpace, *, top_k: int = 3,
           time_limit_s: float = 60.0, progress: Progress | None = None, profile: Profile | None = None) -> PlanResult:
    """Find the fastest plan that fits, and prove it optimal (raises InfeasibleError / SolverLimitError).
    `profile`: measured op and link costs for the cost model (costmodel/measured.py)."""
    if not time_limit_s > 0:  # also rejects NaN
        raise SpecError(f"--time-limit must be > 0 seconds, got {time_limit_s}")
    if gpus <= 0:
        raise SpecError(f"--gpus must be > 0, got {gpus}")
    if top_k < 0:
        raise SpecError(f"--top must be >= 0, got {top_k}")
    start = time.perf_counter()
    cm = CostModel(model, hw, job, profile)
    L = model.num_layers
    cands = list(enumerate_candidates(model, job, gpus, hw.gpus_per_node, space))
    if not cands:
        raise InfeasibleError(_empty_space_message(gpus, space, hw))
    memo: dict = {}  # sync bounds shared between candidates of this search
    # (bound, index, costs, exact): costs None = not visited; exact False = the relaxation comes first
    heap = [(quick_bound(cm, c, space.buckets, memo=memo), idx, None, False) for idx, c in enumerate(cands)]
    heapq.heapify(heap)
    found: dict[tuple, Estimate] = {}
    too_big: list[tuple[float, int]] = []
    solved = 0
    open_bound = math.inf  # the smallest bound of a candidate left without proof
    while heap:
        lb, idx, cc, exact = heap[0]
        threshold = _best_so_far(found)
        if lb >= threshold:
            break
        heapq.heappop(heap)
        if cc is None:  # first visit: per-stage terms, memory check, refined bound
            cc = candidate_costs(cm, cands[idx], space.buckets)
            if not memory_possible(cc, L):
                too_big.append((lb, idx))
                continue
            refined = quick_bound(cm, cands[idx], space.buckets, forced_recompute_s(cc, L), stage_time_floor(cc, L),
                                  memo=memo, pipe_floor=pivot_path_floor(cc, L))
            heapq.heappush(heap, (max(lb, refined), idx, cc, False))
            continue
        key = candidate_key(cc.cand)
        if key in found and found[key].step_time_s <= lb:
            continue  # this strategy already has a plan no better variant of it could beat
        remaining = time_limit_s - (time.perf_counter() - start)
        if remaining <= 0:
            open_bound = min(open_bound, lb)
            break
        if progress:
            progress(solved + 1, len(cands))
        res = solve_partition(cc, L, time_limit_s=remaining, cutoff=_cutoff(threshold, cc.cand),
                              pinned=space.layers_per_stage, exact=exact)
        solved += 1
        if res.status == "RELAXED":  # back on the heap with the relaxation's bound, for the exact loop
            heapq.heappush(heap, (max(lb, res.bound * SOLVER_TIME_UNIT_S), idx, cc, True))
        if res.status in ("OPTIMAL", "FEASIBLE", "RELAXED"):
            est = _validated(cm, cc, res, gpus, space)
            if key not in found or est.step_time_s < found[key].step_time_s:
                found[key] = est
        if res.status in ("FEASIBLE", "UNKNOWN"):
            open_bound = min(open_bound, lb)
    if found and open_bound == math.inf:
        solved += _runners_up(cm, cands, heap, found, too_big, top_k, space, gpus, L,
                              time_limit_s - (time.perf_counter() - start))
    stats = SearchStats(len(cands), len(cands) - len(too_big) - solved, len(too_big), solved,
                        time.perf_counter() - start)
    ranked = sorted(found.values(), key=lambda e: (e.step_time_s, _plan_order(e)))
    if not ranked:
        if open_bound < math.inf:
            raise SolverLimitError(f"no plan found within --time-limit {time_limit_s:g} s; raise it")
        raise InfeasibleError(_infeasible_message(cm, [cands[i] for _, i in too_big] or cands, space))
    best = ranked[0]
    # Optimal when no candidate left without proof could beat the best (runners-up may then be incomplete).
    status = "OPTIMAL" if open_bound >= best.step_time_s else "FEASIBLE"
    gap = 0.0 if status == "OPTIMAL" else (best.step_time_s - open_bound) / best.step_time_s
    runners = tuple(RunnerUp(e, f"slower by {100 * (e.step_time_s / best.step_time_s - 1):.1f}%")
                    for e in ranked[1:top_k + 1])
    runners += _memory_losers(cm, [(lb, cands[i]) for lb, i in too_big], best, top_k, space.layers_per_stage)
    return PlanResult(best, status, gap, runners, stats)


def _runners_up(cm: CostModel, cands: list[Candidate], heap: list, found: dict[tuple, Estimate], too_big: list,
                top_k: int, space: SearchSpace, gpus: int, L: int, time_left_s: float) -> int:
    """After the proof: solve the most promising candidates of strategies not met yet, in bound order, until
    top_k of them have a plan (each is the best partition of its candidate, not necessarily of its strategy);
    returns the solves run."""
    solves = 0
    deadline = time.perf_counter() + max(time_left_s, 0.0)
    while heap and len(found) <= top_k and solves < 4 * top_k and time.perf_counter() < deadline:
        lb, idx, cc, _ = heapq.heappop(heap)
        key = candidate_key(cands[idx])
        if key in found:
            continue
        if cc is None:
            cc = candidate_costs(cm, cands[idx], space.buckets)
            if not memory_possible(cc, L):
                too_big.append((lb, idx))
                continue
        res = solve_partition(cc, L, time_limit_s=deadline - time.perf_counter(), pinned=space.layers_per_stage)
        solves += 1
        if res.status in ("OPTIMAL", "FEASIBLE"):
            found[key] = _validated(cm, cc, res, gpus, space)
    return solves


def _validated(cm: CostModel, cc, res, gpus: int, space: SearchSpace) -> Estimate:
    """The solver's plan for candidate cc, re-checked by validate_plan (which never calls the solver)."""
    return validate_plan(to_plan(cc.cand, res.layers, res.bucket, res.recompute_layers), cm, gpus,
                         allow_idle=space.allow_idle, allow_cross_node_tp=space.allow_cross_node_tp)


def _plan_order(est: Estimate) -> tuple:
    """Deterministic tie-break between plans of equal step time: simpler plans first."""
    p = est.plan
    return (p.pp, p.tp, p.cp, p.vpp, p.mbs, p.zero, not p.sequence_parallel, p.recompute, p.layers_per_stage,
            p.bucket_size)


def _best_so_far(found: dict[tuple, Estimate]) -> float:
    """Step time a candidate must beat to matter. The proof is about the winner; the runners-up are the best
    plans of the other strategies the search solved on its way (proving each of them the best of its strategy
    too cost 4x the search time once zero-bubble and V-shaped schedules and vocabulary parallelism multiplied
    the strategies within a few percent of each other)."""
    return min((e.step_time_s for e in found.values()), default=math.inf)


def _cutoff(threshold: float, c: Candidate) -> int | None:
    """The threshold in the solver's scaled objective, with slack for the rounding of its coefficients."""
    if math.isinf(threshold):
        return None
    slack = 4 * (c.pp + 4) * (c.num_microbatches + 2) * 3 * max(c.vpp, 2)
    return int(threshold / SOLVER_TIME_UNIT_S) + slack


def _min_memory_plan(cm: CostModel, c: Candidate, pinned: tuple[int, ...] | None = None):
    """The even split (or the pinned one) with the most recomputation the candidate allows: about its
    smallest-memory plan."""
    L = cm.model.num_layers
    if pinned is not None:
        return to_plan(c, pinned, r=max(pinned) // c.vpp if c.full_max else 0) if len(pinned) == c.pp else None
    layers = even_split(L, c.pp)
    if any(n % c.vpp for n in layers):
        if L % (c.pp * c.vpp):
            return None
        layers = (L // c.pp,) * c.pp
    return to_plan(c, layers, r=max(layers) // c.vpp if c.full_max else 0)


def _memory_losers(cm: CostModel, too_big: list[tuple[float, Candidate]], best: Estimate, top_k: int,
                   pinned: tuple[int, ...] | None) -> tuple[RunnerUp, ...]:
    """Candidates whose bound beat the winner but that cannot fit: which terms overflow on which stage."""
    out = []
    for lb, c in sorted(too_big, key=lambda e: e[0]):
        if lb >= best.step_time_s or len(out) >= top_k:
            break
        plan = _min_memory_plan(cm, c, pinned)
        if plan is None:
            continue
        est = cm.estimate(plan)
        worst = max(est.stages, key=lambda s: s.memory.total)
        out.append(RunnerUp(est, f"out of memory: stage {worst.index} needs "
                                 f"{memory_summary(worst.memory.terms())} > {gib(est.usable_memory_bytes):.1f} GiB"))
    return tuple(out)


def _infeasible_message(cm: CostModel, cands: list[Candidate], space: SearchSpace) -> str:
    """What is short and by how much, for the candidate that comes closest to fitting."""
    best = None
    for c in cands:
        plan = _min_memory_plan(cm, c, space.layers_per_stage)
        if plan is None:
            continue
        est = cm.estimate(plan)
        if best is None or est.peak_memory_bytes < best.peak_memory_bytes:
            best = est
    if best is None:
        return "no plan in the search space fits: relax the pins (--tp/--pp/--mbs/--layers-per-stage)"
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
    return (f"no valid plan for {gpus} GPUs{hint}: the degrees must multiply to the GPU count and divide the "
            f"heads and the batch; check --gpus, --global-batch and the pins (tp <= {hw.gpus_per_node} per node)")
