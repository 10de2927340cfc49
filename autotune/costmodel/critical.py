"""Longest paths through a pipeline schedule's pass graph (costmodel/pipeline.py), for the planner's cuts.

Any path's length is a lower bound on the pipeline time that is linear in the pass durations: the planner
adds the critical path of each solution it finds as a cut until its solution's own critical path is already
accounted for, and the critical paths of the partitions next to it (search/cuts.py). `critical_path`
walks one table of durations; `critical_paths` walks many tables of the same schedule at once, one numpy
column per table, so the 4p neighbours of a 64-stage solution cost one pass over the graph instead of 4p.
Both give the same lengths to the bit and the same paths as makespan's loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autotune.costmodel.pipeline import Durations, Ticks, _graph, _ticks, flat_durations

PathCounts = dict[tuple[int, int, str], int]
"""How many passes of each (rank, chunk, kind) a path runs."""


def critical_path(schedule: str, pp: int, vpp: int, m: int, durations: Durations, ticks: Ticks | None = None
                  ) -> tuple[float, PathCounts]:
    """The pipeline time and one longest path. `ticks` fixes the v-half order (default: the order
    `durations` would get)."""
    g = _graph(schedule, pp, vpp, m, _ticks(schedule, durations, ticks))
    flat = flat_durations(schedule, durations)
    # makespan's loop (the same additions in the same order), remembering which end each pass started from:
    # its dependency only when that ended strictly later than the pass before it on its rank
    end = [0.0, -math.inf]
    came: list[int] = []
    for p, d, x in zip(g.prev_at, g.dep_at, map(flat.__getitem__, g.slots)):
        a, b = end[p], end[d]
        came.append(d - 2 if b > a else (p - 2 if p >= 2 else -1))
        end.append((b if b > a else a) + x)
    del end[:2]
    total = max(end)
    return total, _walk_back(g, end.index(total), came.__getitem__)  # from the first pass to end last


def critical_paths(schedule: str, pp: int, vpp: int, m: int, tables: Sequence[Durations], ticks: Ticks
                   ) -> list[tuple[float | int, PathCounts]]:
    """critical_path of each table, all of one schedule and one order (`ticks` given, so the graph is shared):
    the same additions and comparisons, in numpy over the tables. Integer tables (the planner's solver units)
    stay integers."""
    if not tables:
        return []
    exact = all(isinstance(x, int) for table in tables for row in table for fbw in row for x in fbw)
    flat = np.array([flat_durations(schedule, table) for table in tables], dtype=np.int64 if exact else np.float64)
    return critical_paths_flat(schedule, pp, vpp, m, flat.T, ticks)


def critical_paths_flat(schedule: str, pp: int, vpp: int, m: int, flat: np.ndarray, ticks: Ticks
                        ) -> list[tuple[float | int, PathCounts]]:
    """critical_paths of tables given as one array, a row per slot of flat_durations and a column per table
    (int64: integer lengths; float64: as critical_path): the planner builds it in one go (search/cuts.py)."""
    if ticks is None:  # v-half's order follows its durations: one shared graph needs the order given
        raise ValueError("critical_paths needs the ticks that fix the order (critical_path derives them per table)")
    exact = flat.dtype == np.int64
    flat = np.ascontiguousarray(flat)  # a row per pass's slot, read whole
    g = _graph(schedule, pp, vpp, m, _ticks(schedule, (), ticks))  # (given ticks, _ticks reads no durations)
    n, count = len(g.ops), flat.shape[1]
    end = np.empty((n + 2, count), dtype=flat.dtype)
    end[0] = 0
    end[1] = np.iinfo(np.int64).min // 2 if exact else -np.inf  # no dependency: never the later end
    from_dep = np.empty((n, count), dtype=bool)
    for k, (p, d, s) in enumerate(zip(g.prev_at, g.dep_at, g.slots)):
        a, b = end[p], end[d]
        np.greater(b, a, out=from_dep[k])
        np.maximum(a, b, out=end[k + 2])  # equal ends are equal numbers: which one is taken does not matter
        end[k + 2] += flat[s]
    ends = end[2:]
    last = ends.argmax(axis=0)  # the first pass to end last, per table
    out = []
    for j, k in enumerate(last.tolist()):
        column = from_dep[:, j]
        total = ends[k, j].item()
        out.append((total, _walk_back(g, k, lambda i: g.dep[i] if column[i] else g.prev[i])))
    return out


def _walk_back(g, k: int, came) -> PathCounts:
    """Count the passes from pass k back along `came` (the pass each started after; -1: the step's start)."""
    counts: PathCounts = {}
    while k >= 0:
        key = (g.ranks[k], g.ops[k].chunk, g.ops[k].kind)
        counts[key] = counts.get(key, 0) + 1
        k = came(k)
    return counts
