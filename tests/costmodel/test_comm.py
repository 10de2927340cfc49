"""Alpha-beta collectives pinned to Thakur, Rabenseifner & Gropp 2005, and the bucketed overlap pinned to an
event simulation of one serial communication stream."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.costmodel import comm

from ._helpers import toy_hardware

BW = 1e10
NO_LATENCY = comm.Link(bandwidth=BW, latency=0.0)


# ------------------------------------------------------------------------------ volumes (Thakur et al. 2005)
@pytest.mark.parametrize("n", [2, 3, 4, 8, 64, 1000])
def test_ring_all_reduce_moves_2_n_minus_1_over_n_of_the_buffer(n):
    """Thakur et al. 2005, Sec. 4.4 (reduce-scatter + all-gather): each rank sends 2(n-1)/n of the buffer."""
    nbytes = 3e9
    assert comm.ring_all_reduce(nbytes, n, NO_LATENCY) * BW == pytest.approx(2 * (n - 1) / n * nbytes)


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_reduce_scatter_and_all_gather_move_n_minus_1_over_n(n):
    """Thakur et al. 2005, Sec. 4.1 and 4.3 (ring): (n-1)/n of the full buffer per rank."""
    nbytes = 1e9
    assert comm.reduce_scatter(nbytes, n, NO_LATENCY) * BW == pytest.approx((n - 1) / n * nbytes)
    assert comm.all_gather(nbytes, n, NO_LATENCY) * BW == pytest.approx((n - 1) / n * nbytes)


@pytest.mark.parametrize("fn", [comm.ring_all_reduce, comm.tree_all_reduce, comm.all_reduce, comm.reduce_scatter,
                                comm.all_gather])
def test_a_group_of_one_and_an_empty_buffer_are_free(fn):
    link = comm.Link(bandwidth=BW, latency=1e-5)
    assert fn(1e9, 1, link) == 0.0
    assert fn(0.0, 8, link) == 0.0
    assert comm.p2p(0.0, link) == 0.0


@pytest.mark.parametrize("n", [2, 8, 33])
def test_latency_terms(n):
    """Ring all-reduce: 2(n-1) steps; reduce-scatter/all-gather: n-1 steps; tree: 2*ceil(log2 n) steps."""
    alpha = 7e-6
    link = comm.Link(bandwidth=math.inf, latency=alpha)
    assert comm.ring_all_reduce(1.0, n, link) == pytest.approx(2 * (n - 1) * alpha)
    assert comm.reduce_scatter(1.0, n, link) == pytest.approx((n - 1) * alpha)
    assert comm.all_gather(1.0, n, link) == pytest.approx((n - 1) * alpha)
    assert comm.tree_all_reduce(1.0, n, link) == pytest.approx(2 * math.ceil(math.log2(n)) * alpha)
    assert comm.p2p(1.0, link) == pytest.approx(alpha)


def test_all_reduce_is_the_faster_of_ring_and_tree():
    """NCCL's tuner picks the faster algorithm: a tree for small messages on many ranks (fewer latency
    steps), a ring for large ones (2(n-1)/n < 2 of the buffer)."""
    link = comm.Link(bandwidth=BW, latency=10e-6)
    for nbytes, n in [(1e3, 64), (1e4, 512), (1e9, 64), (1e9, 8), (5e6, 16)]:
        ring, tree = comm.ring_all_reduce(nbytes, n, link), comm.tree_all_reduce(nbytes, n, link)
        assert comm.all_reduce(nbytes, n, link) == min(ring, tree)
    assert comm.all_reduce(1e3, 64, link) == comm.tree_all_reduce(1e3, 64, link) < comm.ring_all_reduce(1e3, 64, link)
    assert comm.all_reduce(1e9, 64, link) == comm.ring_all_reduce(1e9, 64, link) < comm.tree_all_reduce(1e9, 64, link)


@pytest.mark.parametrize(("size", "stride", "intra"), [
    (8, 1, True), (4, 2, True), (2, 4, True), (1, 8, True),
    (16, 1, False), (8, 2, False), (2, 8, False), (3, 3, False),
])
def test_group_link_stays_in_the_node_iff_it_spans_at_most_a_node(size, stride, intra):
    """Ranks are numbered tp-fastest; a group of `size` ranks `stride` apart spans size*stride ranks."""
    hw = toy_hardware(gpus_per_node=8)
    link = comm.group_link(hw, size, stride)
    nvlink = hw.intra_node_bandwidth * hw.efficiency.intra_node_comm
    if intra:
        assert link == comm.Link(nvlink, hw.intra_node_latency, size, hw.intra_node_latency)
    else:
        per_node = max(1, min(size, 8 // stride))
        nic = hw.inter_node_bandwidth * hw.efficiency.inter_node_comm
        assert link == comm.Link(min(nvlink, per_node * nic), hw.inter_node_latency, per_node,
                                 hw.intra_node_latency)


def test_a_group_with_g_members_per_node_gets_g_nics_up_to_nvlink():
    """NCCL runs one channel per NIC and crosses each node boundary once per channel, so a data-parallel group
    with g members per node gets min(NVLink, g x NIC): nccl-tests' multi-node bus bandwidth on DGX H100
    (8 x 400 Gb/s) is the node's NIC total, ~8 x 50 GB/s, not one NIC."""
    hw = toy_hardware(gpus_per_node=8)
    nic = hw.inter_node_bandwidth * hw.efficiency.inter_node_comm
    nvlink = hw.intra_node_bandwidth * hw.efficiency.intra_node_comm
    assert comm.group_link(hw, 64, 8).bandwidth == pytest.approx(nic)           # tp 8: one member per node
    assert comm.group_link(hw, 64, 2).bandwidth == pytest.approx(min(nvlink, 4 * nic))
    assert comm.group_link(hw, 64, 1).bandwidth == pytest.approx(min(nvlink, 8 * nic))
    assert comm.p2p_link(hw, 16, 8).bandwidth == pytest.approx(nic)             # one pipeline send, one NIC


