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
bound for every partition, so when the solution's own critical path is already in the set, the solution is
optimal for the exact (simulated) pipeline time. Each bucketed sync is max(one bucket, max_i
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

import numpy as np

from autotune.costmodel.critical import critical_path, critical_paths
from autotune.costmodel.pipeline import SPLIT_BACKWARD
from autotune.search.budget import Budget
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


@dataclass(frozen=True, slots=True)
class Hint:
    """A complete solution to start from (the planner's even or balanced split)."""

    chunks: tuple[int, ...]
    """k_i: chunks' worth of layers per stage."""
    recompute_layers: int
    bucket: int


def solve_partition(cc: CandidateCosts, num_layers: int, *, budget: Budget | None = None, cutoff: int | None = None,
                    pinned: tuple[int, ...] | None = None, exact: bool = True, hint: Hint | None = None
                    ) -> PartitionResult:
    """Solve one candidate. With `cutoff` (scaled objective), only strictly better plans are feasible.

    With exact=False, solve only the relaxation with the pivot paths (one CP-SAT solve): the result's `bound`
    is a lower bound on the candidate's optimum and its plan is timed exactly (status OPTIMAL when its own
    critical path was already in the relaxation, RELAXED when the two differ); the planner runs the full
    loop only for candidates whose bound stays promising. `hint`: a solution the first solve starts from."""
    from ortools.sat.python import cp_model  # imported here: it costs most of autotune's start-up

    budget = Budget() if budget is None else budget
    model = cp_model.CpModel()
    chunks, ranges = _chunk_vars(model, cc, num_layers, pinned)
    if chunks is None:
        return PartitionResult("INFEASIBLE")
    rc, r = _recompute_vars(model, cc, chunks)
    durations = _pass_coefficients(cc)
    pipe = model.NewIntVar(0, _pipe_upper(cc, num_layers), "pipe")
    _pivot_paths(model, cc, pipe, durations, chunks, rc, _pipe_upper(cc, num_layers))
    memory_constraints(model, cc, chunks, rc)
    choice, sync = dp_sync(model, cc, chunks, ranges, num_layers)
    adam = adam_term(model, cc, chunks, num_layers)
    objective = pipe + sync + adam + to_solver_time(cc.tied_sync_s)
    if cutoff is not None:
        model.Add(objective < cutoff)
    model.Minimize(objective)
    if hint is not None:
        _add_hint(model, cc, hint, chunks, r, choice)
    best: PartitionResult | None = None
    proven = False
    paths: list[dict] = []
    while not budget.exhausted:
        found = _solve(model, objective, pipe, cc, chunks, r, choice, budget)
        if found is None or found.status == "INFEASIBLE":  # nothing (else) beats the cutoff or the best so far
            proven = found is not None
            break
        k_vals, rc_vals = found.chunk_values
        length, path = _critical_path(cc, durations, k_vals, rc_vals)
        true_objective = found.objective - found.pipe + length
        if best is None or true_objective < best.objective:
            best = replace(found, objective=true_objective, status="FEASIBLE")
        if length <= found.pipe:  # the solution's critical path is already a constraint: nothing can do better
            proven = found.status == "OPTIMAL"
            break
        if not exact:  # the planner decides whether this candidate deserves the exact loop
            return replace(best, status="RELAXED", bound=found.objective if found.status == "OPTIMAL" else 0)
        _add_path(model, pipe, path, durations, chunks, rc)
        paths.append(path)
        for extra in _neighbour_paths(cc, durations, k_vals, rc_vals, paths):
            _add_path(model, pipe, extra, durations, chunks, rc)
            paths.append(extra)
        model.Add(objective < best.objective)
        model.ClearHints()
        for var, value in zip(chunks, k_vals):  # the next solve starts from this partition
            model.AddHint(var, value)
    if best is None:
        return PartitionResult("INFEASIBLE" if proven else "UNKNOWN")
    return replace(best, status="OPTIMAL" if proven else "FEASIBLE", bound=best.objective if proven else 0)


def _add_hint(model, cc: CandidateCosts, hint: Hint, chunks, r, choice) -> None:
    """Start the first solve from the hint's partition, recomputation and bucket (CP-SAT repairs a hint that
    the cutoff makes infeasible)."""
    for var, value in zip(chunks, hint.chunks):
        model.AddHint(var, value)
    if r is not None:
        model.AddHint(r, hint.recompute_layers)
    for y, bucket in zip(choice, cc.buckets):
        model.AddHint(y, int(bucket == hint.bucket))


def _solve(model, objective, pipe, cc: CandidateCosts, chunks, r, choice, budget: Budget) -> PartitionResult | None:
    """One solve of the current model with the strategy fallbacks; the result or None. The attempts
    run on a copy: "improve on the last attempt" holds for this relaxation only, and must not survive into
    the next round of the critical-path loop, whose cuts raise the objective of the same partitions."""
    trial = model.Clone()
    found: PartitionResult | None = None
    for branching, conflicts in _ATTEMPTS:
        solver = _solver(branching, conflicts, budget)
        status = solver.StatusName(solver.Solve(trial))
        budget.spend(solver.deterministic_time)
        if status in ("OPTIMAL", "FEASIBLE"):
            found = _read(solver, cc, chunks, r, choice, status, pipe)
            if status == "OPTIMAL":
                return found
            trial.Add(objective < found.objective)  # the next attempt must improve on it, or prove it optimal
        elif status == "INFEASIBLE":
            return PartitionResult("INFEASIBLE") if found is None else replace(found, status="OPTIMAL")
        if budget.exhausted:
            break
    return found


Coefficients = tuple[tuple[tuple[tuple[int, int, int], ...], ...], tuple[int, int, int, int]]


def _pass_coefficients(cc: CandidateCosts) -> Coefficients:
    """Solver-unit (F, B, W) constants per rank and chunk, and per-layer (f, b, w, d) slopes; for schedules
    that do not split the backward W is folded into B."""
    split = cc.cand.schedule in SPLIT_BACKWARD
    f, b, w = (to_solver_time(x) for x in cc.layer_fbw)
    d = to_solver_time(cc.full_extra_s)
    fixed = tuple(tuple((to_solver_time(x), to_solver_time(y + (0.0 if split else z)),
                         to_solver_time(z) if split else 0)
                        for x, y, z in s.chunk_fixed) for s in cc.stages)
    return fixed, (f, b + (0 if split else w), w if split else 0, d)


def _durations_at(durations: Coefficients, k_vals, rc_vals):
    """Integer (F, B, W) per rank and chunk for a given partition."""
    fixed, (f, b, w, d) = durations
    return tuple(tuple((k * f + F, k * b + rc * d + B, k * w + W) for F, B, W in row)
                 for row, k, rc in zip(fixed, k_vals, rc_vals))


def _critical_table(cc: CandidateCosts, durations: Coefficients, k_vals, rc_vals):
    """The (F, B, W) table the schedule runs for a partition: W is part of B where the backward is not split."""
    table = _durations_at(durations, k_vals, rc_vals)
    if cc.cand.schedule not in SPLIT_BACKWARD:
        table = tuple(tuple((F, B, 0) for F, B, _ in row) for row in table)
    return table


def _critical_path(cc: CandidateCosts, durations: Coefficients, k_vals, rc_vals):
    c = cc.cand
    table = _critical_table(cc, durations, k_vals, rc_vals)
    total, path = critical_path(c.schedule, c.pp, c.vpp, c.num_microbatches, table, cc.ticks)
    return int(round(total)), path


def _neighbour_paths(cc: CandidateCosts, durations: Coefficients, k_vals, rc_vals, paths: list[dict]) -> list[dict]:
    """The critical paths of the partitions next to a solution (one chunk moved to an adjacent stage, or one
    stage a chunk larger or smaller) that no path in `paths` already bounds there.

    Any path of the schedule bounds the pipeline time of every partition, so these are valid cuts too. Without
    them each round of the loop cuts off one partition and the solver moves to its neighbour, whose critical path
    differs by a stage: dozens of full solves for a 16-stage ZB-H1 pipeline; with them a handful. The neighbours
    need not sum to the model (a path is a path whatever the durations), which keeps them 4p per round. All 4p
    are walked at once (critical_paths), and every path's length on every neighbour is one matrix product."""
    c = cc.cand
    r = max(rc_vals) if rc_vals else 0
    n = len(k_vals)
    moves = [(a, b) for a in range(n) for b in (a - 1, a + 1) if 0 <= b < n]
    moves += [(a, None) for a in range(n)] + [(None, b) for b in range(n)]
    tables = []
    for a, b in moves:
        k = list(k_vals)
        if a is not None:
            k[a] -= 1
        if b is not None:
            k[b] += 1
        if min(k) >= 0:
            tables.append(_critical_table(cc, durations, k, tuple(min(r, x) for x in k)))
    if not tables:
        return []
    found = critical_paths(c.schedule, c.pp, c.vpp, c.num_microbatches, tables, cc.ticks)
    slot_times = np.array([[x for row in table for fbw in row for x in fbw] for table in tables], dtype=np.int64)
    size, chunks = slot_times.shape[1], len(tables[0][0])
    longest = np.full(len(tables), np.iinfo(np.int64).min)  # per neighbour: the longest known path there
    if paths:
        longest = (np.array([_slot_counts(q, chunks, size) for q in paths]) @ slot_times.T).max(axis=0)
    out = []
    for i, (length, path) in enumerate(found):
        if longest[i] < int(round(length)):
            out.append(path)
            np.maximum(longest, slot_times @ np.array(_slot_counts(path, chunks, size)), out=longest)
    return out


def _slot_counts(path: dict, chunks: int, size: int) -> list[int]:
    """A path's pass counts in the order of a flattened (F, B, W) table: its length there is a dot product."""
    counts = [0] * size
    for (rank, chunk, kind), count in path.items():
        counts[(rank * chunks + chunk) * 3 + "FBW".index(kind)] = count
    return counts


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
    fixed, (f, b, w, d) = _pass_coefficients(cc)
    per_mb = sum(sum(F + B + W for F, B, W in row) for row in fixed) + num_layers * (f + b + w + max(d, 0))
    return c.num_microbatches * per_mb + 1


#: Search strategies tried in turn, each with a budget of conflicts (None: only the deterministic-time cap,
#: Budget.per_solve). CP-SAT's default search proves most partitions in milliseconds but can crawl along the
#: objective when full recompute makes the LP relaxation weak; fixed-order and LP-guided branching finish
#: those at once.
_ATTEMPTS = (("AUTOMATIC_SEARCH", 5_000), ("FIXED_SEARCH", 20_000), ("LP_SEARCH", 20_000), ("AUTOMATIC_SEARCH", None))


def _solver(branching: str, conflicts: int | None, budget: Budget):
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1  # deterministic, and the machine has two cores
    solver.parameters.random_seed = 0
    # Level 2 puts the bucket-enforced sync constraints into the LP relaxation; without it the objective
    # bound stays weak and CP-SAT can stall on even a 2-stage model.
    solver.parameters.linearization_level = 2
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
    bucket = next((b for b, y in zip(cc.buckets, choice) if solver.Value(y)), cc.buckets[0])
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
