"""Strict readers for dictionaries loaded from JSON: unknown and missing keys are errors that list them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autotune.errors import SpecError


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


def positive_int(data: Mapping[str, Any], key: str, where: str) -> int:
    """An integer > 0 (JSON numbers like 4.0 are accepted when whole)."""
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise SpecError(f"{where}: {key} must be a whole number, got {value!r}")
    if value <= 0:
        raise SpecError(f"{where}: {key} must be > 0, got {value!r}")
    return int(value)


def positive_float(data: Mapping[str, Any], key: str, where: str) -> float:
    """A finite number > 0."""
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise SpecError(f"{where}: {key} must be a number > 0, got {value!r}")
    return float(value)


def fraction(data: Mapping[str, Any], key: str, where: str) -> float:
    """A number in (0, 1]."""
    value = positive_float(data, key, where)
    if value > 1:
        raise SpecError(f"{where}: {key} must be in (0, 1], got {value!r}")
    return value


def nonneg_float(data: Mapping[str, Any], key: str, where: str) -> float:
    """A finite number >= 0."""
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value == float("inf"):
        raise SpecError(f"{where}: {key} must be a number >= 0, got {value!r}")
    return float(value)


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