def test_hierarchical_latency_follows_nccl_tuning():
    """NCCL src/graph/tuning.cc: a ring all-reduce pays 2(nNodes-1) network steps and the rest inside the
    node; a tree pays log2(nNodes) network steps and a chain of nRanks/nNodes - 1 inside each node, per pass.
    So with 8 ranks per node, doubling the group from 64 to 128 ranks adds 16 intra and 16 network ring
    steps, and one network step per tree pass."""
    a_net, a_nv = 15e-6, 3e-6
    link = comm.Link(bandwidth=math.inf, latency=a_net, ranks_per_node=8, intra_latency=a_nv)
    assert comm.ring_all_reduce(1.0, 64, link) == pytest.approx(2 * (7 * a_net + 56 * a_nv))
    assert comm.tree_all_reduce(1.0, 64, link) == pytest.approx(2 * (3 * a_net + 7 * a_nv))
    assert comm.tree_all_reduce(1.0, 128, link) - comm.tree_all_reduce(1.0, 64, link) == pytest.approx(2 * a_net)
    assert comm.reduce_scatter(1.0, 64, link) == pytest.approx(7 * a_net + 56 * a_nv)
    # the all-reduce latency of a 1024-rank data-parallel group is a few hundred microseconds, not 2*1023*alpha
    assert comm.all_reduce(1.0, 1024, link) < 2 * (7 * a_nv + 7 * a_net) + 1e-12


def test_group_link_follows_gpus_per_node():
    hw = replace(toy_hardware(), gpus_per_node=4)
    assert comm.group_link(hw, 8, 1).latency == hw.inter_node_latency
    assert comm.group_link(hw, 4, 1).latency == hw.intra_node_latency


