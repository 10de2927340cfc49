"""CP-SAT model of the inner problem: for one outer candidate, choose the layers of every pipeline stage,
how many layers per chunk run under full recomputation and the gradient bucket size, minimizing the step
time subject to every stage's memory.

Layout after the cpsat-primer: instance (CandidateCosts) -> variables -> constraint groups -> objective ->
solve -> read back. Times are scaled to integers once (units.to_solver_time); memory stays in whole bytes.
The objective is the step time: pipeline + sync + adam + tied. Every chunk's pass durations are linear in
the chunks' worth of layers k_i (n_i = vpp*k_i) and the recomputed layers rc_i: F = k_i*f + F_i,
B = k_i*b + rc_i*d + B_i, W = k_i*w + W_i. The pipeline time is the longest path through the schedule's
passes (costmodel/pipeline.py), a maximum over exponentially many paths, each linear in those durations. So
it is modelled lazily: pipe >= length of a path, for a small set of paths; solve; simulate the solution; if
its critical path is longer than `pipe`, add that path and solve again. Each added path is a valid lower
bound for every partition, so when an optimal solution's critical path is already in the set, it is optimal
for the exact (simulated) pipeline time. Later rounds also require beating the best plan found and stop at
their first solution (a new cut or a better plan); the loop ends when none is left (INFEASIBLE: the proof),
as proving each round's relaxation optimal is work the next cut throws away (llama3-70b on 16384 H100s,
the winner's loop: 8 rounds in 2.8 s -> 9 in 0.8 s, the same plan). A first solution's sync and Adam terms may
sit above their least (nothing minimizes them): the proof is unaffected. Each bucketed sync is max(one bucket, max_i
(bytes_i/B)*c - window_i - slack_i), linear per bucket choice.

Every solve is deterministic: one worker, a fixed seed, and work limits counted in conflicts and in CP-SAT's
deterministic time (a measure of work done, the same on every machine), drawn from the search's Budget
(search/budget.py). The wall clock never reaches CP-SAT: it is read between solves, only to stop a search as
a safety net, and the search then says so.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autotune.costmodel.pipeline import SPLIT_BACKWARD
from autotune.search.budget import Budget
from autotune.search.cpsat import cp_model as import_cp_model
from autotune.search.cuts import Coefficients, neighbour_paths, partition_critical_path, pass_coefficients
from autotune.search.partition_terms import adam_term, dp_sync, memory_constraints
from autotune.search.tables import CandidateCosts, chunk_range
from autotune.units import to_solver_time

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


@dataclass(frozen=True, slots=True)
class PartitionResult:
    status: str
    """OPTIMAL, FEASIBLE, INFEASIBLE (nothing fits, or nothing beats the cutoff), UNKNOWN (work or time limit)
    or RELAXED (exact=False: the relaxation is solved, `bound` holds, the plan may not be the optimum)."""
    layers: tuple[int, ...] = ()
    recompute_layers: int = 0
    bucket: int = 0
    objective: int = 0
    chunk_values: tuple = ((), ())
    """(k_i, rc_i) of the solution, for simulating it."""
    pipe: int = 0
    """The solver's pipeline-time variable at the solution."""
    bound: int = 0
    """A proven lower bound on the candidate's objective (0: none)."""
    first: FirstSolve | None = None
    """RELAXED: the solve it ran, for the exact loop of the same candidate to start from (FirstSolve)."""
    met: tuple[dict, ...] = ()
    """The critical paths of the partitions its solves returned (cuts for other candidates: solve_partition)."""


@dataclass(frozen=True, slots=True)
class Hint:
    """A complete solution to start from (the planner's even or balanced split)."""

    chunks: tuple[int, ...]
    """k_i: chunks' worth of layers per stage."""
    recompute_layers: int
    bucket: int


@dataclass(frozen=True, slots=True)
class FirstSolve:
    """What a relaxation (exact=False) leaves the exact loop of its candidate. Its one solve is also the loop's
    first when the loop runs with the same cutoff and hint: the model is then the same, and a solve is
    deterministic, so the loop takes its result instead of solving again (the exact loops of llama3-70b on 8192
    and 16384 GPUs spent 1.1 s repeating them). Otherwise (a better plan or hint came since) the loop starts
    from its cuts, which bound every partition of the candidate whatever the model: without them the loop found
    again what the relaxation had cut off (16384 GPUs, pp32: two solves, 2 s -> one, 0.6 s)."""

    cutoff: int | None
    hint: Hint | None
    found: PartitionResult
    work: float
    """The deterministic time it spent."""
    cuts: tuple[dict, ...]
    """The paths of the relaxation and those its solution adds (its critical path and its neighbours')."""

    def replays(self, cutoff: int | None, hint: Hint | None, budget: Budget) -> bool:
        """Whether solving again would give `found`: the same model, and every attempt of _solve under the same
        work cap (the budget leaves each of them per_solve, now as then)."""
        return self.cutoff == cutoff and self.hint == hint and budget.work >= budget.per_solve + self.work


