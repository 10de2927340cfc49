"""The shipped catalogs under profiles/: models and hardware by name, or any file by path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.specs.hardware import HardwareSpec, hardware_from_dict
from autotune.specs.model import ModelSpec, model_from_dict, model_from_hf_config

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"


def read_json(path: Path, what: str) -> Any:
    """Load a JSON file, turning I/O and syntax problems into one-line errors naming the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{what} {path}: cannot read ({exc.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{what} {path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def model_names() -> list[str]:
    return sorted(p.stem for p in (PROFILES_DIR / "models").glob("*.json"))


def hardware_names() -> list[str]:
    return sorted(p.stem for p in (PROFILES_DIR / "hardware").glob("*.json"))


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a file: autotune's own model format or a Hugging Face config.json."""
    catalog = PROFILES_DIR / "models" / f"{name_or_path}.json"
    if catalog.is_file():
        return model_from_dict(read_json(catalog, "model file"), str(catalog))
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
