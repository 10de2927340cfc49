"""A hardware file's efficiency block, derived from kernel microbenchmarks of that GPU.

`python -m autotune.reports.efficiency FILE [--gpu NAME]` reads what `python -m autotune.profiling.microbench`
wrote on the GPU and prints the figures a hardware file takes (gemm and gemm_k0, gemm_fp8 and gemm_fp8_k0,
attention, attention_sdpa, attention_bwd_ratio, memory_torch), the rule each comes from, and how the GEMM
model does on the held-out shapes the fit never saw (with the fixed 0.82 ceiling it replaced, for scale).
Every figure comes from kernels timed alone: nothing here reads a training run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.catalog import load_hardware
from autotune.costmodel.compute import gemm_shape_efficiency
from autotune.errors import SpecError
from autotune.specs.hardware import HardwareSpec
from autotune.reports import run_main

#: k0 candidates of the GEMM fit, elements: 0, 50, ..., 3000
K0_GRID = tuple(range(0, 3001, 50))
#: The GEMM fit's parallelism constant, in multiples of the SM count (gemm_fill): fixed, so that every dtype and
#: BLAS library is fitted with the same form (1.5-3 fit about as well)
GEMM_FILL = 2.0
#: The GEMM sections a fit reads, and the held-out ones it is checked on
GEMM_FIT_SECTIONS = {"bf16": ("gemm_bf16", "gemm_bf16_repeat", "gemm_bf16_small_m_run", "gemm_small_m"),
                     "fp8": ("gemm_fp8", "gemm_small_m")}
GEMM_HELD_OUT = {"bf16": ("gemm_layouts",), "fp8": ("gemm_fp8_validation",)}
#: Attention figures are read at these query lengths and up (head dim 128), where the kernels are flat
LONG_ATTENTION = 4096
#: The memory-bound PyTorch kernels whose bandwidth `memory_torch` summarizes (eager and torch.compile'd)
TORCH_MEMORY_KERNELS = ("rmsnorm_fwd", "rmsnorm_bwd", "swiglu_fwd_eager", "swiglu_bwd_eager",
                        "cross_entropy_fp32_fwd", "cross_entropy_fp32_bwd", "rmsnorm_compiled_fwd",
                        "rmsnorm_compiled_bwd", "swiglu_compiled_fwd", "swiglu_compiled_bwd", "rope_compiled_fwd",
                        "rope_compiled_bwd", "residual_add_eager_as_compiled_fwd", "residual_add_eager_as_compiled_bwd")


@dataclass(frozen=True, slots=True)
class GemmFit:
    ceiling: float
    """Fraction of the dense peak a GEMM with full waves and an unbounded k reaches."""
    k0: float
    """Fixed cost per output tile, in elements of k."""
    rms_log_error: float
    """On the points it was fitted to."""


def _is_fp8(p: dict) -> bool:
    return p.get("dtype") == "fp8" or p.get("section") == "fp8"


def gemm_points(doc: dict, sections: Sequence[str], dtype: str) -> list[dict]:
    """The tensor-scaled points of `dtype` (bf16 or fp8) in these sections."""
    return [p for s in sections for p in doc["sections"].get(s, []) if "error" not in p
            and p.get("scaling", "tensor") == "tensor" and _is_fp8(p) == (dtype == "fp8")]


def predicted_fraction(p: dict, ceiling: float, k0: float, sm_count: int, fill: float = GEMM_FILL) -> float:
    return ceiling * gemm_shape_efficiency(p["m"], p["n"], p["k"], sm_count, 1, k0, fill)


def _log_errors(points: Sequence[dict], ceiling: float, k0: float, peak: float, sm_count: int,
                fill: float = GEMM_FILL) -> list[float]:
    return [math.log(p["tflops"] / peak / predicted_fraction(p, ceiling, k0, sm_count, fill)) for p in points]


def fit_gemm(points: Sequence[dict], peak_tflops: float, sm_count: int, fill: float = GEMM_FILL) -> GemmFit:
    """Least squares in log space: for each k0 of the grid the best ceiling is the geometric mean of measured
    over modelled; the k0 with the least RMS wins (ties -> the smaller k0)."""
    best: GemmFit | None = None
    for k0 in K0_GRID:
        shape_only = [math.log(p["tflops"] / peak_tflops / predicted_fraction(p, 1.0, k0, sm_count, fill))
                      for p in points]
        ceiling = math.exp(statistics.fmean(shape_only))
        rms = math.sqrt(statistics.fmean(e * e for e in _log_errors(points, ceiling, k0, peak_tflops, sm_count,
                                                                     fill)))
        if best is None or rms < best.rms_log_error - 1e-12:
            best = GemmFit(ceiling, float(k0), rms)
    if best is None:
        raise SpecError("microbench: no GEMM points to fit; run the microbenchmark's gemm sections")
    return best


def held_out_error(points: Sequence[dict], ceiling: float, k0: float, peak: float, sm_count: int,
                   fill: float = GEMM_FILL) -> tuple[float, float]:
    """(RMS, mean) of log(measured / modelled) over points the fit did not see (fill 0: the fixed-tile wave
    quantization model)."""
    errors = _log_errors(points, ceiling, k0, peak, sm_count, fill)
    return math.sqrt(statistics.fmean(e * e for e in errors)), statistics.fmean(errors)


def _attention_rows(doc: dict, backend: str, head_dim: int = 128) -> dict[int, dict]:
    return {r["seq"]: r for r in doc["sections"].get("attention", [])
            if "error" not in r and r["backend"] == backend and r["head_dim"] == head_dim}


def attention_forward(doc: dict, backend: str, peak_tflops: float) -> float:
    """Mean forward fraction of the peak at LONG_ATTENTION tokens and up, head dim 128."""
    rows = [r for s, r in _attention_rows(doc, backend).items() if s >= LONG_ATTENTION]
    return statistics.fmean(r["fwd_tflops"] for r in rows) / peak_tflops


def attention_bwd_ratio(doc: dict) -> float:
    """Backward over forward speed at LONG_ATTENTION tokens and up, mean over cuDNN and FlashAttention-2."""
    return statistics.fmean(r["bwd_tflops"] / r["fwd_tflops"] for b in ("cudnn", "flash")
                            for s, r in _attention_rows(doc, b).items() if s >= LONG_ATTENTION)


def length_scales(doc: dict) -> dict[int, tuple[float, float]]:
    """Per query length: (forward, backward) speed relative to the long-sequence speed, mean of both kernels."""
    out = {}
    for backend in ("cudnn", "flash"):
        rows = _attention_rows(doc, backend)
        long = [r for s, r in rows.items() if s >= LONG_ATTENTION]
        fwd_long = statistics.fmean(r["fwd_tflops"] for r in long)
        bwd_long = statistics.fmean(r["bwd_tflops"] for r in long)
        for s, r in rows.items():
            f, b = out.get(s, (0.0, 0.0))
            out[s] = (f + r["fwd_tflops"] / fwd_long / 2, b + r["bwd_tflops"] / bwd_long / 2)
    return dict(sorted(out.items()))


def block_scales(doc: dict) -> dict[int, tuple[float, float]]:
    """Non-causal attention blocks (context parallelism's ring steps after the first), by their shorter side:
    (forward, backward) speed relative to the causal kernel's long-sequence speed, mean of both kernels and of
    the square and rectangular blocks sharing that side."""
    sums: dict[int, list[float]] = {}
    for backend in ("cudnn", "flash"):
        long = [r for s, r in _attention_rows(doc, backend).items() if s >= LONG_ATTENTION]
        fwd_long = statistics.fmean(r["fwd_tflops"] for r in long)
        bwd_long = statistics.fmean(r["bwd_tflops"] for r in long)
        for r in doc["sections"].get("attention_blocks", []):
            if "error" in r or r["backend"] != backend:
                continue
            side = min(r["q"], r["kv"])
            acc = sums.setdefault(side, [0.0, 0.0, 0])
            acc[0] += r["fwd_tflops"] / fwd_long
            acc[1] += r["bwd_tflops"] / bwd_long
            acc[2] += 1
    return {side: (f / n, b / n) for side, (f, b, n) in sorted(sums.items())}


def head_dim_64_scale(doc: dict, backend: str) -> float:
    """Forward and backward speed at head dim 64 over head dim 128, LONG_ATTENTION tokens and up."""
    small, large = _attention_rows(doc, backend, 64), _attention_rows(doc, backend, 128)
    return statistics.fmean(small[s][k] / large[s][k] for s in small if s >= LONG_ATTENTION and s in large
                            for k in ("fwd_tflops", "bwd_tflops"))


def memory_torch(doc: dict, hbm_GBps: float) -> float:
    """Median fraction of HBM bandwidth over PyTorch's memory-bound kernels (eager and compiled)."""
    rows = {r["kernel"]: r for s in ("memory", "memory_compiled") for r in doc["sections"].get(s, [])}
    return statistics.median(rows[k]["GBps"] / hbm_GBps for k in TORCH_MEMORY_KERNELS if k in rows)


def copy_ceiling(doc: dict, hbm_GBps: float) -> float:
    """Device-to-device copy bandwidth (bytes read and written) over the datasheet HBM bandwidth."""
    return next(r["GBps"] for r in doc["sections"]["memory"] if r["kernel"] == "copy") / hbm_GBps


def load(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"{path}: cannot read a microbenchmark JSON ({e}); write one with "
                        "`python -m autotune.profiling.microbench --out FILE` on the GPU") from None
    if doc.get("schema") != "autotune.microbench/1":
        raise SpecError(f"{path}: schema is {doc.get('schema')!r}, expected 'autotune.microbench/1'")
    return doc


def report(doc: dict, hw: HardwareSpec) -> str:
    bf16, fp8 = hw.peak_flops_bf16 / 1e12, hw.peak_flops_fp8 / 1e12
    hbm = hw.hbm_bandwidth / 1e9
    sm = int(doc["device"].get("sm_count") or hw.sm_count)
    lines = [f"{doc['device']['name']} ({sm} SMs), measured {doc.get('created', '?')}; peaks from {hw.name}: "
             f"bf16 {bf16:.0f} TFLOP/s, fp8 {fp8:.0f} TFLOP/s, HBM {hbm:.0f} GB/s"]
    for dtype, peak in (("bf16", bf16), ("fp8", fp8)):
        points, held = gemm_points(doc, GEMM_FIT_SECTIONS[dtype], dtype), gemm_points(doc, GEMM_HELD_OUT[dtype], dtype)
        if not points or not peak:
            continue
        fit = fit_gemm(points, peak, sm)
        label = "gemm" if dtype == "bf16" else "gemm_fp8"
        line = (f"  {label:<20} {fit.ceiling:.3f}  {label}_k0 {fit.k0:.0f}, gemm_fill {GEMM_FILL:g}: fitted on "
                f"{len(points)} shapes (RMS log error {fit.rms_log_error:.3f})")
        if held:
            rms, mean = held_out_error(held, fit.ceiling, fit.k0, peak, sm)
            old_rms, old_mean = held_out_error(held, 0.82 if dtype == "bf16" else 0.75, 0.0, peak, sm, 0.0)
            line += (f"; held out ({len(held)} shapes): RMS {rms:.3f}, mean {mean:+.3f} (the fixed "
                     f"{0.82 if dtype == 'bf16' else 0.75} ceiling with wave quantization: RMS {old_rms:.3f}, mean "
                     f"{old_mean:+.3f})")
        lines.append(line)
    if doc["sections"].get("attention"):
        lines.append(f"  attention            {attention_forward(doc, 'cudnn', bf16):.3f}  cuDNN forward, head dim "
                     f"128, >= {LONG_ATTENTION} tokens")
        lines.append(f"  attention_sdpa       {attention_forward(doc, 'flash', bf16):.3f}  FlashAttention-2 forward, "
                     "same")
        lines.append(f"  attention_bwd_ratio  {attention_bwd_ratio(doc):.3f}  backward over forward speed, both "
                     "kernels")
        lines.append("  length scale (fwd, bwd): " + ", ".join(f"{s}: {f:.2f}/{b:.2f}" for s, (f, b) in
                                                             length_scales(doc).items()))
        if doc["sections"].get("attention_blocks"):
            lines.append("  non-causal blocks by shorter side (fwd, bwd): " + ", ".join(
                f"{s}: {f:.2f}/{b:.2f}" for s, (f, b) in block_scales(doc).items()))
        lines.append(f"  head dim 64 scale: cuDNN {head_dim_64_scale(doc, 'cudnn'):.2f}, "
                     f"FlashAttention-2 {head_dim_64_scale(doc, 'flash'):.2f}")
    if doc["sections"].get("memory"):
        lines.append(f"  memory_torch         {memory_torch(doc, hbm):.3f}  median over PyTorch's memory-bound "
                     "kernels")
        lines.append(f"  copy ceiling         {copy_ceiling(doc, hbm):.3f}  device-to-device copy (the most any "
                     "memory-bound kernel reaches)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autotune.reports.efficiency", description=__doc__.split("\n")[0])
    ap.add_argument("file", type=Path, help="JSON written by python -m autotune.profiling.microbench")
    ap.add_argument("--gpu", default="h100-sxm", help="hardware file whose peaks divide the measurements")
    args = ap.parse_args(argv)
    try:
        print(report(load(args.file), load_hardware(args.gpu)))
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
