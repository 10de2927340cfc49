"""The cuts of the partition model (search/partition.py): pass durations linear in each stage's layers, and
the critical paths of given partitions, whose lengths bound the pipeline time of every partition."""

from __future__ import annotations

import numpy as np

from autotune.costmodel.critical import critical_path, critical_paths_flat
from autotune.costmodel.pipeline import SPLIT_BACKWARD
from autotune.search.tables import CandidateCosts
from autotune.units import to_solver_time

Coefficients = tuple[tuple[tuple[tuple[int, int, int], ...], ...], tuple[int, int, int, int]]


def pass_coefficients(cc: CandidateCosts) -> Coefficients:
    """Solver-unit (F, B, W) constants per rank and chunk, and per-layer (f, b, w, d) slopes; for schedules
    that do not split the backward W is folded into B."""
    split = cc.cand.schedule in SPLIT_BACKWARD
    f, b, w = (to_solver_time(x) for x in cc.layer_fbw)
    d = to_solver_time(cc.full_extra_s)
    fixed = tuple(tuple((to_solver_time(x), to_solver_time(y + (0.0 if split else z)),
                         to_solver_time(z) if split else 0)
                        for x, y, z in s.chunk_fixed) for s in cc.stages)
    return fixed, (f, b + (0 if split else w), w if split else 0, d)


def durations_at(durations: Coefficients, k_vals, rc_vals):
    """Integer (F, B, W) per rank and chunk for a given partition: the table its schedule runs (W is 0 where the
    backward is not split, pass_coefficients having folded it into B)."""
    fixed, (f, b, w, d) = durations
    return tuple(tuple((k * f + F, k * b + rc * d + B, k * w + W) for F, B, W in row)
                 for row, k, rc in zip(fixed, k_vals, rc_vals))


def partition_critical_path(cc: CandidateCosts, durations: Coefficients, k_vals, rc_vals):
    c = cc.cand
    table = durations_at(durations, k_vals, rc_vals)
    total, path = critical_path(c.schedule, c.pp, c.vpp, c.num_microbatches, table, cc.ticks)
    return int(round(total)), path


def neighbours(k_vals, rc_vals) -> list[tuple[list[int], tuple[int, ...]]]:
    """(chunks per stage, fully recomputed chunks per stage) of the partitions next to a solution: one chunk moved
    to an adjacent stage, or one stage a chunk larger or smaller (none below zero), recomputing as much as the
    solution's most recomputed stage allows."""
    r = max(rc_vals) if rc_vals else 0
    n = len(k_vals)
    moves = [(a, b) for a in range(n) for b in (a - 1, a + 1) if 0 <= b < n]
    moves += [(a, None) for a in range(n)] + [(None, b) for b in range(n)]
    out = []
    for a, b in moves:
        k = list(k_vals)
        if a is not None:
            k[a] -= 1
        if b is not None:
            k[b] += 1
        if min(k) >= 0:
            out.append((k, tuple(min(r, x) for x in k)))
    return out


def neighbour_paths(cc: CandidateCosts, durations: Coefficients, k_vals, rc_vals, paths: list[dict]) -> list[dict]:
    """The critical paths of the partitions next to a solution (one chunk moved to an adjacent stage, or one
    stage a chunk larger or smaller) that no path in `paths` already bounds there.

    Any path of the schedule bounds the pipeline time of every partition, so these are valid cuts too. Without
    them each round of the loop cuts off one partition and the solver moves to its neighbour, whose critical path
    differs by a stage: dozens of full solves for a 16-stage ZB-H1 pipeline; with them a handful. The neighbours
    need not sum to the model (a path is a path whatever the durations), which keeps them 4p per round. All 4p
    are walked at once (critical_paths_flat), and every path's length on every neighbour is one matrix product."""
    c = cc.cand
    near = neighbours(k_vals, rc_vals)
    if not near:
        return []
    slot_times = _slot_times(durations, near)
    found = critical_paths_flat(c.schedule, c.pp, c.vpp, c.num_microbatches, _flat(c.schedule, slot_times).T,
                                cc.ticks)
    size, chunks = slot_times.shape[1], len(durations[0][0])
    longest = np.full(len(near), np.iinfo(np.int64).min)  # per neighbour: the longest known path there
    if paths:
        longest = (np.array([_slot_counts(q, chunks, size) for q in paths]) @ slot_times.T).max(axis=0)
    out = []
    for i, (length, path) in enumerate(found):
        if longest[i] < int(round(length)):
            out.append(path)
            np.maximum(longest, slot_times @ np.array(_slot_counts(path, chunks, size)), out=longest)
    return out


def _slot_times(durations: Coefficients, near: list[tuple[list[int], tuple[int, ...]]]) -> np.ndarray:
    """[neighbour, slot]: durations_at of each partition in `near`, flattened rank by rank, chunk by chunk,
    (F, B, W) by (F, B, W): one array operation for all of them (integers, so exactly durations_at's numbers)."""
    fixed, (f, b, w, d) = durations
    k = np.array([x for x, _ in near], dtype=np.int64)[:, :, None, None]  # [neighbour, rank, 1, 1]
    rc = np.array([r for _, r in near], dtype=np.int64)[:, :, None]
    table = k * np.array([f, b, w], dtype=np.int64) + np.array(fixed, dtype=np.int64)[None]  # [n, rank, chunk, FBW]
    table[..., 1] += rc * d
    return table.reshape(len(near), -1)


def _flat(schedule: str, slot_times: np.ndarray) -> np.ndarray:
    """pipeline.flat_durations of each row: B + W in B's place where the schedule does not split the backward."""
    if schedule in SPLIT_BACKWARD:
        return slot_times
    flat = slot_times.reshape(len(slot_times), -1, 3).copy()
    flat[..., 1] += flat[..., 2]
    return flat.reshape(len(slot_times), -1)


def _slot_counts(path: dict, chunks: int, size: int) -> list[int]:
    """A path's pass counts in the order of a flattened (F, B, W) table: its length there is a dot product."""
    counts = [0] * size
    for (rank, chunk, kind), count in path.items():
        counts[(rank * chunks + chunk) * 3 + "FBW".index(kind)] = count
    return counts
