"""Roofline time of an operator: the slower of its arithmetic and its memory traffic.

The achieved fractions of the peaks (efficiency) come from the hardware file or a measured profile.
Norms, element-wise ops and softmax have about one FLOP per byte, far left of every GPU's ridge point, so
they are charged for their traffic alone (paper 5); GEMMs and fused attention for the slower of both.
"""

from __future__ import annotations

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


def op_time(op: Op, hw: HardwareSpec, dtype: str) -> float:
    """Seconds one operator takes on one GPU."""
    memory_s = op.bytes / (hw.hbm_bandwidth * hw.efficiency.memory)
    if op.kernel == "memory":
        return memory_s
    eff = hw.efficiency.gemm if op.kernel == "gemm" else hw.efficiency.attention
    compute_s = op.flops / (hw.peak_flops(matmul_dtype(op, dtype)) * eff)
    return max(compute_s, memory_s)


def matmul_dtype(op: Op, dtype: str) -> str:
    """fp8 training (Transformer Engine) runs the transformer's linear layers in fp8; core attention and the
    LM head stay bf16 unless asked otherwise, so they keep the bf16 peak."""
    if dtype == "fp8" and op.category != "gemm":
        return "bf16"
    return dtype


def pass_time(ops: tuple[Op, ...], hw: HardwareSpec, dtype: str,
              measured: Callable[[Op], float | None] | None = None) -> PassTime:
    """Total and per-category time of a sequence of ops (kernels run one after another on a GPU). With
    `measured` (a profile's lookup, costmodel/measured.py), an op it has a time for is charged that time."""
    by = dict.fromkeys(CATEGORIES, 0.0)
    flops = 0.0
    for op in ops:
        seconds = None if measured is None else measured(op)
        by[op.category] += op_time(op, hw, dtype) if seconds is None else seconds
        flops += op.flops
    return PassTime(sum(by.values()), tuple(by[c] for c in CATEGORIES), flops)
