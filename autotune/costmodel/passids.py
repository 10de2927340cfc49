"""A schedule's passes as integers, for pipeline._graph to order them with list lookups and numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from autotune.costmodel.pipeline import Pass

_KIND = {"F": 0, "B": 1, "W": 2}


@dataclass(frozen=True, eq=False)
class PassIds:
    """Every rank's passes in rank order (rank 0's, then rank 1's, ...), each as an integer
    (kind * stages + virtual stage) * m + micro-batch with kind F, B, W = 0, 1, 2."""

    own: np.ndarray
    need: np.ndarray
    """The pass each one depends on; `none` where it depends on none."""
    rank: np.ndarray
    slot: np.ndarray
    """Its entry of makespan's flat durations, (rank * chunks + chunk) * 3 + kind (pipeline._Graph.slots)."""
    starts: np.ndarray
    """Where each rank's passes begin."""
    none: int

    def rank_lists(self) -> tuple[list[list[int]], list[list[int]]]:
        """Each rank's `own` and `need` as lists, which a Python loop indexes fastest."""
        return ([o.tolist() for o in np.split(self.own, self.starts[1:])],
                [d.tolist() for d in np.split(self.need, self.starts[1:])])


def pass_ids(schedule: str, pp: int, v: int, m: int, orders: Sequence[Sequence[Pass]]) -> PassIds:
    """Number the passes of the rank orders (pipeline.rank_orders) of a schedule with v chunks per rank."""
    return _numbered(schedule, pp, v, m, np.array([_KIND[op.kind] for order in orders for op in order]),
                     np.array([op.chunk for order in orders for op in order]),
                     np.array([op.microbatch for order in orders for op in order]), [len(order) for order in orders])


def fixed_pass_ids(schedule: str, pp: int, v: int, m: int) -> PassIds:
    """pass_ids of a fixed order (1f1b, zb-h1, interleaved: pipeline.rank_orders), the same arrays built from
    the orders' rules in numpy: building a large order's Pass objects and reading them back was most of the
    first estimate of a new (schedule, pp, m) (issue 13; tests/costmodel/test_schedules.py compares them)."""
    kind, idx, keep = _rank_rows(schedule, pp, v, m)
    kind, idx = kind[keep], idx[keep]  # row by row: rank 0's passes in order, then rank 1's, ...
    lengths = keep.sum(axis=1).tolist()
    if schedule != "interleaved":
        return _numbered(schedule, pp, v, m, kind, np.zeros(len(kind), dtype=np.int64), idx, lengths)
    group = (idx // pp) % v  # pipeline._interleaved's chunk_pass: forwards walk the chunks up, backwards down
    return _numbered(schedule, pp, v, m, kind, np.where(kind == 0, group, v - 1 - group),
                     (idx // (pp * v)) * pp + idx % pp, lengths)


def _rank_rows(schedule: str, pp: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's order as a row of (kind, chunk-pass index) candidates and whether each is kept, as
    pipeline._one_f_one_b, _zb_h1 and _interleaved order them: the warm-up's forwards, then a forward (while
    any is left) and a backward per step, then (zb-h1) the weight gradient `rank` backwards behind, then the
    drain. All ranks at once: a rank at a time, the numpy calls' overhead was most of a large order's build."""
    total = m * v  # chunk-passes of each kind
    rank = np.arange(pp)[:, None]
    k = np.arange(total)[None, :]
    warmup = np.minimum((pp - rank - 1) * 2 + (v - 1) * pp, total) if schedule == "interleaved" else \
        np.minimum(pp - rank - 1, m)
    # per step: F(warmup + k) while k < total - warmup, B(k), and for zb-h1 W(k - rank) once k >= rank
    width = 3 if schedule == "zb-h1" else 2
    kind = np.empty((pp, total, width), dtype=np.int64)
    idx = np.empty((pp, total, width), dtype=np.int64)
    keep = np.ones((pp, total, width), dtype=bool)
    kind[..., 0], idx[..., 0], keep[..., 0] = 0, warmup + k, k < total - warmup
    kind[..., 1], idx[..., 1] = 1, k
    if width == 3:
        kind[..., 2], idx[..., 2], keep[..., 2] = 2, k - rank, k >= rank
    rows = [(np.zeros((pp, total), dtype=np.int64), np.broadcast_to(k, (pp, total)), k < warmup),
            (kind.reshape(pp, -1), idx.reshape(pp, -1), keep.reshape(pp, -1))]
    if width == 3:  # the weight gradients still pending: W(j) for j >= m - rank
        j = np.arange(m)[None, :]
        rows.append((np.full((pp, m), 2, dtype=np.int64), np.broadcast_to(j, (pp, m)), j >= m - rank))
    return tuple(np.concatenate(parts, axis=1) for parts in zip(*rows))  # type: ignore[return-value]


def _numbered(schedule: str, pp: int, v: int, m: int, kind: np.ndarray, chunk: np.ndarray, j: np.ndarray,
              lengths: list[int]) -> PassIds:
    stages = pp * v
    rank = np.repeat(np.arange(pp), lengths)
    # the virtual stage of (rank, chunk): pipeline.virtual_stage over every pass at once
    s = np.where(chunk == 0, rank, 2 * pp - 1 - rank) if schedule == "v-half" else chunk * pp + rank
    none = 3 * stages * m
    own = (kind * stages + s) * m + j
    # F needs F on s-1 (the first stage: nothing), W its own B, B needs B on s+1 (the last stage: its own F): a
    # step from its own id per kind, then the two ends (np.select over all of them took most of a large order's ids)
    need = own + np.array((-m, m, -stages * m))[kind]
    need[(s == 0) & (kind == 0)] = none
    need[(s == stages - 1) & (kind == 1)] -= (stages + 1) * m
    return PassIds(own, need, rank, (rank * v + chunk) * 3 + kind, np.cumsum([0] + lengths[:-1]), none)


def round_robin_places(ids: PassIds, deadlock: str) -> list[int]:
    """Each pass id's place in a topological order (the `none` entry: 0), found walking the ranks round robin,
    each as far as its dependencies allow (pipeline._graph's order). `deadlock`: the error if none can go on."""
    owns, needs = ids.rank_lists()
    index = [-1] * ids.none + [0]  # pass id -> place in the order; `none` (no dependency) is always placed
    ptr = [0] * len(owns)
    n, total = 0, len(ids.own)
    while n < total:
        start = n
        for r, (own, need) in enumerate(zip(owns, needs)):
            k, stop = ptr[r], len(own)
            while k < stop and index[need[k]] >= 0:
                index[own[k]] = n
                n, k = n + 1, k + 1
            ptr[r] = k
        if n == start:
            raise AssertionError(deadlock)
    return index
