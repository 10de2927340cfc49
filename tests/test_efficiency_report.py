"""The H100-class hardware files' efficiency figures against the kernel measurements they cite
(profiles/measured/h100-sxm-microbench*.json, reduced by autotune/reports/efficiency.py), and the GEMM
model's k term against a hand calculation."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from autotune.catalog import PROFILES_DIR, load_hardware
from autotune.costmodel.compute import (ATTENTION_BWD_LENGTH_SCALE, ATTENTION_HEAD_DIM_64, ATTENTION_LENGTH_SCALE,
                                        BLOCK_BWD_LENGTH_SCALE, BLOCK_LENGTH_SCALE, attention_shape_scale,
                                        compute_efficiency, gemm_k_efficiency, gemm_shape_efficiency,
                                        gemm_wave_efficiency)
from autotune.costmodel.ops import Op
from autotune.errors import SpecError
from autotune.reports import efficiency as ef

MEASURED = PROFILES_DIR / "measured"
FILES = ("h100-sxm-microbench.json", "h100-sxm-microbench-cublaslt.json", "h100-sxm-microbench-attention.json",
         "h100-sxm-microbench-fp8.json")


@pytest.fixture(scope="module")
def docs():
    return {name: ef.load(MEASURED / name) for name in FILES}


@pytest.fixture(scope="module")
def h100():
    return load_hardware("h100-sxm")


def test_k_term_by_hand():
    assert gemm_k_efficiency(350, 350) == 0.5
    assert gemm_k_efficiency(4096, 100) == pytest.approx(4096 / 4196)
    assert gemm_k_efficiency(1024, 0) == 1.0


def test_gemm_shape_efficiency_by_hand():
    """(512, 2304, 16384), a 405B tp8 qkv chunk under TP overlap: 4 x 9 tiles of 128x256 fill them exactly;
    units = 36 x 16384/1024 = 576; fill 2 x 132 SMs = 264."""
    assert gemm_shape_efficiency(512, 2304, 16384, 132, 1, 100, 2.0) == pytest.approx(
        16384 / 16484 * 576 / (576 + 264))
    # partial tiles: m 300 fills 300 of 384 rows; no fill figure -> the fixed-tile wave model
    assert gemm_shape_efficiency(300, 256, 1024, 132, 1, 0, 2.0) == pytest.approx(300 / 384 * 3 / (3 + 264))
    assert gemm_shape_efficiency(8192, 1280, 8192, 132, 1, 0, 0.0) == gemm_wave_efficiency(8192, 1280, 132)


def test_gemm_efficiency_is_ceiling_times_shape(h100):
    op = Op("qkv", "gemm", 2.0 * 8192 * 1280 * 8192, 0.0, "gemm", (8192, 1280, 8192))
    shape = gemm_shape_efficiency(8192, 1280, 8192, 132, 1, 100, 2.0)
    assert compute_efficiency(op, h100, "bf16") == pytest.approx(0.74 * shape)
    assert compute_efficiency(op, h100, "bf16", "sdpa") == pytest.approx(0.72 * shape)
    assert compute_efficiency(op, h100, "fp8") == pytest.approx(
        0.62 * gemm_shape_efficiency(8192, 1280, 8192, 132, 1, 450, 2.0))


def _fit(doc, dtype):
    peak = 989 if dtype == "bf16" else 1979
    return ef.fit_gemm(ef.gemm_points(doc, ef.GEMM_FIT_SECTIONS[dtype], dtype), peak, 132)


def test_shipped_gemm_figures_are_the_measured_fits(docs, h100):
    """gemm from the cuBLASLt file, gemm_torch from torch's default BLAS, gemm_fp8 the mean over the three files
    with FP8 points; every k0 within a grid step or two of the shipped one."""
    lt, default = _fit(docs["h100-sxm-microbench-cublaslt.json"], "bf16"), _fit(docs["h100-sxm-microbench.json"], "bf16")
    assert (h100.efficiency.gemm, h100.efficiency.gemm_torch) == pytest.approx((lt.ceiling, default.ceiling), abs=0.005)
    assert lt.k0 == default.k0 == h100.efficiency.gemm_k0 and h100.efficiency.gemm_fill == ef.GEMM_FILL
    fp8 = [_fit(d, "fp8") for d in docs.values() if ef.gemm_points(d, ("gemm_fp8",), "fp8")]
    assert len(fp8) == 3
    assert h100.efficiency.gemm_fp8 == pytest.approx(statistics.fmean(f.ceiling for f in fp8), abs=0.005)
    assert all(abs(f.k0 - h100.efficiency.gemm_fp8_k0) <= 50 for f in fp8)


def test_the_gemm_model_beats_the_fixed_ceiling_on_held_out_shapes(docs, h100):
    """40 random training-like shapes in three layouts, never fitted: a third of the old model's RMS log error."""
    for name in ("h100-sxm-microbench.json", "h100-sxm-microbench-cublaslt.json"):
        held = ef.gemm_points(docs[name], ef.GEMM_HELD_OUT["bf16"], "bf16")
        assert len(held) == 120
        rms, mean = ef.held_out_error(held, h100.efficiency.gemm, h100.efficiency.gemm_k0, 989, 132)
        old_rms, old_mean = ef.held_out_error(held, 0.82, 0.0, 989, 132, fill=0.0)
        assert rms < 0.13 and abs(mean) < 0.06
        assert old_rms > 0.3 and old_mean < -0.15  # the fixed ceiling was optimistic
    for doc in docs.values():
        held = ef.gemm_points(doc, ef.GEMM_HELD_OUT["fp8"], "fp8")
        if held:
            rms, _ = ef.held_out_error(held, h100.efficiency.gemm_fp8, h100.efficiency.gemm_fp8_k0, 1979, 132)
            assert rms < 0.21


