"""Properties every estimate must have, over random valid plans of a few catalog models (hypothesis)."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.estimate import CostModel
from autotune.errors import InvalidPlanError
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, check_plan, even_split

MODELS = ("gpt-1.7b", "llama3-8b", "qwen2.5-7b", "gemma2-9b", "bert-large")
GPUS = ("a100-80gb", "h100-sxm")
SETTINGS = settings(max_examples=300, deadline=None)


@cache
def _model(name):
    return load_model(name)


@cache
def _hw(name):
    return load_hardware(name)


@st.composite
def cases(draw):
    """(model, hardware, job, plan) with a plan that passes check_plan."""
    model = _model(draw(st.sampled_from(MODELS)))
    hw = _hw(draw(st.sampled_from(GPUS)))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if model.num_heads % t == 0 and model.num_kv_heads % t == 0]))
    pp = draw(st.integers(1, 4))
    dp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 1, 2]))
    mbs = draw(st.sampled_from([1, 2, 4]))
    seq = draw(st.sampled_from([512, 1024, 2048]))
    schedule, vpp = "1f1b", 1
    layers = even_split(model.num_layers, pp)
    m = draw(st.integers(1, 8))
    if pp > 1 and draw(st.booleans()):
        vpp = draw(st.sampled_from([2, 3]))
        if all(n % vpp == 0 for n in layers):
            schedule, m = "interleaved", pp * draw(st.integers(1, 3))
        else:
            vpp = 1
    plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, num_microbatches=m, schedule=schedule, vpp=vpp,
                recompute=draw(st.sampled_from(["none", "selective", "full"])),
                zero=draw(st.sampled_from([0, 1] if pp > 1 else [0, 1, 2, 3])),
                sequence_parallel=tp > 1 and draw(st.booleans()), layers_per_stage=layers,
                bucket_size=draw(st.sampled_from([1_000_000, 40_000_000])))
    job = JobSpec(global_batch=dp * mbs * m, seq_len=seq, flash_attention=draw(st.booleans()),
                  fused_kernels=draw(st.booleans()))
    try:
        check_plan(plan, model, job, plan.num_gpus, hw.gpus_per_node)
    except InvalidPlanError:
        assume(False)
    return model, hw, job, plan


def _estimate(model, hw, job, plan):
    return CostModel(model, hw, job).estimate(plan)


@SETTINGS
@given(case=cases(), extra_gib=st.integers(1, 200))
def test_more_memory_never_breaks_a_fitting_plan(case, extra_gib):
    model, hw, job, plan = case
    if _estimate(model, hw, job, plan).fits:
        bigger = replace(hw, memory_bytes=hw.memory_bytes + extra_gib * 2**30)
        assert _estimate(model, bigger, job, plan).fits


@SETTINGS
@given(case=cases(), field=st.sampled_from(["hbm_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth"]),
       factor=st.floats(1.0, 10.0))
def test_more_bandwidth_never_slows_a_step(case, field, factor):
    model, hw, job, plan = case
    before = _estimate(model, hw, job, plan).step_time_s
    faster = replace(hw, **{field: getattr(hw, field) * factor})
    assert _estimate(model, faster, job, plan).step_time_s <= before * (1 + 1e-12)


@SETTINGS
@given(case=cases(), field=st.sampled_from(["intra_node_latency", "inter_node_latency"]), factor=st.floats(0.0, 1.0))
def test_less_latency_never_slows_a_step(case, field, factor):
    model, hw, job, plan = case
    before = _estimate(model, hw, job, plan).step_time_s
    quicker = replace(hw, **{field: getattr(hw, field) * factor})
    assert _estimate(model, quicker, job, plan).step_time_s <= before * (1 + 1e-12)


@SETTINGS
@given(case=cases())
def test_recomputation_never_raises_activation_memory(case):
    """Korthikanti et al. 2022, Table 2: full <= selective <= none, stage by stage."""
    model, hw, job, plan = case
    cm = CostModel(model, hw, job)
    acts = {r: [s.memory.activations for s in cm.estimate(replace(plan, recompute=r)).stages]
            for r in ("none", "selective", "full")}
    for full, selective, none in zip(acts["full"], acts["selective"], acts["none"]):
        assert full <= selective <= none


@SETTINGS
@given(case=cases())
def test_estimates_are_sane(case):
    model, hw, job, plan = case
    est = _estimate(model, hw, job, plan)
    assert 0 < est.step_time_s < math.inf
    assert math.isclose(est.tokens_per_s * est.step_time_s, job.tokens_per_step, rel_tol=1e-9)
    assert 0 < est.mfu < 1
    assert all(s.memory.total > 0 and s.time_s > 0 for s in est.stages)
