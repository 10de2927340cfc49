"""Tensor-parallel grids: how tp devices are arranged in each mode (paper 2), and the degrees each mode allows.

1-D: any tp (Megatron, Shoeybi et al. 2019). 2-D: tp = q^2 (Optimus, Xu et al. 2021, arXiv 2104.05343).
2.5-D: tp = d*q^2 (Tesseract, Wang et al. 2021, arXiv 2105.14500). 3-D: tp = q^3 (Bian et al. 2021,
arXiv 2105.14450). The communication and memory of each mode live in costmodel/tpmodes.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from autotune.errors import InvalidPlanError
from autotune.specs.model import ModelSpec

Mode = Literal["1d", "2d", "2.5d", "3d"]
MODES: tuple[Mode, ...] = ("1d", "2d", "2.5d", "3d")


@dataclass(frozen=True, slots=True, kw_only=True)
class TPGrid:
    """How `tp` devices are arranged for one tensor-parallel mode."""

    mode: Mode
    tp: int
    """Devices in the tensor-parallel group."""
    q: int
    """Grid side: tp (1-D), sqrt(tp) (2-D), sqrt(tp/d) (2.5-D), cbrt(tp) (3-D)."""
    depth: int = 1
    """Tesseract's depth d (2.5-D only; 1 otherwise)."""

    @property
    def act_split(self) -> int:
        """Ways one micro-batch's token rows are split (the batch must divide by it for local attention)."""
        return {"1d": 1, "2d": self.q, "2.5d": self.depth * self.q, "3d": self.q * self.q}[self.mode]


def tp_mode_degrees(mode: str, tp: int, *, depth: int | None = None) -> TPGrid:
    """Validate tp for a mode: 1-D any tp; 2-D tp = q^2 (Optimus); 2.5-D tp = d*q^2 (Tesseract; without
    `depth`, the smallest d >= 2 that works); 3-D tp = q^3 (Bian et al. 2021)."""
    if mode not in MODES:
        raise InvalidPlanError(f"tensor-parallel mode {mode!r} is not one of {', '.join(MODES)}")
    if tp < 1:
        raise InvalidPlanError(f"tp must be >= 1, got {tp}")
    if mode == "1d":
        return TPGrid(mode="1d", tp=tp, q=tp)
    if mode == "2d":
        return TPGrid(mode="2d", tp=tp, q=_root(tp, 2, f"2-D tensor parallelism needs tp = q^2 (a q x q grid), "
                                                     f"got tp={tp}; use one of {_powers(tp, 2)}"))
    if mode == "3d":
        return TPGrid(mode="3d", tp=tp, q=_root(tp, 3, f"3-D tensor parallelism needs tp = q^3 (a q x q x q "
                                                     f"cube), got tp={tp}; use one of {_powers(tp, 3)}"))
    depths = [depth] if depth is not None else [d for d in range(2, tp + 1) if tp % d == 0]
    for d in depths:
        if d >= 1 and tp % d == 0 and tp // d >= 4 and math.isqrt(tp // d) ** 2 == tp // d:  # q >= 2
            return TPGrid(mode="2.5d", tp=tp, q=math.isqrt(tp // d), depth=d)
    raise InvalidPlanError(f"2.5-D tensor parallelism needs tp = d * q^2 (depth d, a q x q grid per layer); "
                           f"tp={tp}" + (f" with depth={depth}" if depth is not None else "")
                           + " has no such split with q >= 2; e.g. tp = 8 (2x2x2), 18 (2x3x3), 32 (2x4x4) or 64 (4x4x4)")


def check_tp_shapes(grid: TPGrid, model: ModelSpec, mbs: int) -> None:
    """Divisibility each mode needs: heads over the axis that splits them (tp in 1-D, q otherwise), the
    hidden and FFN widths over q (q^2 in 3-D, where a weight block K/q x N/q is split q ways again), and the
    micro-batch over the token-row split, so that attention stays local to a device."""
    widths = {"heads": model.num_heads, "kv heads": model.num_kv_heads}
    split_w = grid.tp if grid.mode == "1d" else grid.q
    need = {name: split_w for name in widths}
    if grid.mode != "1d":
        step = grid.q ** 2 if grid.mode == "3d" else grid.q
        widths |= {"hidden_size": model.hidden_size, "ffn_hidden_size": model.ffn_hidden_size}
        need |= {"hidden_size": step, "ffn_hidden_size": step}
    widths["micro-batch"], need["micro-batch"] = mbs, grid.act_split
    bad = [f"{name} {widths[name]} is not a multiple of {need[name]}" for name in widths if widths[name] % need[name]]
    if bad:
        raise InvalidPlanError(f"{grid.mode} tensor parallelism with tp={grid.tp} (q={grid.q}): " + "; ".join(bad)
                               + "; pick another tp or mode")


def _root(tp: int, k: int, message: str) -> int:
    q = round(tp ** (1.0 / k))
    if q ** k != tp:
        raise InvalidPlanError(message)
    return q


def _powers(tp: int, k: int) -> str:
    """Nearest valid sizes below and above tp."""
    q = max(1, round(tp ** (1.0 / k)))
    return ", ".join(str(n ** k) for n in sorted({max(1, q - 1), q, q + 1}))