def test_attention_figures_are_the_measured_ones(docs, h100):
    with_attention = [d for d in docs.values() if d["sections"].get("attention")]
    assert len(with_attention) == 3
    fwd = statistics.fmean(ef.attention_forward(d, "cudnn", 989) for d in with_attention)
    sdpa = statistics.fmean(ef.attention_forward(d, "flash", 989) for d in with_attention)
    bwd = statistics.fmean(ef.attention_bwd_ratio(d) for d in with_attention)
    assert (h100.efficiency.attention, h100.efficiency.attention_sdpa, h100.efficiency.attention_bwd_ratio) == \
        pytest.approx((fwd, sdpa, bwd), abs=0.006)
    scales = ef.length_scales(docs["h100-sxm-microbench.json"])
    table_fwd, table_bwd = dict(ATTENTION_LENGTH_SCALE), dict(ATTENTION_BWD_LENGTH_SCALE)
    for seq in (512, 1024, 2048):
        assert table_fwd[seq] == pytest.approx(scales[seq][0], abs=0.006)
    for seq in (512, 1024, 2048, 4096):
        assert table_bwd[seq] == pytest.approx(scales[seq][1], abs=0.006)
    blocks = ef.block_scales(docs["h100-sxm-microbench-attention.json"])
    for side in (512, 1024, 2048, 4096):
        assert dict(BLOCK_LENGTH_SCALE)[side] == pytest.approx(blocks[side][0], abs=0.006)
        assert dict(BLOCK_BWD_LENGTH_SCALE)[side] == pytest.approx(blocks[side][1], abs=0.006)
    a = docs["h100-sxm-microbench.json"]
    assert ATTENTION_HEAD_DIM_64["fused"] == pytest.approx(ef.head_dim_64_scale(a, "cudnn"), abs=0.006)
    assert ATTENTION_HEAD_DIM_64["sdpa"] == pytest.approx(ef.head_dim_64_scale(a, "flash"), abs=0.006)


def test_memory_figures_stay_under_the_measured_copy(docs, h100):
    a = docs["h100-sxm-microbench.json"]
    copy = ef.copy_ceiling(a, 3350)
    assert h100.efficiency.memory == pytest.approx(copy, abs=0.005)
    assert h100.efficiency.memory_torch == pytest.approx(ef.memory_torch(a, 3350), abs=0.005)
    assert h100.efficiency.memory_torch < h100.efficiency.memory


