"""Strict readers for dictionaries loaded from JSON: unknown and missing keys are errors that list them, and every
number is checked finite and within its documented range (autotune/specs/limits.py: INT_MAXIMA, FLOAT_RANGES)
before anything is computed from it, with the field and the limit in the message."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from autotune.errors import SpecError
from autotune.specs.limits import float_range, int_maximum


def check_keys(data: Any, *, required: Iterable[str], optional: Iterable[str] = (), where: str) -> None:
    """Reject a mapping with missing or unknown keys, naming them and the place they came from."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: expected a JSON object, got {type(data).__name__}")
    required = set(required)
    allowed = required | set(optional)
    missing = sorted(required - data.keys())
    unknown = sorted(set(data.keys()) - allowed)
    if missing:
        raise SpecError(f"{where}: missing key(s) {', '.join(missing)}; add them")
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _is_number(value: Any) -> bool:
    """A JSON number that is finite (JSON has no NaN or infinity, but Python's reader and writers accept them)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def shown(value: Any) -> str:
    """A value of a JSON file for a one-line message, as JSON writes it (true, null, "text": not Python's True,
    None, 'text'); None is also what a missing key reads as. A number of hundreds of digits is cut."""
    if value is None:
        return "null (or nothing)"
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:20] + f"... ({len(text)} characters)"


def positive_int(data: Mapping[str, Any], key: str, where: str, maximum: int | None = None) -> int:
    """An integer in [1, maximum] (default: the field's documented maximum); whole JSON numbers like 4.0 count."""
    value = data[key]
    if not _is_number(value) or value != int(value):
        raise SpecError(f"{where}: {key} must be a whole number, got {shown(value)}")
    if value <= 0:
        raise SpecError(f"{where}: {key} must be > 0, got {shown(value)}")
    limit = int_maximum(key) if maximum is None else maximum
    if value > limit:
        raise SpecError(f"{where}: {key} {shown(int(value))} exceeds the maximum of {limit:,}; use a smaller value")
    return int(value)


def _in_range(value: float, key: str, where: str, low: float) -> float:
    minimum, maximum = float_range(key)
    if value > maximum:
        raise SpecError(f"{where}: {key} {shown(value)} exceeds the maximum of {maximum:g}; use a smaller value")
    if value < max(minimum, low):
        raise SpecError(f"{where}: {key} {shown(value)} is below the minimum of {max(minimum, low):g}")
    return float(value)


def positive_float(data: Mapping[str, Any], key: str, where: str) -> float:
    """A finite number > 0, within the field's documented range."""
    value = data[key]
    if not _is_number(value) or not value > 0:
        raise SpecError(f"{where}: {key} must be a number > 0, got {shown(value)}")
    return _in_range(value, key, where, 0.0)


def fraction(data: Mapping[str, Any], key: str, where: str) -> float:
    """A number in (0, 1]."""
    value = positive_float(data, key, where)
    if value > 1:
        raise SpecError(f"{where}: {key} must be in (0, 1], got {value!r}")
    return value


def nonneg_float(data: Mapping[str, Any], key: str, where: str) -> float:
    """A finite number >= 0, within the field's documented range."""
    value = data[key]
    if not _is_number(value) or value < 0:
        raise SpecError(f"{where}: {key} must be a number >= 0, got {shown(value)}")
    return _in_range(value, key, where, 0.0)


def boolean(data: Mapping[str, Any], key: str, where: str) -> bool:
    """A JSON true/false."""
    value = data[key]
    if not isinstance(value, bool):
        raise SpecError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def choice(data: Mapping[str, Any], key: str, options: Iterable[str], where: str) -> str:
    """One of a fixed set of strings."""
    value = data[key]
    options = tuple(options)
    if value not in options:
        raise SpecError(f"{where}: {key} must be one of {', '.join(options)}, got {value!r}")
    return value


def text(data: Mapping[str, Any], key: str, where: str) -> str:
    """A non-empty string."""
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value
