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


def wavefronts(ids: PassIds) -> Wavefronts:
    """Group a schedule's passes (passids.pass_ids of its rank orders) by depth, found walking the ranks round
    robin as pipeline._graph does, each rank as far as its dependencies allow."""
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
    level = np.array(depth)[ids.own]  # per pass in rank order (q)
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


def wavefront_makespan(w: Wavefronts, flat: Sequence[float]) -> float:
    """makespan over the grouped graph, given the flat durations: its result, to the bit. Like makespan's
    loop, which starts from 0.0, it is a float even for integer durations (converted the same way)."""
    end = np.empty(len(w.slots) + 2)
    end[0], end[1] = 0.0, -np.inf
    np.take(np.asarray(flat, dtype=np.float64), w.slots, out=end[2:])  # each pass's duration; its start added below
    for inputs, passes in w.steps:
        ends = end[inputs]
        end[passes] += np.maximum(ends[0], ends[1], out=ends[0])
    return end[2:].max().item()
