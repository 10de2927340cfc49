"""`autotune models` and `autotune hardware`: the catalog, as tables or --json."""

from __future__ import annotations

from typing import Annotated

import typer

from autotune.catalog import hardware_names, load_hardware, load_model, load_raw, model_names
from autotune.cli.options import JsonOpt, show
from autotune.render.catalogs import hardware_json, hardware_table, models_json, models_table


def models(names: Annotated[list[str] | None, typer.Argument(
        metavar="[MODEL]...", show_default=False,
        help="Catalog names or config.json paths to show, each as plan and estimate read it (default: the whole "
             "catalog).")] = None,
        json_out: JsonOpt = False) -> None:
    """List the catalog models, or show how the given ones (a config.json among them) are read."""
    catalog = set(model_names())
    entries = [(load_model(name), load_raw("models", name) if name in catalog else {})
               for name in (names or model_names())]
    show(models_json(entries) if json_out else models_table(entries, readings=bool(names)), json_out)


def hardware(json_out: JsonOpt = False) -> None:
    """List the catalog GPUs."""
    entries = [(load_hardware(name), load_raw("hardware", name)) for name in hardware_names()]
    show(hardware_json(entries) if json_out else hardware_table(entries), json_out)
