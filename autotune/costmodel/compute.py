"""Roofline time of an operator: the slower of its arithmetic and its memory traffic.

The achieved fractions of the peaks (efficiency) come from the hardware file or a measured profile.
Norms, element-wise ops and softmax have about one FLOP per byte, far left of every GPU's ridge point, so
they are charged for their traffic alone (paper 5); GEMMs and fused attention for the slower of both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from autotune.costmodel.ops import CATEGORIES, Op
from autotune.specs.hardware import HardwareSpec


@dataclass(frozen=True, slots=True)
class PassTime:
    """Time of a list of ops, in total and per category (gemm, attention, norm, elementwise, vocab)."""

    seconds: float
    by_category: tuple[float, ...]
    flops: float


#: Output tile of a large Hopper/Ampere bf16 GEMM (CUTLASS's 128x256 warp-specialized tile, cuBLAS's usual
#: choice for training shapes): a GEMM runs ceil(m/128)*ceil(n/256) tiles in waves of one tile per SM.
GEMM_TILE = (128, 256)

#: Fused attention speed by query length relative to its long-sequence speed, read off the FlashAttention-3
#: paper's H100 forward chart (Shah et al. 2024, arXiv 2407.08608; head dim 128): FlashAttention-2
#: 309/350/362/368/370/370 and cuDNN 497/574/617/609/600/595 TFLOP/s at 512..16k give ~0.84 at 512, ~0.96 at
#: 1k and ~1 from 2k for both; below 512 the same halving per 4x (the paper's "small shapes run at about half").
ATTENTION_LENGTH_SCALE = ((128, 0.45), (256, 0.62), (512, 0.84), (1024, 0.96), (2048, 1.0))


def gemm_wave_efficiency(m: float, n: float, sm_count: int, groups: int = 1) -> float:
    """Useful fraction of the tile slots a GEMM occupies: partial tiles at the edges (tile quantization) and a
    partly filled last wave of tiles over the SMs (wave quantization), NVIDIA's "Matrix Multiplication
    Background" guide. 1 when the hardware file gives no SM count."""
    if sm_count <= 0 or m <= 0 or n <= 0:
        return 1.0
    tm, tn = math.ceil(m / GEMM_TILE[0]), math.ceil(n / GEMM_TILE[1])
    tiles = tm * tn * groups  # a grouped GEMM's tiles share the waves
    waves = math.ceil(tiles / sm_count)
    return (m * n) / (tm * GEMM_TILE[0] * tn * GEMM_TILE[1]) * tiles / (waves * sm_count)


def attention_length_scale(seq: float) -> float:
    """Relative speed of a fused attention kernel whose queries are `seq` long (ATTENTION_LENGTH_SCALE,
    linear in log2(seq) between the points)."""
    points = ATTENTION_LENGTH_SCALE
    if seq >= points[-1][0]:
        return 1.0
    if seq <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if seq <= x1:
            t = (math.log2(seq) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + t * (y1 - y0)
    return 1.0


def compute_efficiency(op: Op, hw: HardwareSpec, dtype: str, attention: str = "fused") -> float:
    """Achieved fraction of the tensor-core peak for a GEMM or attention op of this shape."""
    eff = hw.efficiency
    if op.kernel == "gemm":
        base = eff.gemm_fp8 if matmul_dtype(op, dtype) == "fp8" and eff.gemm_fp8 else eff.gemm
        return base * (gemm_wave_efficiency(op.dims[0], op.dims[1], hw.sm_count, op.groups) if op.dims else 1.0)
    base = eff.attention_sdpa if attention == "sdpa" and eff.attention_sdpa else eff.attention
    if op.dims:
        base *= attention_length_scale(op.dims[0]) * (eff.attention_bwd_ratio if op.dims[1] else 1.0)
    return base


def op_time(op: Op, hw: HardwareSpec, dtype: str, attention: str = "fused") -> float:
    """Seconds one operator takes on one GPU: its roofline time plus the fixed cost of a kernel."""
    memory_s = op.bytes / (hw.hbm_bandwidth * hw.efficiency.memory)
    if op.kernel == "memory":
        return memory_s + hw.kernel_overhead_s
    compute_s = op.flops / (hw.peak_flops(matmul_dtype(op, dtype)) * compute_efficiency(op, hw, dtype, attention))
    return max(compute_s, memory_s) + hw.kernel_overhead_s


def matmul_dtype(op: Op, dtype: str) -> str:
    """fp8 training (Transformer Engine) runs the transformer's linear layers in fp8; core attention and the
    LM head stay bf16 unless asked otherwise, so they keep the bf16 peak."""
    if dtype == "fp8" and op.category != "gemm":
        return "bf16"
    return dtype


def pass_time(ops: tuple[Op, ...], hw: HardwareSpec, dtype: str,
              measured: Callable[[Op], float | None] | None = None, attention: str = "fused") -> PassTime:
    """Total and per-category time of a sequence of ops (kernels run one after another on a GPU). With
    `measured` (a profile's lookup, costmodel/measured.py), an op it has a time for is charged that time."""
    by = dict.fromkeys(CATEGORIES, 0.0)
    flops = 0.0
    for op in ops:
        seconds = None if measured is None else measured(op)
        by[op.category] += op_time(op, hw, dtype, attention) if seconds is None else seconds
        flops += op.flops
    return PassTime(sum(by.values()), tuple(by[c] for c in CATEGORIES), flops)
