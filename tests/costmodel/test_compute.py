"""Roofline time of an operator (Williams, Waterman & Patterson, "Roofline", CACM 2009): the slower of its
arithmetic at peak*efficiency and its traffic at bandwidth*efficiency; memory-bound kernels pay traffic only
(Ivanov et al. 2021, "Data movement is all you need")."""

from __future__ import annotations

import pytest

from autotune.costmodel import compute
from autotune.costmodel.ops import CATEGORIES, Op

from ._helpers import toy_hardware

HW = toy_hardware()  # 100 TFLOP/s, gemm eff 0.5, attention eff 0.4; 1 TB/s HBM, memory eff 0.8


def gemm(m: float, k: float, n: float, elem: int = 2) -> Op:
    return Op("gemm", "gemm", 2 * m * k * n, elem * (m * k + k * n + m * n), "gemm")


def test_gemm_with_huge_k_is_compute_bound():
    """m = n = 4096, k = 10^6: about 2000 FLOP per byte, far right of the ridge point
    (100e12 * 0.5) / (1e12 * 0.8) = 62.5 FLOP/B, so the time is FLOPs / (peak * gemm efficiency)."""
    op = gemm(4096, 1_000_000, 4096)
    assert op.flops / op.bytes > 1000
    assert compute.op_time(op, HW, "bf16") == pytest.approx(op.flops / (1e14 * 0.5))


def test_skinny_gemm_is_memory_bound():
    """A matrix-vector product (m = 1) has about one FLOP per byte: it is charged for its traffic."""
    op = gemm(1, 8192, 8192)
    assert compute.op_time(op, HW, "bf16") == pytest.approx(op.bytes / (1e12 * 0.8))


def test_elementwise_op_is_bytes_over_bandwidth():
    """Memory-bound kernels ignore their FLOPs, however many."""
    op = Op("gelu", "elementwise", 1e15, 4e9, "memory")
    assert compute.op_time(op, HW, "bf16") == pytest.approx(4e9 / (1e12 * 0.8))


def test_fused_attention_uses_the_attention_efficiency():
    op = Op("flash", "attention", 1e13, 1e6, "attention")
    assert compute.op_time(op, HW, "bf16") == pytest.approx(1e13 / (1e14 * 0.4))


def test_dtype_selects_the_peak_and_fp8_needs_fp8_cores():
    from dataclasses import replace

    from autotune.errors import SpecError

    hw = replace(HW, peak_flops_fp16=2e14)
    op = gemm(8192, 8192, 8192)
    assert compute.op_time(op, hw, "fp16") == pytest.approx(op.flops / (2e14 * 0.5))
    with pytest.raises(SpecError, match="fp8"):
        compute.op_time(op, HW, "fp8")


def test_pass_time_sums_kernels_by_category():
    """Kernels on one GPU run one after another: a pass is the sum, split by category."""
    ops = (gemm(4096, 4096, 4096), Op("norm", "norm", 0.0, 8e8, "memory"),
           Op("add", "elementwise", 0.0, 4e8, "memory"), gemm(4096, 4096, 4096))
    got = compute.pass_time(ops, HW, "bf16")
    g = compute.op_time(ops[0], HW, "bf16")
    assert got.seconds == pytest.approx(2 * g + 1.2e9 / 8e11)
    by = dict(zip(CATEGORIES, got.by_category))
    assert by["gemm"] == pytest.approx(2 * g)
    assert by["norm"] == pytest.approx(1e-3)
    assert by["elementwise"] == pytest.approx(5e-4)
    assert by["attention"] == by["vocab"] == 0.0
    assert got.flops == pytest.approx(2 * ops[0].flops)
