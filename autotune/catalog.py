"""The shipped catalogs under profiles/: models and hardware by name, or any file by path."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune import fileio
from autotune.specs.hardware import HardwareSpec, hardware_from_dict
from autotune.specs.limits import MAX_JSON_BYTES, MAX_JSON_DEPTH, NAME_PATTERN, check_name
from autotune.specs.model import ModelSpec, model_from_dict, model_from_hf_config

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"


def read_json(path: Path, what: str, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Load a JSON file of at most `max_bytes` bytes and MAX_JSON_DEPTH levels, turning I/O, size, encoding,
    nesting and syntax problems into one-line errors naming the file (autotune/fileio.py)."""
    where = f"{what} {path}"
    return parse_json(fileio.read_bounded(path, where, max_bytes, fix="give a JSON file"), where)


def parse_json(raw: bytes | str, where: str) -> Any:
    """JSON already read (a file's bytes, stdin) to Python, at most MAX_JSON_DEPTH levels deep; encoding, nesting,
    syntax and out-of-range numbers are one-line errors naming `where`."""
    return fileio.parse_json(raw, where, max_depth=MAX_JSON_DEPTH)


def _catalog_file(kind: str, name: str) -> Path | None:
    """profiles/<kind>/<name>.json when `name` is a catalog name (a name without `/`, checked before any path is
    built from it) and the file exists; else None."""
    if NAME_PATTERN.fullmatch(name) is None or "/" in name:
        return None
    path = PROFILES_DIR / kind / f"{name}.json"
    return path if path.is_file() else None


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def model_names() -> list[str]:
    return sorted(p.stem for p in (PROFILES_DIR / "models").glob("*.json"))


def hardware_names() -> list[str]:
    return sorted(p.stem for p in (PROFILES_DIR / "hardware").glob("*.json"))


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a file: autotune's own model format or a Hugging Face config.json."""
    catalog = _catalog_file("models", name_or_path)
    if catalog is not None:
        return model_from_dict(read_json(catalog, "model file"), str(catalog))
    check_name(name_or_path, "path", "--model")  # a config.json's path becomes the model's name
    path = Path(name_or_path)
    if _is_dir(name_or_path):  # a Hugging Face checkpoint folder, as transformers' from_pretrained takes one
        if not (path / "config.json").is_file():
            raise SpecError(f"--model {name_or_path!r} is a directory without a config.json; give the model file's "
                            "path")
        return load_model(str(path / "config.json"))
    if not _is_file(name_or_path):
        raise SpecError(f"--model {name_or_path!r}: not a catalog model or a file; known models: "
                        f"{', '.join(model_names())} (see `autotune models`)")
    data = read_json(path, "model file")
    if isinstance(data, dict) and str(data.get("schema", "")).startswith("autotune.model"):
        return model_from_dict(data, str(path))
    return _as_catalog_twin(model_from_hf_config(data, str(path)))


def _as_catalog_twin(spec: ModelSpec) -> ModelSpec:
    """A config.json that describes a catalog model exactly (every field but the name and the source: the shape
    and the training settings) records that model as its catalog_name, the name trainers know it by: torchtitan
    ships its MoE models and flavors by name, so Qwen/Qwen3-30B-A3B's config.json plans for torchtitan as
    `--model qwen3-30b-a3b` does. It keeps its path as its name, which saved plans and profiles record."""
    twin = catalog_twin(spec)
    return spec if twin is None else replace(spec, catalog_name=twin.name)


def catalog_twin(spec: ModelSpec) -> ModelSpec | None:
    """The catalog model `spec` is exactly, but for its name, source and catalog_name; None if none."""
    for name in model_names():
        twin = load_model(name)
        if replace(spec, name=twin.name, source=twin.source, catalog_name="") == twin:
            return twin
    return None


def load_hardware(name_or_path: str) -> HardwareSpec:
    """A catalog GPU by name, or a hardware file by path."""
    catalog = _catalog_file("hardware", name_or_path)
    path = catalog if catalog is not None else Path(name_or_path)
    if catalog is None and _is_dir(name_or_path):
        raise SpecError(f"--gpu {name_or_path!r} is a directory; give a catalog GPU name or a hardware file's path")
    if catalog is None and not _is_file(name_or_path):
        check_name(name_or_path, "name", "--gpu")  # a very long or odd --gpu gets the name rule, not an OSError
        raise SpecError(f"--gpu {name_or_path!r}: not a catalog GPU or a file; known GPUs: "
                        f"{', '.join(hardware_names())} (see `autotune hardware`)")
    return hardware_from_dict(read_json(path, "hardware file"), str(path))


def load_raw(kind: str, name: str) -> dict[str, Any]:
    """The raw catalog entry (for listing descriptions and sources)."""
    return read_json(PROFILES_DIR / kind / f"{name}.json", f"{kind} file")