def solve_partition(cc: CandidateCosts, num_layers: int, *, budget: Budget | None = None, cutoff: int | None = None,
                    pinned: tuple[int, ...] | None = None, exact: bool = True, hint: Hint | None = None,
                    first: FirstSolve | None = None, known: tuple[dict, ...] = ()) -> PartitionResult:
    """Solve one candidate. With `cutoff` (scaled objective), only strictly better plans are feasible.

    With exact=False, solve only the relaxation with the seed paths (one CP-SAT solve): the result's `bound`
    is a lower bound on the candidate's optimum and its plan is timed exactly (status OPTIMAL when its own
    critical path was already in the relaxation, RELAXED when the two differ); the planner runs the full
    loop only for candidates whose bound stays promising. `hint`: a solution the first solve starts from; the
    seed paths are the pivot paths, and with a hint its critical path (and its neighbours' when m <= 2p).
    `first`: the candidate's relaxation, taken as the first solve where it replays (FirstSolve).

    `known`: critical paths met solving other candidates with the same schedule graph (the schedule, its stages,
    chunks, micro-batches and ticks), cuts here too: a path of the graph bounds the pipeline time whatever the
    passes last. They start the model where the relaxation is not replayed; the result's `met` holds the paths
    this call adds to them. (llama3-70b on 16384 H100s: 25 CP-SAT solves in 5.1 s -> 24 in 4.7 s; on 8192:
    23 in 1.25 s -> 21 in 1.10 s.)"""
    cp_model = import_cp_model()  # imported here, not at module level: it costs most of autotune's start-up

    budget = Budget() if budget is None else budget
    model = cp_model.CpModel()
    chunks, ranges = _chunk_vars(model, cc, num_layers, pinned)
    if chunks is None:
        return PartitionResult("INFEASIBLE")
    rc, r = _recompute_vars(model, cc, chunks)
    durations = pass_coefficients(cc)
    upper = _pipe_upper(cc, num_layers)
    pipe = model.NewIntVar(0, upper, "pipe")
    _pivot_paths(model, cc, pipe, durations, chunks, rc, upper)
    memory_constraints(model, cc, chunks, rc)
    choice, sync = dp_sync(model, cc, chunks, ranges, num_layers)
    adam = adam_term(model, cc, chunks, num_layers)
    objective = pipe + sync + adam + to_solver_time(cc.tied_sync_s)
    if cutoff is not None:
        model.Add(objective < cutoff)
    model.Minimize(objective)
    paths: list[dict] = []
    if hint is not None:
        _add_hint(model, cc, hint, chunks, r, choice)
        paths = _seed_paths(model, cc, pipe, durations, chunks, rc, hint)
    best: PartitionResult | None = None
    proven = False
    replay = first.found if first is not None and first.replays(cutoff, hint, budget) else None
    if replay is None:
        _add_cuts(model, pipe, (*known, *(first.cuts if first is not None else ())), paths, durations, chunks, rc)
    met: list[dict] = []
    while not budget.exhausted:
        spent, first_only = budget.spent, bool(met)  # a later round only needs a solution: _solve
        if replay is not None:
            found, replay = replay, None
        else:
            found = _solve(model, objective, pipe, cc, chunks, r, choice, budget, first_only=first_only)
        if found is None or found.status == "INFEASIBLE":  # nothing (else) beats the cutoff or the best so far
            proven = found is not None
            break
        k_vals, rc_vals = found.chunk_values
        length, path = partition_critical_path(cc, durations, k_vals, rc_vals)
        met.append(path)
        true_objective = found.objective - found.pipe + length
        if best is None or true_objective < best.objective:
            best = replace(found, objective=true_objective, status="FEASIBLE")
        if length <= found.pipe and (found.status == "OPTIMAL" or not first_only):  # its path is a cut
            proven = found.status == "OPTIMAL"
            break
        if not exact:  # the planner decides whether this candidate deserves the exact loop
            cuts = [*paths, path, *neighbour_paths(cc, durations, k_vals, rc_vals, [*paths, path])]
            return replace(best, status="RELAXED", bound=found.objective if found.status == "OPTIMAL" else 0,
                           first=FirstSolve(cutoff, hint, found, round(budget.spent - spent, 9), tuple(cuts)),
                           met=tuple(met))
        _add_cuts(model, pipe, [path], paths, durations, chunks, rc)  # a better plan's path may be a cut already
        _add_cuts(model, pipe, neighbour_paths(cc, durations, k_vals, rc_vals, paths), paths, durations, chunks, rc)
        model.Add(objective < best.objective)
        model.ClearHints()
        for var, value in zip(chunks, k_vals):  # the next solve starts from this partition
            model.AddHint(var, value)
    if best is None:
        return PartitionResult("INFEASIBLE" if proven else "UNKNOWN", met=tuple(met))
    return replace(best, status="OPTIMAL" if proven else "FEASIBLE", bound=best.objective if proven else 0,
                   met=tuple(met))


