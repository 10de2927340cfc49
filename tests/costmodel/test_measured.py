"""Measured op times: exact at measured points, log-log between them, roofline outside; comm tiers; CostModel."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autotune.catalog import PROFILES_DIR, load_hardware, load_model
from autotune.costmodel.compute import op_time, pass_time
from autotune.costmodel.estimate import CostModel
from autotune.costmodel.layer import layer_shape
from autotune.costmodel.measured import MeasuredOps, apply_comm, profile_warnings, step_ops
from autotune.costmodel.ops import Op
from autotune.errors import SpecError
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan
from autotune.specs.profile import CommTier, Device, Libraries, OpPoint, Profile

HW = load_hardware("h100-sxm")
MODEL = load_model("tiny-gpt")
JOB = JobSpec(global_batch=8, seq_len=256)


def profile(points: tuple[OpPoint, ...], comm: dict | None = None, model: str | None = "tiny-gpt") -> Profile:
    return Profile(path="p.json", created="2026-01-01", device=Device(kind="cpu", name="Test CPU", threads=1),
                   libraries=Libraries(torch="t", python="p", autotune="a"), model=model, seq_len=256, dtype="bf16",
                   ops=points, comm=comm or {})


def point(name: str, tp: int, flops: float, nbytes: float, seconds: float) -> OpPoint:
    return OpPoint(op=name, tp=tp, mbs=1, sp=False, flops=flops, bytes=nbytes, seconds=seconds, stdev_seconds=0.0,
                   repeats=1)


GEMM_POINTS = (point("qkv_proj", 1, 1e9, 1e6, 1e-3), point("qkv_proj", 1, 4e9, 2e6, 2e-3),
               point("qkv_proj", 1, 16e9, 4e6, 16e-3), point("input_norm", 1, 1e5, 1e6, 1e-4),
               point("input_norm", 1, 4e5, 4e6, 4e-4))


def gemm(flops: float, nbytes: float = 1.0) -> Op:
    return Op("qkv_proj", "gemm", flops, nbytes, "gemm")


def test_measured_points_are_reproduced_exactly():
    m = MeasuredOps(profile(GEMM_POINTS))
    for p in GEMM_POINTS:
        kernel = "gemm" if p.op == "qkv_proj" else "memory"
        op = Op(p.op, "gemm" if kernel == "gemm" else "norm", p.flops, p.bytes, kernel)
        assert m.seconds(op, 1) == pytest.approx(p.seconds, rel=1e-12)


def test_interpolation_is_linear_in_log_log():
    m = MeasuredOps(profile(GEMM_POINTS))
    # between (1e9, 1 ms) and (4e9, 2 ms): t ~ flops^0.5, so 2e9 FLOPs -> sqrt(2) ms
    assert m.seconds(gemm(2e9), 1) == pytest.approx(math.sqrt(2) * 1e-3)
    # memory ops interpolate over bytes, whatever their FLOPs
    norm = Op("input_norm", "norm", 123.0, 2e6, "memory")
    assert m.seconds(norm, 1) == pytest.approx(2e-4)


def test_outside_the_range_or_unmeasured_falls_back():
    m = MeasuredOps(profile(GEMM_POINTS))
    assert m.seconds(gemm(0.5e9), 1) is None and m.seconds(gemm(20e9), 1) is None
    assert m.seconds(gemm(2e9), 2) is None  # tp 2 not measured
    assert m.seconds(Op("mlp_up", "gemm", 2e9, 1.0, "gemm"), 1) is None
    assert m.hits == 0 and m.misses == 4


def test_pass_time_uses_measured_where_available():
    m = MeasuredOps(profile(GEMM_POINTS))
    ops = (gemm(4e9), Op("mlp_up", "gemm", 4e9, 1e6, "gemm"))
    got = pass_time(ops, HW, "bf16", m.lookup(1))
    assert got.seconds == pytest.approx(2e-3 + op_time(ops[1], HW, "bf16"))
    assert pass_time(ops, HW, "bf16").seconds == pytest.approx(sum(op_time(o, HW, "bf16") for o in ops))


def test_apply_comm_replaces_only_the_measured_tier():
    tier = CommTier(backend="gloo", nproc=2, alpha_us=50.0, bandwidth_GBps=2.0, max_error_pct=1.0, collectives={},
                    points=())
    hw = apply_comm(profile((), {"intra_node": tier}), HW)
    assert hw.intra_node_latency == pytest.approx(50e-6) and hw.intra_node_bandwidth == pytest.approx(2e9)
    assert hw.efficiency.intra_node_comm == 1.0
    assert hw.inter_node_bandwidth == HW.inter_node_bandwidth and hw.efficiency.gemm == HW.efficiency.gemm


def _full_profile(scale: float) -> Profile:
    """Every op of tiny-gpt at tp 1, mbs 1 and 2, each 'measured' at scale x its roofline time."""
    points = []
    for mbs in (1, 2):
        for op in step_ops(MODEL, layer_shape(MODEL, JOB, tp=1, cp=1, mbs=mbs, sp=False)):
            points.append(OpPoint(op=op.name, tp=1, mbs=mbs, sp=False, flops=op.flops, bytes=op.bytes,
                                  seconds=scale * op_time(op, HW, "bf16"), stdev_seconds=0.0, repeats=1))
    return profile(tuple(points))


def _plan(mbs: int, tp: int = 1) -> Plan:
    return Plan(tp=tp, pp=1, dp=8 // tp, cp=1, mbs=mbs, num_microbatches=1, layers_per_stage=(4,),
                sequence_parallel=False)


def test_cost_model_with_a_profile():
    base = CostModel(MODEL, HW, JOB).estimate(_plan(1))
    cm = CostModel(MODEL, HW, JOB, _full_profile(3.0))
    est = cm.estimate(_plan(1))
    assert est.breakdown.compute_s == pytest.approx(3 * base.breakdown.compute_s, rel=1e-9)
    cov = cm.op_coverage(_plan(1))
    assert cov.measured == cov.total == 34 and cov.fallback == ()
    partial = cm.op_coverage(_plan(1, tp=2))
    assert partial.measured == 0 and "qkv_proj" in partial.fallback
    assert "34 of 34 measured" in cov.line() and "roofline for the rest" in partial.line()
    assert CostModel(MODEL, HW, JOB).op_coverage(_plan(1)).as_dict()["source"] == "roofline"


def test_profile_for_another_model_is_rejected_and_mismatches_warn():
    with pytest.raises(SpecError, match="measured for model 'tiny-gpt', not 'gpt-1.7b'"):
        CostModel(load_model("gpt-1.7b"), HW, JOB, _full_profile(1.0))
    # a config.json that is the catalog model exactly (catalog_name) has its shapes (user-tester: refused by path)
    CostModel(replace(MODEL, name="/data/tiny/config.json", catalog_name=MODEL.name), HW, JOB, _full_profile(1.0))
    warnings = profile_warnings(_full_profile(1.0), HW, "fp16")
    assert len(warnings) == 2 and "measured on cpu" in warnings[0] and "fp16" in warnings[1]
    gpu = replace(_full_profile(1.0), device=Device(kind="cuda", name="NVIDIA H100 80GB HBM3", threads=1))
    assert profile_warnings(gpu, HW, "bf16") == ()


def test_op_names_cover_every_op_the_cost_model_asks_for():
    """The names a profile may hold are those the lookups use: a catalog model's step ops at its jobs' kernel
    choices, and the shipped profiles' points."""
    from autotune.catalog import model_names
    from autotune.costmodel.measured import op_names
    from autotune.specs.profile import load_profile
    for name in model_names():
        model = load_model(name)
        known = op_names(model, 4096)
        for flash, fused, dtype in ((True, True, "bf16"), (False, False, "bf16"), (True, True, "fp8")):
            job = JobSpec(global_batch=8, seq_len=4096, flash_attention=flash, fused_kernels=fused, dtype=dtype)
            for tp, cp, sp in ((1, 1, False), (2, 2, True)):
                names = {op.name for op in step_ops(model, layer_shape(model, job, tp=tp, cp=cp, mbs=1, sp=sp))}
                assert names <= known, (name, names - known)
    for path in sorted((PROFILES_DIR / "measured").glob("*.json")):
        if '"autotune-profile/1"' in path.read_text()[:200]:  # the microbenchmark files have their own schema
            prof = load_profile(path)
            assert {p.op for p in prof.ops} <= op_names(load_model(prof.model), prof.seq_len), path


