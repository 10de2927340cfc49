"""The planner: enumerate outer candidates, bound them, and let CP-SAT solve the survivors' partitions.

Branch and bound over candidates, visited in order of a lower bound on their step time from a heap. Each
visit sharpens the candidate's bound and puts it back, so work goes only to the most promising one left:
1. every candidate starts with a coarse bound from its per-layer costs and a necessary memory check
   (coarse.coarse_bounds: a block of candidates at once over arrays, microseconds each once their layer
   shapes are costed);
2. first visit: quick_bound (the work spread perfectly over the stages, the syncs, Adam);
3. second visit: its per-stage terms, the memory check of its stage ranges and a refined bound (the
   recomputation memory forces, the memory-capped stage time, the pivot paths of the schedule);
4. with data-parallel syncs, a third visit: the pivot paths again, each with what its stage's sync and Adam
   step add (pivots.pivot_path_floor with_step: the pipeline and the sync bounded together);
5. next visit: its even and balanced splits are timed by the cost model (search/baseline.py). The faster
   is the candidate's incumbent: when it reaches the bound the candidate is solved without CP-SAT; otherwise
   it goes back with the pipeline and the syncs bounded as a sum (search/joint.py: what CP-SAT's relaxation
   would prove, in milliseconds; most candidates stop here once a good plan is known);
6. next visit: CP-SAT solves the relaxation of its partition problem (pivot paths only) from that hint, with
   the best step time known so far (never above the incumbent) as a cutoff, so the solver only has to prove
   "nothing better here"; a candidate whose relaxed plan is not exact goes back with the relaxation's bound
   and, if it is still the most promising, gets the exact loop (search/partition.py).
When the smallest bound left reaches the best plan known, every remaining candidate is pruned. If every solve
ended OPTIMAL or INFEASIBLE, the best plan is optimal over the whole space under the cost model.

The answer depends only on the inputs: the order of visits and every bound are pure functions of them, and
CP-SAT runs one worker with a fixed seed under a deterministic work budget shared by the whole search
(search/budget.py): when it runs out, the best plan known comes back. The wall-clock --time-limit is a safety net
only: if it strikes, the result says so (`limit`). No returned plan is slower than its candidate's even split.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import InfeasibleError, SolverLimitError, SpecError
from autotune.search.baseline import baseline_plans
from autotune.search.bounds import forced_recompute_s, memory_possible, quick_bound, stage_time_floor
from autotune.search.budget import Budget
from autotune.search.coarse import coarse_bounds
from autotune.search.joint import pipe_sync_floor
from autotune.search.pivots import pivot_path_floor
from autotune.search.losers import RunnerUp, empty_space_message, infeasible_message, memory_losers
from autotune.search.partition import FirstSolve, Hint, solve_partition
from autotune.search.space import Candidate, SearchSpace, bucket_menu, enumerate_candidates, pinned_layers
from autotune.search.tables import CandidateCosts, candidate_costs, to_plan
from autotune.search.validate import validate_plan
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.profile import Profile
from autotune.units import SOLVER_TIME_UNIT_S

#: CP-SAT deterministic time one search may spend (search/budget.py), what stops an unfinished search: three
#: times what the hardest case of the README needs (llama3-70b on 16384 GPUs with 16 micro-batches, about 10),
#: and a few minutes of one core. An unfinished search returns its best plan, the same on every machine.
DEFAULT_WORK_LIMIT = 30.0
#: The wall-clock safety net (--time-limit): well past what DEFAULT_WORK_LIMIT takes on a slow, busy core,
#: so that the work limit, not the machine, decides what is returned.
DEFAULT_TIME_LIMIT_S = 600.0

COARSE, QUICK, REFINED, JOINT, SUMMED, EXACT = range(6)
"""How far a heap entry's bound has been sharpened (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class SearchStats:
    candidates: int
    """Outer candidates enumerated."""
    pruned_bound: int
    """Dropped because their lower bound could not beat the plans already found, or settled without CP-SAT
    because their even or balanced split reached their bound."""
    pruned_memory: int
    """Dropped because no partition can fit in memory (necessary-condition check)."""
    solved: int
    """CP-SAT solves run."""
    wall_s: float
    work: float = 0.0
    """CP-SAT deterministic time spent (the same on every machine)."""