def _add_cuts(model: cp_model.CpModel, pipe, cuts, paths: list[dict], durations: Coefficients, chunks, rc) -> None:
    """Add the cuts not among `paths` yet, and append them to it."""
    have = {_path_key(p) for p in paths}
    for cut in cuts:
        if (key := _path_key(cut)) not in have:
            have.add(key)
            _add_path(model, pipe, cut, durations, chunks, rc)
            paths.append(cut)


def _path_key(path: dict) -> frozenset:
    return frozenset(path.items())


def _add_hint(model, cc: CandidateCosts, hint: Hint, chunks, r, choice) -> None:
    """Start the first solve from the hint's partition, recomputation and bucket (CP-SAT repairs a hint that
    the cutoff makes infeasible)."""
    for var, value in zip(chunks, hint.chunks):
        model.AddHint(var, value)
    if r is not None:
        model.AddHint(r, hint.recompute_layers)
    for y, bucket in zip(choice, cc.bucket_labels):
        model.AddHint(y, int(bucket == hint.bucket))


def _seed_paths(model, cc: CandidateCosts, pipe, durations: Coefficients, chunks, rc, hint: Hint) -> list[dict]:
    """Cut with the critical path of the hint's partition, and with m <= 2p its neighbours', before the first
    solve. With few micro-batches the warm-up and drain, where the critical path zigzags between ranks, are a
    large share of the step, and the pivot paths alone leave the relaxation ~5% below the true pipeline time,
    too weak to prune against the cutoff; the hint is a good partition, so its paths are nearly tight where the
    optimum lies (llama3-70b on 16384 H100s: 28 partition solves and 48 s -> 21 and 27 s). With many, the pivot
    paths are nearly tight already and 4p more cuts only slow each solve (deepseek-v3, pp32 m256)."""
    rc_hint = tuple(min(hint.recompute_layers, k) for k in hint.chunks)
    _, path = partition_critical_path(cc, durations, hint.chunks, rc_hint)
    paths = [path]
    if cc.cand.num_microbatches <= 2 * cc.cand.pp:
        paths += neighbour_paths(cc, durations, hint.chunks, rc_hint, paths)
    for p in paths:
        _add_path(model, pipe, p, durations, chunks, rc)
    return paths


def _solve(model, objective, pipe, cc: CandidateCosts, chunks, r, choice, budget: Budget, *,
           first_only: bool = False) -> PartitionResult | None:
    """One solve of the current model with the strategy fallbacks; the result or None. The attempts
    run on a copy: "improve on the last attempt" holds for this relaxation only, and must not survive into
    the next round of the critical-path loop, whose cuts raise the objective of the same partitions.
    `first_only`: stop at the first solution (the loop's later rounds: module docstring)."""
    trial = model.Clone()
    found: PartitionResult | None = None
    for branching, conflicts in _ATTEMPTS:
        if found is not None and conflicts is not None:
            # the fixed and LP strategies are there to find a first plan where the automatic search stalls; with
            # one in hand what is left is the proof, which they only delay (llama3-70b on 16384 H100s: 3.8 s of
            # UNKNOWN attempts before the unbounded automatic search proved its winner in 0.9 s)
            continue
        solver = _solver(branching, conflicts, budget, presolve=cc.cand.num_microbatches > 2 * cc.cand.pp)  # see there
        solver.parameters.stop_after_first_solution = first_only
        status = solver.StatusName(solver.Solve(trial))
        budget.spend(solver.deterministic_time)
        if status in ("OPTIMAL", "FEASIBLE"):
            found = _read(solver, cc, chunks, r, choice, status, pipe)
            if status == "OPTIMAL" or first_only:
                return found
            trial.Add(objective < found.objective)  # the next attempt must improve on it, or prove it optimal
        elif status == "INFEASIBLE":
            return PartitionResult("INFEASIBLE") if found is None else replace(found, status="OPTIMAL")
        if budget.exhausted:
            break
    return found


