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


@dataclass(frozen=True, eq=False)
class Wavefronts:
    """makespan's passes renumbered wavefront by wavefront; the end table keeps its first two entries
    (0: the step's start, 1: no dependency) and pass k of this order is entry k + 2."""

    slots: np.ndarray
    """Each pass's entry of the flat durations (pipeline.flat_durations)."""
    steps: tuple[tuple[np.ndarray, slice], ...]
    """Per wavefront, a 2 x width array of end-table entries (its passes' rank predecessors, then their
    dependencies; contiguous, which numpy gathers fastest) and the slice of the end table its passes fill."""


def wavefronts(prev_at: Sequence[int], dep_at: Sequence[int], slots: Sequence[int]) -> Wavefronts:
    """Group a pass graph given as makespan walks it (pipeline._Graph's prev_at, dep_at and slots)."""
    n = len(prev_at)
    depth = [0] * (n + 2)  # the start and "no dependency" are at depth 0
    for k, (p, d) in enumerate(zip(prev_at, dep_at), 2):
        a, b = depth[p], depth[d]
        depth[k] = (a if a > b else b) + 1
    level = np.array(depth[2:])
    order = np.argsort(level, kind="stable")  # our pass k is makespan's pass order[k]
    entry = np.empty(n + 2, dtype=np.int64)  # makespan's end-table entry -> ours
    entry[:2] = (0, 1)
    entry[order + 2] = np.arange(2, n + 2)
    inputs = np.stack((entry[np.asarray(prev_at)[order]], entry[np.asarray(dep_at)[order]]))
    bounds = (np.searchsorted(level[order], np.arange(1, int(level.max()) + 2)) + 2).tolist()
    return Wavefronts(np.asarray(slots)[order], tuple((np.ascontiguousarray(inputs[:, a - 2:b - 2]), slice(a, b))
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
