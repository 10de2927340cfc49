"""The shipped catalogs under profiles/: models and hardware by name, or any file by path."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.specs.hardware import HardwareSpec, hardware_from_dict
from autotune.specs.limits import MAX_JSON_BYTES, check_name
from autotune.specs.model import ModelSpec, model_from_dict, model_from_hf_config

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"


def read_json(path: Path, what: str, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Load a JSON file of at most `max_bytes`, turning I/O, size and syntax problems into one-line errors
    naming the file. Only regular files are read (a FIFO or device could block or never end)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise SpecError(f"{what} {path}: cannot read (not a regular file); give a JSON file")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise SpecError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:
        raise SpecError(f"{what} {path}: larger than the maximum of {max_bytes:,} bytes; give a smaller file")
    return parse_json(raw, f"{what} {path}")


def parse_json(raw: bytes | str, where: str) -> Any:
    """JSON text (already read) to Python; syntax, encoding, nesting and huge-number problems are one line."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, a number of thousands of digits, deep nesting
        detail = " ".join(str(exc).split()[:12])
        raise SpecError(f"{where}: unreadable JSON ({type(exc).__name__}: {detail})") from None


def model_names() -> list[str]:
    return sorted(p.stem for p in (PROFILES_DIR / "models").glob("*.json"))


def hardware_names() -> list[str]:
    return sorted(p.stem for p in (PROFILES_DIR / "hardware").glob("*.json"))


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a file: autotune's own model format or a Hugging Face config.json."""
    catalog = PROFILES_DIR / "models" / f"{name_or_path}.json"
    if catalog.is_file():
        return model_from_dict(read_json(catalog, "model file"), str(catalog))
    check_name(name_or_path, "path", "--model")  # a config.json's path becomes the model's name
    path = Path(name_or_path)
    if not path.is_file():
        raise SpecError(f"--model {name_or_path!r}: not a catalog model or a file; known models: "
                        f"{', '.join(model_names())} (see `autotune models`)")
    data = read_json(path, "model file")
    if isinstance(data, dict) and str(data.get("schema", "")).startswith("autotune.model"):
        return model_from_dict(data, str(path))
    return model_from_hf_config(data, str(path))


def load_hardware(name_or_path: str) -> HardwareSpec:
    """A catalog GPU by name, or a hardware file by path."""
    catalog = PROFILES_DIR / "hardware" / f"{name_or_path}.json"
    path = catalog if catalog.is_file() else Path(name_or_path)
    if not path.is_file():
        raise SpecError(f"--gpu {name_or_path!r}: not a catalog GPU or a file; known GPUs: "
                        f"{', '.join(hardware_names())} (see `autotune hardware`)")
    return hardware_from_dict(read_json(path, "hardware file"), str(path))


def load_raw(kind: str, name: str) -> dict[str, Any]:
    """The raw catalog entry (for listing descriptions and sources)."""
    return read_json(PROFILES_DIR / kind / f"{name}.json", f"{kind} file")
