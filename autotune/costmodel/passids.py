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
    stages = pp * v
    lengths = [len(order) for order in orders]
    kind = np.array([_KIND[op.kind] for order in orders for op in order])
    chunk = np.array([op.chunk for order in orders for op in order])
    j = np.array([op.microbatch for order in orders for op in order])
    rank = np.repeat(np.arange(pp), lengths)
    # the virtual stage of (rank, chunk): pipeline.virtual_stage over every pass at once
    s = np.where(chunk == 0, rank, 2 * pp - 1 - rank) if schedule == "v-half" else chunk * pp + rank
    none = 3 * stages * m
    own = (kind * stages + s) * m + j
    # F needs F on s-1 (the first stage: nothing), W its own B, B needs B on s+1 (the last stage: its own F)
    need = np.select([kind == 0, kind == 2, s < stages - 1],
                     [np.where(s > 0, own - m, none), own - stages * m, own + m], s * m + j)
    return PassIds(own, need, rank, (rank * v + chunk) * 3 + kind, np.cumsum([0] + lengths[:-1]), none)
