"""Megatron-LM argument values read strictly, as its argparse types and the divisions behind them would take them."""

from __future__ import annotations

import re
from typing import Any

from autotune.errors import SpecError

#: Whole-number flags where 0 means none (every other one is a size or count of at least 1).
ZERO_MEANS_NONE = {"--mtp-num-layers", "--q-lora-rank"}


def int_arg(args: dict[str, Any], flag: str, default: int | None = None) -> int | None:
    """A whole-number flag's value (default when absent); 0 only where it means none, since Megatron divides by the
    others (a tp of 0 would read as the default 1 and a head count of 0 divide by zero)."""
    if flag not in args:
        return default
    value = args[flag]
    if not isinstance(value, str) or not re.fullmatch(r"\d+", value):
        raise SpecError(f"{flag} {value!r}: expected a whole number")
    if int(value) == 0 and flag not in ZERO_MEANS_NONE:
        raise SpecError(f"{flag} 0: Megatron needs at least 1; give a positive number")
    return int(value)


def float_arg(args: dict[str, Any], flag: str, default: float) -> float:
    try:
        return float(args[flag]) if flag in args else default
    except ValueError:
        raise SpecError(f"{flag} {args[flag]!r}: expected a number") from None


def fraction_arg(args: dict[str, Any], flag: str) -> float:
    """A share in (0, 1] (--rotary-percent: Megatron-LM takes it as a fraction, 1.0 = every head dimension)."""
    value = float_arg(args, flag, 1.0)
    if not 0 < value <= 1:
        raise SpecError(f"{flag} {args[flag]!r}: expected a share of each head in (0, 1], e.g. 0.25")
    return value
