"""The pipeline time of a schedule with many ranks, one wavefront of passes at a time in numpy.

makespan's loop (costmodel/pipeline.py) takes the passes one by one in a topological order: a pass ends at
max(end of the pass before it on its rank, end of the pass it depends on) + its duration. Group the passes
by their depth, the number of passes on the longest chain of predecessors ending at them: every pass of a
wavefront depends only on passes of earlier ones, so a wavefront's maxima and additions can run as one numpy
operation each. They are the same IEEE operations on the same operands, so every end is the same number to
the bit, in about 2(m + p) steps of numpy instead of 2pm steps of Python. A wavefront holds at most one pass
per rank: it pays with many ranks (pipeline.WAVEFRONT_MIN_PP), where Python's per-pass cost dominates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from autotune.costmodel.passids import PassIds


@dataclass(frozen=True, eq=False)
class Wavefronts:
    """makespan's passes renumbered wavefront by wavefront; the end table keeps its first two entries
    (0: the step's start, 1: no dependency) and pass k of this order is entry k + 2."""

    slots: np.ndarray
    """Each pass's entry of the flat durations (pipeline.flat_durations)."""
    steps: tuple[tuple[np.ndarray, slice], ...]
    """Per wavefront, a 2 x width array of end-table entries (its passes' rank predecessors, then their
    dependencies; contiguous, which numpy gathers fastest) and the slice of the end table its passes fill."""


def wavefronts(ids: PassIds, guess: np.ndarray | None = None) -> Wavefronts:
    """Group a schedule's passes (passids.pass_ids of its rank orders) by depth: `guess` (per pass in rank
    order, closed_depths) where it is the depth, else found walking the ranks round robin as pipeline._graph
    does, each rank as far as its dependencies allow."""
    total = len(ids.own)
    level = guess if guess is not None and _is_depth(ids, guess) else _walked_depths(ids)  # per pass in rank order
    order = np.argsort(level, kind="stable")  # our pass k is pass order[k] in rank order
    entry = np.empty(total + 2, dtype=np.int64)  # end-table entry of each pass in rank order, then start, none
    entry[order] = np.arange(2, total + 2)
    entry[total:] = (0, 1)
    prev = np.arange(-1, total - 1)
    prev[ids.starts] = total  # a rank's first pass follows the step's start
    at = np.full(ids.none + 1, total + 1)  # pass id -> q; `none` -> the "no dependency" entry
    at[ids.own] = np.arange(total)
    inputs = np.stack((entry[prev[order]], entry[at[ids.need[order]]]))
    bounds = (np.searchsorted(level[order], np.arange(1, int(level.max()) + 2)) + 2).tolist()
    return Wavefronts(ids.slot[order], tuple((np.ascontiguousarray(inputs[:, a - 2:b - 2]), slice(a, b))
                                             for a, b in pairwise(bounds)))


def _walked_depths(ids: PassIds) -> np.ndarray:
    """Each pass's depth (per pass in rank order), walking the ranks round robin."""
    owns, needs = ids.rank_lists()
    depth = [-1] * ids.none + [0]  # pass id -> depth (-1: not reached yet); `none` (no dependency) at 0
    reached, last = [0] * len(owns), [0] * len(owns)  # per rank: passes reached, the depth of the last one
    count, total = 0, len(ids.own)
    while count < total:
        before = count
        for r, (own, need) in enumerate(zip(owns, needs)):
            k, at, stop = reached[r], last[r], len(own)
            while k < stop and (d := depth[need[k]]) >= 0:
                at = depth[own[k]] = (d if d > at else at) + 1
                k += 1
            count += k - reached[r]
            reached[r], last[r] = k, at
        if count == before:
            raise AssertionError("the rank orders deadlock")
    return np.array(depth)[ids.own]


def _is_depth(ids: PassIds, depth: np.ndarray) -> bool:
    """Whether `depth` (per pass in rank order) is each pass's depth: 1 + the larger of its rank predecessor's
    and its dependency's (0 for none). Those equations have one solution on an acyclic graph (by induction
    along any topological order) and none on a cyclic one (each edge would raise the depth), so a guess that
    meets them all is the depth."""
    at = np.zeros(ids.none + 1, dtype=np.int64)
    at[ids.own] = np.arange(len(ids.own))
    dep = np.where(ids.need == ids.none, 0, depth[at[ids.need]])
    prev = np.concatenate(([0], depth[:-1]))
    prev[ids.starts] = 0
    return bool(np.array_equal(depth, np.maximum(prev, dep) + 1))


def closed_depths(schedule: str, ids: PassIds, pp: int, m: int) -> np.ndarray | None:
    """A guess of the passes' depths (per pass in rank order) for wavefronts, which checks it: walking a large
    order pass by pass was most of the first estimate of a new (schedule, pp, m) with many ranks (issue 13).
    With unit passes rank r runs its w = min(p-r-1, m) warm-up forwards and the forward after them at depths
    r+1, r+2, ... and its first backward at 2p-r; from there 1F1B runs a forward at 2p-r+2t-1 and the t-th
    backward at 2p-r+2t, and ZB-H1 (m >= p: its W passes fill every gap) one pass a step. None: no guess."""
    if schedule not in ("1f1b", "zb-h1"):
        return None
    r = ids.rank
    k = np.arange(len(ids.own)) - ids.starts[r]  # place in the rank's order
    w = np.minimum(pp - r - 1, m)
    first_b = w + (w < m)  # place of the first backward
    if schedule == "zb-h1":
        return np.where(k < first_b, r + k + 1, 2 * pp - r + (k - first_b))
    j = ids.own % m  # micro-batch
    forward = np.where(j <= w, r + j + 1, 2 * pp - r + 2 * (j - w) - 1)
    return np.where(ids.own < pp * m, forward, 2 * pp - r + 2 * j)  # F passes are numbered first


def wavefront_makespan(w: Wavefronts, flat: Sequence[float]) -> float:
    """makespan over the grouped graph, given the flat durations: its result, to the bit. Like makespan's
    loop, which starts from 0.0, it is a float even for integer durations (converted the same way)."""
    end = np.empty(len(w.slots) + 2)
    end[0], end[1] = 0.0, -np.inf
    np.take(np.asarray(flat, dtype=np.float64), w.slots, out=end[2:])  # each pass's duration; its start added below
    take, maximum, add = end.take, np.maximum, np.add  # a step is a few numpy calls: each one's overhead counts
    for inputs, passes in w.steps:
        ends, durations = take(inputs), end[passes]
        add(maximum(ends[0], ends[1]), durations, out=durations)  # in place: `+=` would also set the slice again
    return end[2:].max().item()
