"""Alpha-beta communication model (latency + size / bandwidth) for the collectives training uses.

Volumes per rank follow Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations
in MPICH" (2005): a ring all-reduce moves 2(n-1)/n of the buffer in 2(n-1) steps; reduce-scatter and
all-gather move (n-1)/n in n-1 steps; a (double binary) tree all-reduce takes 2*log2(n) latency steps and
moves about 2x the buffer. NCCL picks the faster, so all_reduce takes the minimum of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.specs.hardware import HardwareSpec


@dataclass(frozen=True, slots=True)
class Link:
    """The tier a process group communicates over: bandwidth already scaled by the achieved fraction."""

    bandwidth: float
    """Bytes/s per GPU per direction that a collective achieves."""
    latency: float
    """Seconds per collective step (alpha)."""


def group_link(hw: HardwareSpec, size: int, stride: int) -> Link:
    """The link a group of `size` ranks, `stride` ranks apart, uses. Ranks are numbered tp-fastest
    (Megatron's tp-cp-dp-pp order), so a group stays inside a node iff it spans <= gpus_per_node ranks."""
    if size * stride <= hw.gpus_per_node:
        return Link(hw.intra_node_bandwidth * hw.efficiency.intra_node_comm, hw.intra_node_latency)
    return Link(hw.inter_node_bandwidth * hw.efficiency.inter_node_comm, hw.inter_node_latency)


def ring_all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of an `nbytes` buffer on each of n ranks."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.latency + 2 * (n - 1) / n * nbytes / link.bandwidth


def tree_all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Double-binary-tree all-reduce: logarithmic latency, about twice the buffer on the wire."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.latency + 2 * nbytes / link.bandwidth


def all_reduce(nbytes: float, n: int, link: Link) -> float:
    """The faster of ring and tree, as NCCL's tuner chooses."""
    return min(ring_all_reduce(nbytes, n, link), tree_all_reduce(nbytes, n, link))


def reduce_scatter(nbytes: float, n: int, link: Link) -> float:
    """Reduce-scatter of an `nbytes` input per rank (each rank keeps nbytes/n)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.latency + (n - 1) / n * nbytes / link.bandwidth


def all_gather(nbytes: float, n: int, link: Link) -> float:
    """All-gather into an `nbytes` output per rank (each rank contributes nbytes/n)."""
    return reduce_scatter(nbytes, n, link)


def linear_pieces(kind: str, n: int, link: Link) -> tuple[tuple[float, float], ...]:
    """The collective as min over (latency, seconds per byte) pieces, so that for any positive size x
    collective(x) == min(a + b*x): all-reduce has a ring and a tree piece, reduce-scatter and all-gather one.
    The planner's linear model uses these; tests check them against the functions above."""
    if n <= 1:
        return ((0.0, 0.0),)
    if kind == "all_reduce":
        return ((2 * (n - 1) * link.latency, 2 * (n - 1) / n / link.bandwidth),
                (2 * math.ceil(math.log2(n)) * link.latency, 2 / link.bandwidth))
    return (((n - 1) * link.latency, (n - 1) / n / link.bandwidth),)


def p2p(nbytes: float, link: Link) -> float:
    """One point-to-point send between pipeline stages."""
    if nbytes <= 0:
        return 0.0
    return link.latency + nbytes / link.bandwidth


def bucketed_exposure(total_bytes: float, bucket_bytes: float, window: float, per_bucket) -> float:
    """Time a bucketed collective runs past the compute it overlaps with (paper 1: block size matters).

    Gradients become ready at a uniform rate during a `window` of compute and are reduced in buckets of
    `bucket_bytes`, one after another, each taking c = per_bucket(bucket_bytes). The stream cannot end before
    the last bucket, filled at the very end of the window, has been reduced (one bucket's time after the
    window; the whole buffer's if it is smaller than a bucket), nor before all total/bucket buckets have run
    back to back from the window's start. So
        exposed = max(per_bucket(min(bucket, total)), (total/bucket)*c - window)
    (a fluid model: it leaves out the wait for the first bucket, at most window/nb). Small buckets pay the
    latency alpha total/bucket times; large ones leave a large last bucket exposed.
    """
    if total_bytes <= 0:
        return 0.0
    last = per_bucket(min(bucket_bytes, total_bytes))
    return max(last, total_bytes / bucket_bytes * per_bucket(bucket_bytes) - window)
