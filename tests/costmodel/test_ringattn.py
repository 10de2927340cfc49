"""costmodel/ringattn.py: what of context parallelism's K/V exchange the attention leaves exposed, per trainer,
pinned to hand calculations on links of round figures."""

from __future__ import annotations

import pytest

from autotune.catalog import load_hardware, load_model
from autotune.costmodel import comm
from autotune.costmodel.ops import LayerShape
from autotune.costmodel.ringattn import cp_exposed, kv_chunk_bytes, torch_ring_exposed

#: 100 GB/s, no latency: a collective's time is its bytes on the wire over 1e11
LINK = comm.Link(bandwidth=1e11, latency=0.0)


def test_torch_ring_hides_its_gathers_behind_one_step_and_waits_for_the_last_gradient_send():
    """cp 4, 1 GB of K/V a rank (fp32 dK/dV: 2 GB), attention 40 ms forward and 100 ms backward (10 and 25 ms a
    step). Forward: the all-gather moves 3/4 of 4 GB = 30 ms, of which step 0's 10 ms hides 10: 20 ms wait.
    Backward: the second gather 30 - 25 = 5 ms; the three middle dK/dV sends (20 ms) each hide behind a 25 ms
    step; the last one (20 ms) waits in full: 25 ms."""
    forward, backward = torch_ring_exposed(1e9, 2e9, 4, LINK, LINK, 0.040, 0.100)
    assert (forward, backward) == (pytest.approx(0.020), pytest.approx(0.025))
    # attention long enough to hide every gather still leaves the last gradient send
    assert torch_ring_exposed(1e9, 2e9, 4, LINK, LINK, 1.0, 1.0) == (0.0, pytest.approx(0.020))


def _shape(tokens: int, tp: int = 1) -> LayerShape:
    return LayerShape(tokens=tokens, kv_tokens=4 * tokens, mbs=1, tp=tp, sp=tp > 1, elem=2, flash=True, fused=True)


def test_megatron_ring_hides_each_send_behind_a_step_and_torchtitan_waits_longer():
    """Megatron's p2p ring: cp - 1 sends of the K/V chunk, hidden behind (cp - 1)/cp of the attention, the
    backward twice the bytes (the previous formula, kept); torch's gathers hide behind one step only, so the
    same exchange waits longer under torchtitan."""
    model, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    shape = _shape(32768)
    kv = kv_chunk_bytes(model, shape)
    assert kv == 2 * 2 * 32768 * 8 * 128  # K and V, 16-bit, 8 key/value heads of 128
    step = comm.p2p(kv, comm.p2p_link(hw, 4, 1))
    fwd, bwd = cp_exposed(model, hw, shape, 4, "megatron", 0.001, 0.002)
    assert (fwd, bwd) == (pytest.approx(3 * step - 0.75 * 0.001), pytest.approx(6 * step - 0.75 * 0.002))
    assert cp_exposed(model, hw, shape, 4, "megatron", 1.0, 1.0) == (0.0, 0.0)
    titan = cp_exposed(model, hw, shape, 4, "torchtitan", 1.0, 1.0)
    assert titan[0] == 0.0 and titan[1] == pytest.approx(comm.p2p(2 * kv, comm.p2p_link(hw, 4, 1)))
    assert cp_exposed(model, hw, shape, 1, "torchtitan", 0.0, 0.0) == (0.0, 0.0)


def test_torchtitan_context_parallelism_across_nodes_costs_more_than_megatrons():
    """cp 8 over 8 nodes (tp 8 fills each node): the all-gather crosses the network behind one step only."""
    model = load_model("llama3-70b")
    hw = load_hardware("h100-sxm")
    shape = _shape(8192, tp=8)
    megatron = cp_exposed(model, hw, shape, 8, "megatron", 0.004, 0.010)
    titan = cp_exposed(model, hw, shape, 8, "torchtitan", 0.004, 0.010)
    assert sum(titan) > sum(megatron)
