"""costmodel/epoverlap.py: Megatron's --overlap-moe-expert-parallel-comm, pinned to hand calculations of the paired
forward/backward it runs (the exchange hides behind the partner pass's compute as far as that lasts), and its
place in an estimate and a search."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.comm import comm_interference
from autotune.costmodel.epoverlap import ep_overlapped, hideable_exchange
from autotune.costmodel.estimate import CostModel
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan

HW = load_hardware("h100-sxm")


def test_an_exchange_shorter_than_the_compute_hides_whole_shared_as_the_passes_exchange():
    # forward 2 ms, backward 4 ms of all-to-all beside 10 ms of compute: all 6 ms hide, 2 of them the forward's
    assert hideable_exchange(0.002, 0.004, 0.010) == pytest.approx((0.002, 0.004))


def test_an_exchange_longer_than_the_compute_hides_only_the_compute():
    # 6 ms of exchange beside 3 ms of compute: 3 ms hide, in the passes' 1:2 proportion; 3 ms stay exposed
    assert hideable_exchange(0.002, 0.004, 0.003) == pytest.approx((0.001, 0.002))
    assert hideable_exchange(0.0, 0.0, 0.003) == (0.0, 0.0)


def _moe(model: str = "deepseek-v3") -> tuple[CostModel, Plan]:
    job = JobSpec(global_batch=8192, seq_len=4096, dtype="fp8", moe_imbalance=1.0)
    plan = Plan(tp=2, pp=8, dp=64, ep=64, etp=1, mbs=1, num_microbatches=128, zero=1, sequence_parallel=True,
                schedule="interleaved", vpp=4, vocab="balanced", layers_per_stage=(8, 8, 8, 8, 8, 8, 8, 5))
    return CostModel(load_model(model), HW, job), plan


def test_the_overlapped_layer_keeps_what_the_nccl_channels_take():
    """The hidden exchange leaves the exposed communication less the SMs it holds (16 channels of 132 SMs), and
    one more micro-batch's layer activations live at the peak."""
    cm, plan = _moe()
    layer = cm.layer(plan.tp, plan.cp, plan.mbs, True, "1d", False, plan.ep, plan.etp)
    over = ep_overlapped(layer, HW)
    kept = 1 - comm_interference(HW)
    assert layer.ep_hidden_fwd_s > 0 and layer.ep_hidden_bwd_s > 0
    assert over.tp_fwd_s == pytest.approx(layer.tp_fwd_s - kept * layer.ep_hidden_fwd_s)
    assert over.tp_bwd_s == pytest.approx(layer.tp_bwd_s - kept * layer.ep_hidden_bwd_s)
    assert over.buffers == layer.buffers + layer.act.none
    assert (over.fwd, over.bwd, over.params) == (layer.fwd, layer.bwd, layer.params)
    # a dense layer has nothing to overlap
    dense = CostModel(load_model("llama3-8b"), HW, JobSpec(global_batch=64, seq_len=4096))
    d = dense.layer(1, 1, 1, False)
    assert ep_overlapped(d, HW) is d


def test_the_overlap_shortens_the_step_and_costs_one_layer_of_memory():
    cm, plan = _moe()
    plain, over = cm.estimate(plan), cm.estimate(replace(plan, ep_overlap=True))
    assert over.step_time_s < plain.step_time_s
    assert plain.breakdown.tp_comm_s - over.breakdown.tp_comm_s > 0.2 * plain.breakdown.tp_comm_s
    assert over.peak_memory_bytes > plain.peak_memory_bytes


def test_only_the_steady_phase_pairs_its_passes():
    """megatron-core's combined schedule: without a pipeline the first forward and the last backward run alone
    ((m - 1) / m paired; none of one micro-batch); interleaved, the first rank's 2(pp - 1) + (vpp - 1) pp warm-up
    forwards and one more for the overlap run alone, and as many cool-down backwards (reviewer: one micro-batch
    was credited the whole overlap)."""
    from autotune.costmodel.epoverlap import paired_share
    assert paired_share(1, 1, 1) == 0.0 and paired_share(1, 1, 4) == 0.75
    assert paired_share(8, 4, 128) == pytest.approx((512 - (1 + 14 + 24)) / 512)
    assert paired_share(4, 2, 2) == 0.0  # every pass in warm-up or cool-down
    cm = CostModel(load_model("qwen3-30b-a3b"), HW, JobSpec(global_batch=512, seq_len=4096))
    one = Plan(tp=1, pp=1, dp=64, ep=8, mbs=8, num_microbatches=1, zero=1, layers_per_stage=(48,))
    plain, over = cm.estimate(one), cm.estimate(replace(one, ep_overlap=True))
    assert (over.step_time_s, over.peak_memory_bytes) == (plain.step_time_s, plain.peak_memory_bytes)


def test_the_search_never_overlaps_what_it_cannot_pair():
    """Mixtral-8x7B on 64 GPUs at a batch of 64 (reviewer): one micro-batch per replica at pp 1 pairs nothing, so
    no plan of the search overlaps there."""
    from autotune.search.space import SearchSpace, enumerate_candidates
    job = JobSpec(global_batch=64, seq_len=4096)
    for c in enumerate_candidates(load_model("mixtral-8x7b"), job, 64, 8, SearchSpace(pp=(1,), dp=(64,))):
        assert not c.ep_overlap, c