def test_unknown_op_names_and_empty_profiles_are_errors():
    from autotune.costmodel.measured import check_profile_model, check_profile_ops
    check_profile_ops(profile(GEMM_POINTS), MODEL)  # known names pass
    with pytest.raises(SpecError, match=r"ops\[1\]\.op: 'flash_atention' is not an op the cost model times for "
                                        r"tiny-gpt; did you mean 'flash_attention'\?.*known ops: .*qkv_proj"):
        check_profile_ops(profile((GEMM_POINTS[0], point("flash_atention", 1, 1e9, 1e6, 1e-3))), MODEL)
    with pytest.raises(SpecError, match="the profile has no ops .*run `autotune profile --model tiny-gpt"):
        check_profile_model(profile(()), MODEL)
    check_profile_model(profile((), comm={"intra_node": None}), MODEL)  # a comm-only profile is fine


LONG_CONTEXT = sorted((PROFILES_DIR / "measured").glob("h100-sxm-llama3*-s*-cp*.torch-eager.json"))


@pytest.mark.parametrize("path", LONG_CONTEXT, ids=lambda p: p.name.split(".torch")[0])
def test_cudnn_attention_figures_match_long_context_ring_attention_timed_on_an_h100(path):
    """The shipped long-context profiles (`autotune profile --device cuda --seq-len S --cp C`, torch 2.11, whose
    SDPA picks cuDNN on an H100, as torchtitan asks) time one rank's ring-attention kernels at 32k tokens per
    GPU; the hardware file's cuDNN figures ("sdpa_cudnn") must price them within 15%, the FlashAttention-2
    figures ("sdpa") at about twice their time."""
    from autotune.profiling.optimer import enumerate_jobs
    from autotune.specs.profile import load_profile

    prof, hw = load_profile(path), load_hardware("h100-sxm")
    measured = {(p.op, p.tp, p.cp, p.sp): p.seconds for p in prof.ops}
    tp, cp = prof.ops[0].tp, prof.ops[0].cp
    jobs = [j for j in enumerate_jobs(load_model(prof.model), prof.seq_len, (tp,), (1,), (cp,))
            if j.op.name in ("flash_attention", "flash_attention_bwd")]
    assert len(jobs) == 2
    for j in jobs:
        seconds = measured[(j.op.name, tp, cp, False)]
        assert op_time(j.op, hw, "bf16", "sdpa_cudnn") == pytest.approx(seconds, rel=0.15), j.op.name
        assert 1.7 < op_time(j.op, hw, "bf16", "sdpa") / seconds < 2.3, j.op.name
