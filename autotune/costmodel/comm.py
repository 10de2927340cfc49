"""Alpha-beta communication model (latency + size / bandwidth) for the collectives training uses.

Volumes per rank follow Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations
in MPICH" (2005): a ring all-reduce moves 2(n-1)/n of the buffer in 2(n-1) steps; reduce-scatter and
all-gather move (n-1)/n in n-1 steps; a (double binary) tree all-reduce takes 2*log2(n) latency steps and
moves about 2x the buffer. NCCL picks the faster, so all_reduce takes the minimum of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune.specs.hardware import HardwareSpec


@dataclass(frozen=True, slots=True)
class Link:
    """The tier a process group communicates over: bandwidth already scaled by the achieved fraction."""

    bandwidth: float
    """Bytes/s per GPU per direction that a collective achieves."""
    latency: float
    """Seconds per collective step over the slowest hop (alpha): the network when the group spans nodes."""
    ranks_per_node: int = 1
    """Members of the group inside one node; 1 = a flat group, every step pays `latency`."""
    intra_latency: float = 0.0
    """Seconds per step between members inside one node (used when ranks_per_node > 1)."""
    nic_bandwidth: float = field(default=0.0, compare=False)
    """Bytes/s one GPU's own NIC share achieves (set for groups spanning nodes): what an all-to-all's
    off-node traffic runs at, since every GPU sends to every other node at once. Derived from the hardware
    like the fields above, so it takes no part in comparing links."""


def group_link(hw: HardwareSpec, size: int, stride: int) -> Link:
    """The link a group of `size` ranks, `stride` ranks apart, uses for collectives. Ranks are numbered
    tp-fastest (Megatron's tp-cp-dp-pp order), so a group stays inside a node when it spans <= gpus_per_node
    ranks. A group spanning nodes with g members per node runs NCCL's rings and trees with one channel per
    NIC: each node boundary is crossed once per channel, so the node's g NICs carry the traffic together and
    the achieved bandwidth is min(NVLink, g x NIC), not one NIC (NCCL's topology search; nccl-tests' bus
    bandwidth on 8-GPU nodes with 8 NICs equals the node's total NIC rate). Latency is hierarchical: only
    the steps that cross nodes pay the network's alpha (NCCL src/graph/tuning.cc). A span that is no multiple
    of the node (tp 12 on 8-GPU nodes) splits its groups unevenly: the slowest has gcd(span, gpus_per_node) of
    its ranks on one side and sets the pace. (A span below the node that does not divide it, dp 3 x tp 2 on
    8-GPU nodes, is costed inside one node: exact for a job on part of one node, the common case; plans and
    estimates of more than one node refuse a tp that does not divide the node unless --allow-cross-node-tp.)"""
    intra_bw = hw.intra_node_bandwidth * hw.efficiency.intra_node_comm
    span = size * stride
    if span <= hw.gpus_per_node:
        return Link(intra_bw * mesh_share(hw, size), hw.intra_node_latency, max(1, size), hw.intra_node_latency)
    per_node = max(1, min(size, hw.gpus_per_node // max(1, stride)))  # members a node holds: the node count
    side = math.gcd(span, hw.gpus_per_node)  # ranks of the slowest group's smaller side: its NICs
    nics = max(1, min(per_node, side // stride)) if side % max(1, stride) == 0 else per_node
    nic = hw.nic_share * hw.inter_node_bandwidth * hw.efficiency.inter_node_comm
    return Link(min(intra_bw, nics * nic), hw.inter_node_latency, per_node, hw.intra_node_latency, nic)


def mesh_share(hw: HardwareSpec, size: int) -> float:
    """Share of the node's bandwidth a group of `size` GPUs inside it uses: 1 on a switch; on a full mesh of L
    links per GPU (MI300X: 7 of 64 GB/s, 448 GB/s in all) its size - 1 peers' links, as RCCL's rings and
    all-to-alls reach each peer over its own link (a pair gets one link, 64 GB/s, not 448)."""
    links = hw.intra_node_mesh_links
    return 1.0 if not links else min(max(size - 1, 1), links) / links


def p2p_link(hw: HardwareSpec, size: int, stride: int) -> Link:
    """The link of one pipeline send between neighbouring members of a group: NVLink when the whole group sits
    in one node, else one GPU's NIC (the slowest hop of the pipeline sets its pace)."""
    if size * stride <= hw.gpus_per_node:  # a send to one neighbour: one link of a mesh
        return Link(hw.intra_node_bandwidth * hw.efficiency.intra_node_comm * mesh_share(hw, 2), hw.intra_node_latency)
    return Link(hw.nic_share * hw.inter_node_bandwidth * hw.efficiency.inter_node_comm, hw.inter_node_latency)


def _nodes(n: int, link: Link) -> int:
    return -(-n // max(1, link.ranks_per_node))


def ring_latency(n: int, link: Link) -> float:
    """Latency of one ring pass (n-1 steps): the node-crossing steps pay the network alpha, the others the
    intra-node alpha (NCCL tuning.cc: (nsteps - nInterSteps) * intraLat + nInterSteps * interLat)."""
    nodes = _nodes(n, link)
    intra = link.intra_latency if link.ranks_per_node > 1 else link.latency
    return (nodes - 1) * link.latency + (n - nodes) * intra


def tree_latency(n: int, link: Link) -> float:
    """Latency of one tree pass: a chain inside the node and a binary tree over nodes (NCCL tuning.cc:
    (nRanks/nNodes - 1) * intraLat + log2(nNodes) * interLat)."""
    nodes = _nodes(n, link)
    per_node = min(n, max(1, link.ranks_per_node))
    inter = math.ceil(math.log2(nodes)) * link.latency if nodes > 1 else 0.0
    return inter + (per_node - 1) * (link.intra_latency if per_node > 1 else link.latency)


def ring_all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of an `nbytes` buffer on each of n ranks."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * ring_latency(n, link) + 2 * (n - 1) / n * nbytes / link.bandwidth


def tree_all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Double-binary-tree all-reduce: logarithmic latency over nodes, about twice the buffer on the wire."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * tree_latency(n, link) + 2 * nbytes / link.bandwidth


def all_reduce(nbytes: float, n: int, link: Link) -> float:
    """The faster of ring and tree, as NCCL's tuner chooses."""
    return min(ring_all_reduce(nbytes, n, link), tree_all_reduce(nbytes, n, link))


def reduce_scatter(nbytes: float, n: int, link: Link) -> float:
    """Reduce-scatter of an `nbytes` input per rank (each rank keeps nbytes/n)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return ring_latency(n, link) + (n - 1) / n * nbytes / link.bandwidth


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
        return ((2 * ring_latency(n, link), 2 * (n - 1) / n / link.bandwidth),
                (2 * tree_latency(n, link), 2 / link.bandwidth))
    return ((ring_latency(n, link), (n - 1) / n / link.bandwidth),)


def all_to_all(nbytes: float, n: int, link: Link) -> float:
    """All-to-all of an `nbytes` buffer per rank (1/n to each member, (n-1)/n leaving the rank): NCCL posts
    every send and receive at once, so one latency of the slowest tier plus the traffic of the busiest path.
    Inside a node all of it crosses NVLink; across nodes the (n - g)/n bound for the other nodes' g-member
    groups leaves through the GPU's own NIC while the (g-1)/n for its node-mates crosses NVLink alongside."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    g = max(1, link.ranks_per_node)
    if n <= g or not link.nic_bandwidth:
        return link.latency + (n - 1) / n * nbytes / link.bandwidth
    return link.latency + max((n - g) / n * nbytes / link.nic_bandwidth, (g - 1) / n * nbytes / link.bandwidth)


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


#: Channels NCCL runs a cross-node collective on in an 8-NIC node (two rings per NIC); each channel is one
#: CUDA block holding one SM for the collective's whole duration (NCCL's topology search, nChannels).
NCCL_CHANNELS = 16


def comm_interference(hw: HardwareSpec) -> float:
    """Share of the GPU a running NCCL collective takes from the compute it overlaps: its channels' SMs."""
    return min(1.0, NCCL_CHANNELS / hw.sm_count) if hw.sm_count else 0.0