@dataclass(frozen=True, slots=True)
class PlanResult:
    best: Estimate
    status: str
    """OPTIMAL (proven over the whole space) or FEASIBLE (a limit struck first)."""
    gap: float
    """Relative gap between the best plan and the smallest bound left unexplored (0 when OPTIMAL)."""
    runners_up: tuple[RunnerUp, ...]
    stats: SearchStats
    limit: str = ""
    """What stopped the search early: '' (nothing), 'work' (the deterministic work limit: the same answer on
    every machine) or 'time' (the wall-clock --time-limit: the answer may depend on the machine)."""
    runners_up_cut: bool = False
    """The runners-up search stopped at its visit cap while a closer strategy may remain unvisited."""


@dataclass(frozen=True, slots=True)
class SearchProgress:
    """Where a search stands, for a progress bar."""

    candidates: int
    solves: int
    """CP-SAT solves so far."""
    best_s: float
    """Step time of the best plan known (inf: none yet)."""
    bound_s: float
    """The smallest lower bound left: the search ends when it reaches best_s."""


Progress = Callable[[SearchProgress], None]
"""Called before each CP-SAT solve and every few hundred candidates visited."""


def candidate_key(c: Candidate) -> tuple:
    """Candidates that differ only in ZeRO stage, SP or vocabulary pin count as one strategy: the runners-up
    list the best plan of each distinct strategy."""
    return (c.tp_mode, c.tp, c.pp, c.dp, c.cp, c.mbs, c.schedule, c.vpp, c.base, c.ep, c.etp, c.ep_overlap)


def search(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, space: SearchSpace, *, top_k: int = 3,
           time_limit_s: float = DEFAULT_TIME_LIMIT_S, work_limit: float = DEFAULT_WORK_LIMIT,
           progress: Progress | None = None, profile: Profile | None = None,
           cost_model: CostModel | None = None) -> PlanResult:
    """Find the fastest plan that fits, and prove it optimal (raises InfeasibleError / SolverLimitError).
    `work_limit`: CP-SAT deterministic time for the whole search; `time_limit_s`: the wall-clock safety net;
    `profile`: measured op and link costs for the cost model (costmodel/measured.py); `cost_model`: one built
    from the same model, hardware, job and profile (a sweep shares it between sizes: it knows no GPU count)."""
    for bad, message in ((not time_limit_s > 0, f"--time-limit must be > 0 seconds, got {time_limit_s}"),  # NaN too
                         (not work_limit > 0, f"--work-limit must be > 0, got {work_limit}"),
                         (gpus <= 0, f"--gpus must be > 0, got {gpus}"),
                         (top_k < 0, f"--top must be >= 0, got {top_k}")):
        if bad:
            raise SpecError(message)
    start = time.perf_counter()
    budget = Budget.from_limits(work_limit, time_limit_s)
    cm = CostModel(model, hw, job, profile) if cost_model is None else cost_model
    cands = list(enumerate_candidates(model, job, gpus, hw.gpus_per_node, space))
    if not cands:
        raise InfeasibleError(empty_space_message(gpus, space, hw))
    run = _Search(cm, cands, space, gpus, budget, top_k)
    run.prove(progress)
    if run.best is not None and run.open_bound == math.inf:
        run.runners_up(top_k)
    return run.result(top_k, time.perf_counter() - start, time_limit_s)


#: Candidates the runners-up search may visit (RUNNER_VISITS_EACH per runner-up asked, at least RUNNER_VISITS: 5000
#: left out of llama3-8b/64's --top 50 a plan 2% faster than its 47th), and CP-SAT solves it may run
RUNNER_VISITS, RUNNER_VISITS_EACH, RUNNER_SOLVES = 5000, 1000, 8
#: Candidates coarse-bounded between two looks at the wall clock (ms; ~50 for an MoE model's first block's layers)
COARSE_BLOCK = 2048