def _add_path(model: cp_model.CpModel, pipe, path: dict, durations: Coefficients, chunks, rc) -> None:
    """pipe >= the length of one path: sum over its passes of their durations, linear in k_i and rc_i."""
    model.Add(pipe >= sum(count * _pass_expr(durations, rank, chunk, kind, chunks[rank], rc[rank])
                          for (rank, chunk, kind), count in path.items()))


def _pivot_paths(model: cp_model.CpModel, cc: CandidateCosts, pipe, durations: Coefficients, chunks, rc,
                 upper: int) -> None:
    """pipe >= every rank's pivot path, without simulating: the first micro-batch's forward through the
    chunk-0 passes of the ranks before it, all of its own passes, and (1F1B, interleaved) the last micro-batch's
    backward back through chunk 0 of the ranks before it. Each is a path of the schedule's graph: a rank's
    passes are chained by its order, its first pass is the first micro-batch's chunk-0 forward and its last
    pass (1F1B, interleaved) the last micro-batch's chunk-0 backward. ZB-H1's rank k ends on its k deferred W
    passes, so it gets a second path that leaves after its last B and runs the last micro-batch's B back up,
    then rank 0's last W. The parts before the pivot rank are running sums (one variable per rank), so the
    model stays sparse for long pipelines."""
    c = cc.cand
    m = c.num_microbatches
    v = 2 if c.schedule == "v-half" else c.vpp
    kinds = "FBW" if c.schedule in SPLIT_BACKWARD else "FB"
    both_chains = c.schedule in ("1f1b", "interleaved")

    def dur(i: int, chunk: int, kind: str):
        return _pass_expr(durations, i, chunk, kind, chunks[i], rc[i])

    before = before_drain = 0  # the chains through the ranks before the pivot
    for k in range(c.pp):
        own = sum(dur(k, chunk, kind) for chunk in range(v) for kind in kinds)
        model.Add(pipe >= m * own + before)
        if c.schedule == "zb-h1":  # its W passes after its last B: k deferred and the last one (all if m <= k)
            extra = dur(0, 0, "W") if k > 0 else 0
            model.Add(pipe >= m * own - min(k + 1, m) * dur(k, 0, "W") + before_drain + extra)
        if k == c.pp - 1:
            break
        step = dur(k, 0, "F") + (dur(k, 0, "B") if both_chains else 0)
        nxt = model.NewIntVar(0, upper, f"chain{k}")
        model.Add(nxt == before + step)
        before = nxt
        if c.schedule == "zb-h1":
            nxt_drain = model.NewIntVar(0, upper, f"drain{k}")
            model.Add(nxt_drain == before_drain + dur(k, 0, "F") + dur(k, 0, "B"))
            before_drain = nxt_drain


def _pass_expr(durations: Coefficients, i: int, chunk: int, kind: str, k, rc):
    """Solver-unit duration of one pass of rank i's chunk, linear in its chunks' worth k and recomputed rc."""
    fixed, (f, b, w, d) = durations
    slope = {"F": f, "B": b, "W": w}[kind]
    expr = slope * k + fixed[i][chunk]["FBW".index(kind)]
    if kind == "B" and d and not isinstance(rc, int):
        expr = expr + d * rc
    return expr


def _pipe_upper(cc: CandidateCosts, num_layers: int) -> int:
    """A safe upper bound on the pipeline time: every pass of every rank one after another."""
    c = cc.cand
    fixed, (f, b, w, d) = pass_coefficients(cc)
    per_mb = sum(sum(F + B + W for F, B, W in row) for row in fixed) + num_layers * (f + b + w + max(d, 0))
    return c.num_microbatches * per_mb + 1


#: Search strategies tried in turn, each with a budget of conflicts (None: only the deterministic-time cap,
#: Budget.per_solve). CP-SAT's default search proves most partitions in milliseconds but can crawl along the
#: objective when full recompute makes the LP relaxation weak; fixed-order and LP-guided branching finish
#: those at once.
_ATTEMPTS = (("AUTOMATIC_SEARCH", 5_000), ("FIXED_SEARCH", 20_000), ("LP_SEARCH", 20_000), ("AUTOMATIC_SEARCH", None))


