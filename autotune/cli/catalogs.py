"""`autotune models` and `autotune hardware`: the catalog, as tables or --json."""

from __future__ import annotations

from autotune.catalog import hardware_names, load_hardware, load_model, load_raw, model_names
from autotune.cli.options import JsonOpt, show
from autotune.render.catalogs import hardware_json, hardware_table, models_json, models_table


def models(json_out: JsonOpt = False) -> None:
    """List the catalog models."""
    entries = [(load_model(name), load_raw("models", name)) for name in model_names()]
    show(models_json(entries) if json_out else models_table(entries), json_out)


def hardware(json_out: JsonOpt = False) -> None:
    """List the catalog GPUs."""
    entries = [(load_hardware(name), load_raw("hardware", name)) for name in hardware_names()]
    show(hardware_json(entries) if json_out else hardware_table(entries), json_out)

