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
from autotune.specs.job import JobSpec


@dataclass(frozen=True, slots=True)
class PassTime:
    """Time of a list of ops, in total and per category (gemm, attention, norm, elementwise, vocab)."""

    seconds: float
    by_category: tuple[float, ...]
    flops: float


def attention_kernel(job: JobSpec) -> str:
    """The kernel library a step runs: "fused" = Transformer Engine's (Megatron); "sdpa" = PyTorch's, with SDPA's
    FlashAttention-2; "sdpa_cudnn" = PyTorch's, with SDPA's cuDNN attention (JobSpec.runs_attention)."""
    if job.trainer == "megatron":
        return "fused"
    return "sdpa_cudnn" if job.runs_attention == "cudnn" else "sdpa"


#: Output tile of a large Hopper/Ampere bf16 GEMM (CUTLASS's 128x256 warp-specialized tile, cuBLAS's usual
#: choice for training shapes): a GEMM runs ceil(m/128)*ceil(n/256) tiles in waves of one tile per SM.
GEMM_TILE = (128, 256)

#: Fused attention speed by query length relative to its speed at 4k+ tokens (causal, head dim 128), measured on
#: an H100 SXM: the mean of cuDNN's and FlashAttention-2's forward at 512/1k/2k tokens (0.60/0.83/0.93;
#: profiles/measured/h100-sxm-microbench.json, derived by `python -m autotune.reports.efficiency`). Below 512,
#: which the microbenchmark does not time, the FlashAttention-3 paper's halving per 4x (Shah et al. 2024).
ATTENTION_LENGTH_SCALE = ((128, 0.32), (256, 0.44), (512, 0.60), (1024, 0.83), (2048, 0.93), (4096, 1.0))

#: The backward kernel loses more at short queries (dK/dV accumulate over fewer query tiles): its speed relative
#: to its own 4k+ speed, same file (512/1k/2k/4k: 0.36/0.58/0.77/0.90), extended below 512 like the forward.
ATTENTION_BWD_LENGTH_SCALE = ((128, 0.19), (256, 0.26), (512, 0.36), (1024, 0.58), (2048, 0.77), (4096, 0.90),
                              (8192, 1.0))

#: Unmasked attention blocks (context parallelism's ring steps after the first), by the block's shorter side:
#: forward and backward speed relative to the causal kernel's long-sequence speed, same kernels
#: (profiles/measured/h100-sxm-microbench-attention.json, `attention_blocks`, square and 2:1 blocks, mean of cuDNN
#: and FlashAttention-2; 512/1k/2k/4k: 0.92/1.01/1.04/1.00 forward, 0.66/0.85/0.96/1.02 backward: an unmasked
#: block wastes no diagonal tiles), below 512 falling like the causal tables.
BLOCK_LENGTH_SCALE = ((128, 0.49), (256, 0.67), (512, 0.92), (1024, 1.01), (2048, 1.04), (4096, 1.00))
BLOCK_BWD_LENGTH_SCALE = ((128, 0.35), (256, 0.48), (512, 0.66), (1024, 0.85), (2048, 0.96), (4096, 1.02))

#: Speed at head dim 64 over head dim 128 (half the work per loaded K/V tile), forward and backward at 4k+
#: tokens, same file: cuDNN 0.80, FlashAttention-2 0.90. Head dims above 128 are charged as 128.
ATTENTION_HEAD_DIM_64 = {"fused": 0.80, "sdpa": 0.90}


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


def attention_shape_scale(dims: tuple[float, ...], kernels: str) -> float:
    """Speed of an attention kernel relative to its long causal speed (forward, or backward): dims = (query
    length, backward flag[, head dim[, causal share of the work, unmasked block side]]). Context parallelism
    mixes a causal kernel (its share) with unmasked blocks: the op runs at the work-weighted harmonic mean."""
    seq, backward = dims[0], bool(dims[1])
    scale = attention_length_scale(seq, ATTENTION_BWD_LENGTH_SCALE if backward else ATTENTION_LENGTH_SCALE)
    if len(dims) > 4 and dims[3] < 1.0:
        share = dims[3]
        block = attention_length_scale(dims[4], BLOCK_BWD_LENGTH_SCALE if backward else BLOCK_LENGTH_SCALE)
        scale = 1.0 / (share / scale + (1.0 - share) / block)
    if len(dims) > 2 and dims[2] <= 64:
        scale *= ATTENTION_HEAD_DIM_64["sdpa" if kernels == "sdpa" else "fused"]
    return scale


#: Elements of k in one split-K/stream-K work unit: cuBLAS on Hopper spreads a GEMM with too few output tiles
#: over the SMs by splitting k, so a GEMM offers (output tiles) x k/GEMM_K_SPLIT units of parallel work (the
#: split that fits the H100 measurements best, 512-2048 doing almost as well: reports/efficiency.py).
GEMM_K_SPLIT = 1024