def test_a_span_that_is_no_multiple_of_the_node_splits_its_groups_by_the_gcd():
    """tp 12 on 8-GPU nodes (--allow-cross-node-tp): ranks 0-11 put 8 on node 0 and 4 on node 1, ranks 12-23 4 and
    8: the slowest group has gcd(12, 8) = 4 ranks on one side, so 4 NICs, not 8 (reviewer). A job on part of one
    node (6 of 8 GPUs: dp 3 x tp 2) keeps every group inside it (reviewer: costed over the NIC for a day)."""
    hw = toy_hardware(gpus_per_node=8)
    nic = hw.inter_node_bandwidth * hw.efficiency.inter_node_comm
    nvlink = hw.intra_node_bandwidth * hw.efficiency.intra_node_comm
    link = comm.group_link(hw, 12, 1)  # 4 NICs carry it; its steps count 2 nodes of up to 8, not 3 of 4
    assert link == comm.Link(min(nvlink, 4 * nic), hw.inter_node_latency, 8, hw.intra_node_latency, nic)
    assert comm._nodes(12, link) == 2
    for size, stride in ((3, 2), (2, 1), (6, 1), (3, 1)):
        assert comm.group_link(hw, size, stride).latency == hw.intra_node_latency
    assert comm.p2p_link(hw, 1, 6).latency == hw.intra_node_latency


def test_a_tp_that_does_not_divide_the_node_is_refused_unless_allowed():
    """tp 4 on 6-GPU nodes puts some tp groups across two nodes: refused as a tp above the node is (plan's
    space leaves it out, estimate and check_plan refuse it), accepted with --allow-cross-node-tp; a job on part
    of one node has every group inside it, whatever its tp."""
    from autotune.catalog import load_model
    from autotune.errors import InvalidPlanError
    from autotune.search.space import SearchSpace, tp_options
    from autotune.specs.job import JobSpec
    from autotune.specs.plan import Plan, check_plan

    model = load_model("llama3-70b")
    assert [tp for _, tp in tp_options(model, 48, 6, SearchSpace())] == [1, 2]
    assert [tp for _, tp in tp_options(model, 6, 8, SearchSpace())] == [1, 2, 4, 8]  # one node in part: any tp fits
    assert 4 in [tp for _, tp in tp_options(model, 48, 6, SearchSpace(allow_cross_node_tp=True))]
    plan = Plan(tp=4, pp=4, dp=3, mbs=1, num_microbatches=16, recompute="full", layers_per_stage=(20,) * 4)
    job = JobSpec(global_batch=48, seq_len=8192)
    with pytest.raises(InvalidPlanError, match="tp 4 does not divide the 6 GPUs of a node, so some tp groups"):
        check_plan(plan, model, job, 48, 6)
    check_plan(plan, model, job, 48, 6, allow_cross_node_tp=True)
    check_plan(plan, model, job, 48, 8)
    check_plan(replace(plan, pp=1, dp=1, layers_per_stage=(80,), num_microbatches=4), model,
               JobSpec(global_batch=4, seq_len=8192), 4, 6)  # a job inside one node of 6


def test_a_full_mesh_gives_a_group_its_peers_links():
    """MI300X: 7 Infinity Fabric links of 64 GB/s per direction, one to each peer (448 GB/s in all). A tp-2 pair
    reaches its peer over one link, 64 GB/s, a group of 4 over 3 links, the whole node over all 7; a pipeline send
    uses one. A switched node (H100's NVSwitch) gives every group the whole bandwidth (user-tester: MI300X's tp 2
    was costed at 448 GB/s, 7x too fast)."""
    from autotune.catalog import load_hardware

    mi = load_hardware("mi300x")
    full = mi.intra_node_bandwidth * mi.efficiency.intra_node_comm
    assert mi.intra_node_mesh_links == 7 and mi.intra_node_bandwidth == pytest.approx(448e9)
    for size, links in ((2, 1), (4, 3), (8, 7)):
        assert comm.group_link(mi, size, 1).bandwidth == pytest.approx(full * links / 7)
    assert comm.p2p_link(mi, 4, 1).bandwidth == pytest.approx(full / 7)
    h100 = load_hardware("h100-sxm")
    assert comm.group_link(h100, 2, 1).bandwidth == h100.intra_node_bandwidth * h100.efficiency.intra_node_comm

