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

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.costmodel.passids import PassIds


@dataclass(frozen=True, eq=False)
class Wavefronts:
    """makespan's passes on a grid of wavefronts: row d holds the passes of depth d, a column per rank (a rank
    runs at most one pass per depth) and a last column that stays -inf (no dependency); row 0 is the step's
    start. A cell where its rank runs no pass carries the rank's last end on (it waits on -inf for 0.0 seconds,
    which leaves any end as it is), so each pass finds its rank predecessor's end right above it and a row is
    three numpy calls on whole rows, none of them on slices made per step."""

    slots: np.ndarray
    """Each cell's entry of the flat durations (pipeline.flat_durations); -1 (an appended 0.0) where none runs."""
    deps: tuple[np.ndarray, ...]
    """Per row from 1 on, the grid entry (row * width + column) of each cell's dependency; -inf's for none."""
    passes: np.ndarray
    """The grid entry of every pass (their largest end is the makespan)."""

    @property
    def pays(self) -> bool:
        """Whether a row holds enough passes for the grid to beat makespan's loop (ROW_PASSES)."""
        return len(self.passes) >= ROW_PASSES * len(self.slots)


#: Passes a grid row must hold on average for wavefront_makespan to be faster than makespan's loop over passes:
#: a row's three numpy calls cost about as much as 11 passes of the loop (measured on the bench's 1f1b, zb-h1 and
#: interleaved plans of 16 to 64 ranks; fewer micro-batches, fewer passes a row)
ROW_PASSES = 11


def wavefronts(ids: PassIds, guess: np.ndarray | None = None) -> Wavefronts:
    """Place a schedule's passes (passids.pass_ids of its rank orders) on the grid by depth: `guess` (per pass in
    rank order, closed_depths) where it is the depth, else found walking the ranks round robin as pipeline._graph
    does, each rank as far as its dependencies allow."""
    level = guess if guess is not None and _is_depth(ids, guess) else _walked_depths(ids)  # per pass in rank order
    ranks = len(ids.starts)
    width, rows = ranks + 1, int(level.max()) + 1
    cell = level * width + ids.rank  # each pass's grid entry, in rank order
    at = np.full(ids.none + 1, ranks)  # pass id -> its grid entry; `none` (no dependency) -> the -inf entry
    at[ids.own] = cell
    slots, deps = np.full(rows * width, -1), np.full(rows * width, ranks)
    slots[cell], deps[cell] = ids.slot, at[ids.need]
    return Wavefronts(slots.reshape(rows, width), tuple(deps.reshape(rows, width)[1:]), cell)


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
    """makespan over the grid, given the flat durations: its result, to the bit. Like makespan's loop, which
    starts from 0.0, it is a float even for integer durations (converted the same way)."""
    end = np.array((*flat, 0.0)).take(w.slots)  # each pass's duration in its cell; its start added below
    end[0], end[0, -1] = 0.0, -np.inf
    gather, rows = end.reshape(-1).__getitem__, list(end)
    # row t = max(row t-1, its dependencies' ends) + its durations, in three calls whose overhead is a row's
    # cost: chained maps run them from C, a row after the other (each map pulls its inputs when the row before
    # is done), without the interpreter's loop between them (a tenth of the time). The gather is an index
    # (__getitem__): a third cheaper a call than take, a tenth of a row
    deque(map(np.add, map(np.maximum, rows[:-1], map(gather, w.deps)), rows[1:], rows[1:]), maxlen=0)
    # with no negative duration no end falls along a rank: the last row holds each rank's last and largest one
    return (rows[-1].max() if min(flat, default=0.0) >= 0 else gather(w.passes).max()).item()