def gemm_shape_efficiency(m: float, n: float, k: float, sm_count: int, groups: int = 1, k0: float = 0.0,
                          fill: float = 0.0) -> float:
    """Fraction of a GEMM's ceiling its shape allows. With `fill` (a measured hardware figure): partial output
    tiles (edge quantization), the per-tile fixed cost k/(k + k0), and parallelism, units/(units + fill x SMs),
    where units = tiles x k/GEMM_K_SPLIT: stream-K leaves no wave quantization, but a GEMM with little work
    cannot fill the GPU. Without it, the classic fixed-tile wave quantization (gemm_wave_efficiency)."""
    if fill <= 0 or sm_count <= 0 or m <= 0 or n <= 0:
        return gemm_wave_efficiency(m, n, sm_count, groups) * gemm_k_efficiency(k, k0)
    tm, tn = math.ceil(m / GEMM_TILE[0]), math.ceil(n / GEMM_TILE[1])
    edge = (m * n) / (tm * GEMM_TILE[0] * tn * GEMM_TILE[1])
    units = tm * tn * groups * max(1.0, k / GEMM_K_SPLIT)
    return edge * gemm_k_efficiency(k, k0) * units / (units + fill * sm_count)


def gemm_k_efficiency(k: float, k0: float) -> float:
    """Fraction of a GEMM's ceiling left after each output tile's fixed cost, worth `k0` elements of the inner
    dimension: k / (k + k0). Short inner dimensions (a tp-sharded out_proj, an expert's down projection) run
    below the square-GEMM ceiling (profiles/measured/h100-sxm-microbench*.json)."""
    return k / (k + k0) if k > 0 else 1.0


def attention_length_scale(seq: float, points: tuple[tuple[int, float], ...] = ATTENTION_LENGTH_SCALE) -> float:
    """Relative speed of a fused attention kernel whose queries are `seq` long (ATTENTION_LENGTH_SCALE, or
    the backward's table, linear in log2(seq) between the points)."""
    if seq >= points[-1][0]:
        return points[-1][1]
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
        fp8 = matmul_dtype(op, dtype) == "fp8"
        base = eff.gemm_fp8 if fp8 and eff.gemm_fp8 else (
            eff.gemm_torch if attention != "fused" and eff.gemm_torch else eff.gemm)
        if not op.dims:
            return base
        k0 = eff.gemm_fp8_k0 if fp8 and eff.gemm_fp8_k0 else eff.gemm_k0
        m, n, k = op.dims
        return base * gemm_shape_efficiency(m, n, k, hw.sm_count, op.groups, k0, eff.gemm_fill)
    base = eff.attention_sdpa if attention == "sdpa" and eff.attention_sdpa else eff.attention
    if op.dims:
        base *= attention_shape_scale(op.dims, attention) * (eff.attention_bwd_ratio if op.dims[1] else 1.0)
    return base


def memory_efficiency(hw: HardwareSpec, kernels: str) -> float:
    """Achieved fraction of HBM bandwidth of a memory-bound kernel: Transformer Engine's hand-fused kernels
    ("fused", Megatron) or PyTorch's own, eager or Inductor-generated ("sdpa", "sdpa_cudnn": torchtitan,
    DeepSpeed)."""
    eff = hw.efficiency
    return eff.memory_torch if kernels != "fused" and eff.memory_torch else eff.memory


def op_time(op: Op, hw: HardwareSpec, dtype: str, attention: str = "fused") -> float:
    """Seconds one operator takes on one GPU: its roofline time plus the fixed cost of a kernel. `attention` names
    the kernel library: "fused" = Transformer Engine's (cuDNN attention, cuBLASLt, hand-fused memory-bound
    kernels; Megatron), "sdpa" = PyTorch's (SDPA flash attention, cuBLAS, ATen/Inductor kernels), "sdpa_cudnn" =
    PyTorch's with SDPA's cuDNN attention (the attention of "fused", the rest of "sdpa")."""
    memory_s = op.bytes / (hw.hbm_bandwidth * memory_efficiency(hw, attention))
    if op.kernel == "memory":
        return memory_s + hw.kernel_overhead_s
    compute_s = op.flops / (hw.peak_flops(matmul_dtype(op, dtype)) * compute_efficiency(op, hw, dtype, attention))
    return max(compute_s, memory_s) + hw.kernel_overhead_s


def memoized_op_time(hw: HardwareSpec, dtype: str, attention: str, measured: Callable[[Op], float | None] | None,
                     memo: dict | None) -> Callable[[Op], float | None] | None:
    """A `measured` for pass_time that also remembers op_time by the op's shape (category, kernel, flops,
    bytes, dims, groups: all op_time reads but its name). A search meets each of a few thousand distinct ops
    hundreds of times, in the layer costs of every tp, cp, mbs, ep and etp. The seconds are op_time's to the
    bit. `memo`: a dict kept by the caller for this GPU (None: `measured` unchanged)."""
    if memo is None:
        return measured

    def seconds(op: Op) -> float | None:
        if measured is not None and (known := measured(op)) is not None:
            return known
        key = (op.category, op.kernel, op.flops, op.bytes, op.dims, op.groups, dtype, attention)
        value = memo.get(key)
        if value is None:
            value = memo[key] = op_time(op, hw, dtype, attention)
        return value

    return seconds


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