def _solver(branching: str, conflicts: int | None, budget: Budget, *, presolve: bool = True):
    cp_model = import_cp_model()

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1  # deterministic, and the machine has two cores
    solver.parameters.random_seed = 0
    # Level 2 puts the bucket-enforced sync constraints into the LP relaxation; without it the objective
    # bound stays weak and CP-SAT can stall on even a 2-stage model.
    solver.parameters.linearization_level = 2
    # Presolve is most of a small model's solve, and of the planner's typical one (proving that nothing beats the
    # best plan): two presolve rounds instead of three and probing at effort 1 instead of 2 prove the same in less
    # time (llama3-70b scale sweep, its 69 solves at 1024-16384 GPUs: 6.2 -> 4.6 s of CP-SAT with the same
    # statuses and objectives; the reference plans are byte-identical, the reference cases no slower).
    solver.parameters.max_presolve_iterations = 2
    solver.parameters.cp_model_probing_level = 1
    # `presolve` False (_solve: m <= 2p) skips presolve altogether. Those models carry the critical paths of the
    # hint and its 4p neighbours (_seed_paths) and of each round: hundreds of dense cuts, which presolve compares
    # pairwise (dominated constraints, linear overlaps) to prove what the search proves at once. llama3-70b scale
    # sweep, 8192 and 16384 GPUs: 4.4 -> 3.2 s of CP-SAT, the same statuses, plans and reference outputs. With
    # many micro-batches presolve is what tightens the LP bound: off, mixtral-8x22b's pp32 m256 exact loop took
    # 12.8 s instead of 0.8.
    solver.parameters.cp_model_presolve = presolve
    solver.parameters.search_branching = getattr(cp_model, branching)
    if conflicts is not None:
        solver.parameters.max_number_of_conflicts = conflicts
    solver.parameters.max_deterministic_time = max(min(budget.per_solve, budget.work), 0.0)
    # The work limit above decides what a solve returns, so the answer is the same on every machine. The wall
    # clock reaches CP-SAT only as the --time-limit deadline itself: a solve still running when it passes stops
    # there (the search is then marked as stopped by time, whose answer may differ between machines anyway),
    # so --time-limit holds instead of being overrun by one solve (issue 17).
    if math.isfinite(budget.deadline):
        solver.parameters.max_time_in_seconds = max(budget.deadline - time.perf_counter(), 1e-3)
    return solver


def _read(solver, cc: CandidateCosts, chunks, r, choice, status: str, pipe) -> PartitionResult:
    v = cc.cand.vpp
    k_vals = tuple(solver.Value(k) for k in chunks)
    layers = tuple(v * k for k in k_vals)
    r_val = min(solver.Value(r), max(layers) // v) if r is not None else 0
    rc_vals = tuple(min(r_val, k) for k in k_vals)
    bucket = next((b for b, y in zip(cc.bucket_labels, choice) if solver.Value(y)), cc.bucket_labels[0])
    return PartitionResult(status, layers, r_val, bucket, int(solver.ObjectiveValue()), (k_vals, rc_vals),
                           solver.Value(pipe))


def _chunk_vars(model: cp_model.CpModel, cc: CandidateCosts, num_layers: int, pinned: tuple[int, ...] | None):
    """k_i chunks' worth of layers per stage (n_i = vpp*k_i), summing to the model; and each one's (lo, hi)."""
    v = cc.cand.vpp
    if num_layers % v:
        return None, None
    chunks, ranges = [], []
    for i in range(cc.cand.pp):
        lo, hi = chunk_range(cc, i, num_layers)
        if pinned is not None:
            if pinned[i] % v or not lo <= pinned[i] // v <= hi:
                return None, None
            lo = hi = pinned[i] // v
        if lo > hi:
            return None, None
        chunks.append(model.NewIntVar(lo, hi, f"k{i}"))
        ranges.append((lo, hi))
    model.Add(sum(chunks) == num_layers // v)
    return chunks, ranges


def _recompute_vars(model: cp_model.CpModel, cc: CandidateCosts, chunks: list[cp_model.IntVar]):
    """rc_i = min(r, k_i): Megatron's block method recomputes the first r layers of every chunk."""
    c = cc.cand
    if c.full_max == 0:
        return [0] * len(chunks), None
    r = model.NewIntVar(c.full_min, c.full_max, "r")
    rc = []
    for i, k in enumerate(chunks):
        x = model.NewIntVar(0, c.full_max, f"rc{i}")
        model.AddMinEquality(x, [r, k])
        rc.append(x)
    return rc, r