# ------------------------------------------------------------------------------ bucketed overlap
def simulate_buckets(total: float, bucket: float, window: float, per_bucket) -> float:
    """Event simulation: nb = ceil(total/bucket) equal buckets; bucket j (1..nb) becomes ready at j*window/nb
    (gradients appear at a uniform rate during the window); one communication stream runs them in order,
    each starting when it is ready and the previous one is done. Returns finish time minus window."""
    nb = max(1, math.ceil(total / bucket))
    c = per_bucket(total / nb)
    done = 0.0
    for j in range(1, nb + 1):
        done = max(done, j * window / nb) + c
    return done - window


@settings(max_examples=300, deadline=None)
@given(total=st.floats(1e3, 1e10), bucket=st.floats(1e3, 1e10), window=st.floats(0.0, 10.0),
       bw=st.floats(1e8, 1e12), alpha=st.floats(0.0, 1e-3), n=st.integers(2, 64))
def test_bucketed_exposure_brackets_an_event_simulation(total, bucket, window, bw, alpha, n):
    """The fluid closed form leaves out only the wait for the first bucket: for a whole number of buckets
    it lies in [simulated - window/nb, simulated]."""
    link = comm.Link(bandwidth=bw, latency=alpha)

    def per(size):
        return comm.all_reduce(size, n, link)

    bucket = float(int(bucket))  # whole bytes, so total/bucket is exactly nb in floating point
    nb = math.ceil(total / bucket)
    if nb > 20000:  # keep the simulation loop short
        return
    total = nb * bucket  # whole buckets
    got = comm.bucketed_exposure(total, bucket, window, per)
    want = simulate_buckets(total, bucket, window, per)
    assert want - window / nb - 1e-12 * (1 + want) <= got <= want * (1 + 1e-9) + 1e-12


def test_bucketed_exposure_regimes():
    """Comm keeps up (fast link, long window): only the last bucket shows. Comm-bound (slow link): everything
    but the window shows."""
    def per(size):
        return size / 1e9  # 1 GB/s, no latency

    total, bucket = 8e6, 1e6  # 8 buckets of 1 MB, 1 ms each
    assert comm.bucketed_exposure(total, bucket, 1.0, per) == pytest.approx(1e-3)
    window = 1e-3
    assert comm.bucketed_exposure(total, bucket, window, per) == pytest.approx(8e-3 - window)
    assert comm.bucketed_exposure(0.0, bucket, 1.0, per) == 0.0
    # one bucket larger than the whole buffer: nothing overlaps, the whole collective shows
    assert comm.bucketed_exposure(total, 1e9, 5.0, per) == pytest.approx(8e-3)


@settings(max_examples=200, deadline=None)
@given(nbytes=st.floats(1.0, 1e11), n=st.integers(1, 4096), bw=st.floats(1e8, 1e12), alpha=st.floats(0.0, 1e-4))
def test_linear_pieces_reproduce_each_collective(nbytes, n, bw, alpha):
    """The planner's linear pieces are the collectives themselves: min over pieces == the function."""
    link = comm.Link(bandwidth=bw, latency=alpha)
    for kind, fn in (("all_reduce", comm.all_reduce), ("reduce_scatter", comm.reduce_scatter),
                     ("all_gather", comm.all_gather)):
        got = min(a + b * nbytes for a, b in comm.linear_pieces(kind, n, link))
        assert got == pytest.approx(fn(nbytes, n, link), rel=1e-12, abs=1e-15)