def test_attention_head_dim_64_runs_slower(h100):
    fwd = Op("flash_attention", "attention", 1e12, 0.0, "attention", (8192, 0.0, 64))
    wide = Op("flash_attention", "attention", 1e12, 0.0, "attention", (8192, 0.0, 128))
    assert compute_efficiency(fwd, h100, "bf16") == pytest.approx(0.80 * compute_efficiency(wide, h100, "bf16"))
    bwd = Op("flash_attention_bwd", "attention", 1e12, 0.0, "attention", (2048, 1.0, 128))
    assert compute_efficiency(bwd, h100, "bf16") == pytest.approx(0.58 * 0.87 * 0.77)


def test_context_parallel_attention_mixes_the_causal_step_and_unmasked_blocks():
    """cp 2, 4096 local queries: half the work is the causal first step at 4096 (forward 1.0), half unmasked
    2048-sided blocks (1.04): harmonic mean 1 / (0.5 / 1.0 + 0.5 / 1.04)."""
    assert attention_shape_scale((4096, 0.0, 128, 0.5, 2048), "fused") == pytest.approx(1 / (0.5 + 0.5 / 1.04))
    assert attention_shape_scale((4096, 1.0, 128, 0.5, 2048), "fused") == pytest.approx(1 / (0.5 / 0.90 + 0.5 / 0.96))
    assert attention_shape_scale((4096, 0.0, 64), "sdpa") == pytest.approx(0.90)


def test_report_prints_every_figure(capsys):
    assert ef.main([str(MEASURED / FILES[0])]) == 0
    out = capsys.readouterr().out
    for key in ("gemm ", "gemm_k0", "gemm_fp8", "attention_sdpa", "attention_bwd_ratio", "memory_torch", "held out"):
        assert key in out


def test_report_refuses_a_file_that_is_not_a_microbenchmark(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"schema": "autotune-profile/1"}))
    assert ef.main([str(bad)]) == 2
    assert "autotune.microbench/1" in capsys.readouterr().err
    with pytest.raises(SpecError, match="cannot read"):
        ef.load(tmp_path / "missing.json")


def test_microbench_validation_shapes_are_fixed():
    pytest.importorskip("torch")
    from autotune.profiling.microbench import validation_shapes
    shapes = validation_shapes()
    assert shapes[:3] == [(2944, 17408, 12288), (4096, 3968, 3328), (12416, 13568, 768)]
    assert len(shapes) == 40 and all(s % 128 == 0 for shape in shapes for s in shape)
    assert not math.isnan(sum(map(sum, shapes)))


def test_h200_figures_are_its_own_measurements():
    doc, h200 = ef.load(MEASURED / "h200-microbench.json"), load_hardware("h200")
    hbm = h200.hbm_bandwidth / 1e9
    lt, fp8 = _fit(doc, "bf16"), _fit(doc, "fp8")
    assert (h200.efficiency.gemm, h200.efficiency.gemm_k0) == (pytest.approx(lt.ceiling, abs=0.005), lt.k0)
    assert (h200.efficiency.gemm_fp8, h200.efficiency.gemm_fp8_k0) == (pytest.approx(fp8.ceiling, abs=0.005), fp8.k0)
    assert h200.efficiency.attention == pytest.approx(ef.attention_forward(doc, "cudnn", 989), abs=0.005)
    assert h200.efficiency.attention_sdpa == pytest.approx(ef.attention_forward(doc, "flash", 989), abs=0.005)
    assert h200.efficiency.attention_bwd_ratio == pytest.approx(ef.attention_bwd_ratio(doc), abs=0.005)
    assert h200.efficiency.memory == pytest.approx(ef.copy_ceiling(doc, hbm), abs=0.006)
    assert h200.efficiency.memory_torch == pytest.approx(ef.memory_torch(doc, hbm), abs=0.005)
    # the H100-measured shape tables hold on the H200 within 0.05
    for seq, (f, b) in ef.length_scales(doc).items():
        if seq in dict(ATTENTION_LENGTH_SCALE) and seq < 4096:
            assert abs(dict(ATTENTION_LENGTH_SCALE)[seq] - f) < 0.05
            assert abs(dict(ATTENTION_BWD_LENGTH_SCALE)[seq] - b) < 0.06