class _Search:
    """The state of one search: the heap of candidates, the plans found, what is left unproven."""

    def __init__(self, cm: CostModel, cands: list[Candidate], space: SearchSpace, gpus: int, budget: Budget,
                 top_k: int) -> None:
        self.cm, self.cands, self.space, self.gpus, self.budget, self.top_k = cm, cands, space, gpus, budget, top_k
        self.L = cm.model.num_layers
        self.memo: dict = {}  # sync bounds shared between candidates of this search
        self.coarse_memo: dict = {}
        self.may_fit: list[bool] = []
        # (bound, index, level, costs): the index breaks ties, so the order never reaches the costs
        self.heap: list[tuple[float, int, int, CandidateCosts | None]] = []
        self.unbounded = 0
        """The first candidate not coarse-bounded yet (len(cands) once all are)."""
        # bounding a large space takes seconds; once the wall clock strikes, the rest wait outside the heap and are
        # bounded a block at a time only if the bounded ones give no plan (prove), so a plan still comes back soon
        while self.unbounded < len(cands) and not budget.clock_struck():
            self._bound_block()
        heapq.heapify(self.heap)
        self.found: dict[tuple, Estimate] = {}
        """Per strategy: the fastest plan met on the way (the solver's, or an even or balanced split)."""
        self.best: Estimate | None = None
        """The fastest plan of all."""
        self.own: dict[int, tuple[Estimate, Hint]] = {}
        """Per candidate: the fastest complete plan known for it, and the same as a hint for its solves."""
        self.relaxed: dict[int, FirstSolve] = {}
        """Per candidate back on the heap for the exact loop: the solve of its relaxation."""
        self.paths: dict[tuple, list[dict]] = {}
        """Per schedule graph: the critical paths the solves met, cuts for every candidate with that graph."""
        self.too_big: list[tuple[float, int]] = []
        self.solved = 0
        self.open_bound = math.inf  # the smallest bound of a candidate left without proof
        self.runners_cut = False

    def _bound_block(self) -> None:
        """Coarse-bound the next COARSE_BLOCK candidates onto the heap."""
        i = self.unbounded
        block = coarse_bounds(self.cm, self.cands[i:i + COARSE_BLOCK], self.coarse_memo)
        self.may_fit += [fits for _, fits in block]
        for idx, (lb, _) in enumerate(block, start=i):
            heapq.heappush(self.heap, (lb, idx, COARSE, None))
        self.unbounded = i + len(block)

    def _buckets(self, c: Candidate) -> tuple[int, ...]:
        return bucket_menu(self.space, self.cm.job.trainer, c.dp)

    def threshold(self) -> float:
        """Step time a candidate must beat to matter: the best plan known."""
        return math.inf if self.best is None else self.best.step_time_s

    def prove(self, progress: Progress | None) -> None:
        """Visit candidates in bound order until none left can beat the best plan, or a limit strikes."""
        visits = 0
        while self.heap or self.unbounded < len(self.cands):
            if not self.heap:  # the clock struck while bounding, and no bounded candidate gave a plan
                self._bound_block()
                continue
            lb, idx, level, cc = self.heap[0]
            if lb >= self.threshold():
                break
            if self.best is not None and self.budget.exhausted:
                self.open_bound = min(self.open_bound, lb)
                break
            heapq.heappop(self.heap)
            visits += 1
            if progress and (level >= REFINED or visits % 256 == 0):
                progress(SearchProgress(len(self.cands), self.solved, self.threshold(), lb))
            if level == COARSE:
                self._sharpen(lb, idx)
            elif level == QUICK:
                self._refine(lb, idx)
            elif level == REFINED and cc.syncs:
                joint = pivot_path_floor(cc, self.L, with_step=True)
                heapq.heappush(self.heap, (max(lb, joint), idx, JOINT, cc))
            elif level < SUMMED and self._baseline(lb, idx, cc):
                continue
            elif level < SUMMED and (summed := pipe_sync_floor(cc, self.L, self.threshold())) > lb:
                heapq.heappush(self.heap, (summed, idx, SUMMED, cc))
            else:
                self._solve(lb, idx, cc, exact=level == EXACT)
        if self.unbounded < len(self.cands):  # never bounded (the clock struck): only the trivial bound 0 holds
            self.open_bound = 0.0

    def _sharpen(self, lb: float, idx: int) -> None:
        """First visit: the memory check of the coarse bound, then quick_bound."""
        if not self.may_fit[idx]:
            self.too_big.append((lb, idx))
            return
        bound = quick_bound(self.cm, self.cands[idx], self._buckets(self.cands[idx]), memo=self.memo)
        heapq.heappush(self.heap, (max(lb, bound), idx, QUICK, None))

    def _refine(self, lb: float, idx: int) -> None:
        """Second visit: per-stage terms, memory check of the stage ranges, refined bound."""
        cc = candidate_costs(self.cm, self.cands[idx], self._buckets(self.cands[idx]))
        if not memory_possible(cc, self.L):
            self.too_big.append((lb, idx))
            return
        terms = (self.cm, cc.cand, self._buckets(cc.cand), forced_recompute_s(cc, self.L), stage_time_floor(cc, self.L))
        # The pivot paths (a tenth of a millisecond) only sharpen the bound. A candidate whose bound reaches the best
        # plan without them is never visited again by prove (its bound stays above the threshold, which only falls):
        # it needs them only if runners-up are wanted, whose search visits the rest in the order of their bounds.
        refined = quick_bound(*terms, memo=self.memo)
        if self.top_k or max(lb, refined) < self.threshold():
            refined = quick_bound(*terms, memo=self.memo, pipe_floor=pivot_path_floor(cc, self.L))
        heapq.heappush(self.heap, (max(lb, refined), idx, REFINED, cc))

    def _baseline(self, lb: float, idx: int, cc: CandidateCosts) -> bool:
        """Before CP-SAT: time the even and balanced splits; True when the faster reaches the bound (the
        candidate is then solved: no partition can beat it)."""
        plans = baseline_plans(self.cm, cc, self.gpus, pinned=pinned_layers(self.space, cc.cand.pp, self.L),
                               allow_idle=self.space.allow_idle, allow_cross_node_tp=self.space.allow_cross_node_tp)
        if not plans:
            return False
        est, hint = plans[0]
        self._offer(idx, est, hint)
        return est.step_time_s <= lb

    def _solve(self, lb: float, idx: int, cc: CandidateCosts, *, exact: bool) -> None:
        """CP-SAT on the candidate's partition: the relaxation first, the exact loop when it comes back."""
        if self.budget.exhausted:  # no plan known yet (else prove() stops): keep looking for one without CP-SAT
            self.open_bound = min(self.open_bound, lb)
            return
        threshold = self.threshold()
        own = self.own.get(idx)
        res = solve_partition(cc, self.L, budget=self.budget, cutoff=_cutoff(threshold, cc.cand),
                              pinned=pinned_layers(self.space, cc.cand.pp, self.L), exact=exact,
                              hint=own[1] if own else None, first=self.relaxed.pop(idx, None),
                              known=tuple(self.paths.get(_graph(cc), ())))
        self.solved += 1
        pool = self.paths.setdefault(_graph(cc), [])
        pool += [path for i, path in enumerate(res.met) if path not in pool and path not in res.met[:i]]
        if res.status == "RELAXED":  # back on the heap with the relaxation's bound, for the exact loop
            heapq.heappush(self.heap, (max(lb, res.bound * SOLVER_TIME_UNIT_S), idx, EXACT, cc))
            self.relaxed[idx] = res.first
        if res.status in ("OPTIMAL", "FEASIBLE", "RELAXED"):
            self._offer(idx, self._validated(cc, res), Hint(res.chunk_values[0], res.recompute_layers, res.bucket))
        if res.status in ("FEASIBLE", "UNKNOWN"):
            self.open_bound = min(self.open_bound, lb)

    def _offer(self, idx: int, est: Estimate, hint: Hint) -> None:
        """A complete plan of candidate idx: its hint if it is the candidate's fastest, its strategy's entry if
        it is the strategy's, the best plan if it is the fastest of all."""
        if idx not in self.own or _rank(est) < _rank(self.own[idx][0]):
            self.own[idx] = (est, hint)
        key = candidate_key(self.cands[idx])
        if key not in self.found or _rank(est) < _rank(self.found[key]):
            self.found[key] = est
        if self.best is None or _rank(est) < _rank(self.best):
            self.best = est

    def _validated(self, cc: CandidateCosts, res) -> Estimate:
        """The solver's plan for candidate cc, re-checked by validate_plan (which never calls the solver)."""
        return validate_plan(to_plan(cc.cand, res.layers, res.bucket, res.recompute_layers), self.cm, self.gpus,
                             allow_idle=self.space.allow_idle, allow_cross_node_tp=self.space.allow_cross_node_tp)

    def runners_up(self, top_k: int) -> None:
        """After the proof: visit candidates in bound order while one may still enter the top_k runners-up (bound
        below the top_k-th other strategy found and its own strategy's entry), up to the visit cap (runners_cut
        says it struck first) within the work budget. Each is timed on its even and balanced splits; one that would
        then be the first runner-up is solved (at most RUNNER_SOLVES): its candidate's best partition. What is
        visited, timed and solved does not depend on top_k, only where the visits stop: a longer list extends a
        shorter one (mixtral-8x7b on 64 H100s, --top 1 once showed one 291% slower)."""
        solves = visits = 0
        cap = max(RUNNER_VISITS, RUNNER_VISITS_EACH * top_k)
        while self.heap and top_k and visits < cap and not self.budget.exhausted:
            lb, idx, level, cc = self.heap[0]
            if lb >= self._kth_runner_up(top_k):
                break
            heapq.heappop(self.heap)
            visits += 1
            c = self.cands[idx]
            entry = self.found.get(candidate_key(c))
            if entry is not None and lb >= entry.step_time_s:  # cannot improve its strategy's entry
                continue
            if level == COARSE:  # sharpen its bound first, as prove does: most then fall behind the top_k
                self._sharpen(lb, idx)
                continue
            if level == QUICK:
                self._refine(lb, idx)
                continue
            if level < SUMMED and self._baseline(lb, idx, cc):
                continue  # its split reaches its bound: no partition does better
            own = self.own.get(idx)
            if solves >= RUNNER_SOLVES or (own is not None and own[0].step_time_s > self._kth_runner_up(1)):
                continue  # a plan behind the first runner-up keeps its even or balanced split
            res = solve_partition(cc, self.L, budget=self.budget,
                                  cutoff=_cutoff(own[0].step_time_s, c) if own else None,
                                  pinned=pinned_layers(self.space, c.pp, self.L), hint=own[1] if own else None)
            solves += 1
            if res.status in ("OPTIMAL", "FEASIBLE"):
                self._offer(idx, self._validated(cc, res), Hint(res.chunk_values[0], res.recompute_layers,
                                                                res.bucket))
        self.solved += solves
        self.runners_cut = visits >= cap and bool(self.heap) and self.heap[0][0] < self._kth_runner_up(top_k)

    def _kth_runner_up(self, top_k: int) -> float:
        """Step time of the top_k-th fastest strategy found besides the best plan's (inf while fewer)."""
        others = sorted(e.step_time_s for e in self.found.values() if e is not self.best)
        return others[top_k - 1] if len(others) >= top_k else math.inf

    def result(self, top_k: int, wall_s: float, time_limit_s: float) -> PlanResult:
        stats = SearchStats(len(self.cands), len(self.cands) - len(self.too_big) - self.solved, len(self.too_big),
                            self.solved, wall_s, self.budget.spent)
        if self.best is None:
            if self.open_bound < math.inf:
                what = (f"--time-limit {time_limit_s:g} s; raise it" if self.budget.timed_out
                        else "the work limit; raise --work-limit")
                raise SolverLimitError(f"no plan found within {what}")
            too_big = [self.cands[i] for _, i in self.too_big] or self.cands
            raise InfeasibleError(infeasible_message(self.cm, too_big, self.space))
        best = self.best
        ranked = sorted(self.found.values(), key=_rank)
        # Optimal when no candidate left without proof could beat the best (runners-up may then be incomplete).
        status = "OPTIMAL" if self.open_bound >= best.step_time_s else "FEASIBLE"
        gap = 0.0 if status == "OPTIMAL" else (best.step_time_s - self.open_bound) / best.step_time_s
        runners = tuple(RunnerUp(e, f"slower by {100 * (e.step_time_s / best.step_time_s - 1):.1f}%")
                        for e in ranked[1:top_k + 1])
        runners += memory_losers(self.cm, [(lb, self.cands[i]) for lb, i in self.too_big], best, top_k,
                                 self.space.layers_per_stage)
        limit = "time" if self.budget.timed_out else ("work" if self.budget.stopped or status != "OPTIMAL" else "")
        return PlanResult(best, status, gap, runners, stats, limit, self.runners_cut)


def _rank(est: Estimate) -> tuple:
    """Faster first; between plans of equal step time, simpler plans first (a deterministic tie-break)."""
    p = est.plan
    return (est.step_time_s, p.pp, p.tp, p.cp, p.vpp, p.mbs, p.zero, not p.sequence_parallel, p.recompute,
            p.layers_per_stage, p.bucket_size, p.schedule, p.tp_mode, p.tp_overlap, p.vocab,
            -1 if p.recompute_layers is None else p.recompute_layers)


def _graph(cc: CandidateCosts) -> tuple:
    """What a pipeline schedule's graph of passes depends on (costmodel/critical.py)."""
    c = cc.cand
    return c.schedule, c.pp, c.vpp, c.num_microbatches, cc.ticks


def _cutoff(threshold: float, c: Candidate) -> int | None:
    """The threshold in the solver's scaled objective, with slack for the rounding of its coefficients."""
    if math.isinf(threshold):
        return None
    slack = 4 * (c.pp + 4) * (c.num_microbatches + 2) * 3 * max(c.vpp, 2)
    return int(threshold / SOLVER_TIME_UNIT_S) + slack
