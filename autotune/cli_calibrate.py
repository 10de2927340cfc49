"""`autotune calibrate RUNS.csv`: fit the hardware profile's efficiencies to measured step times.

Registered on the shared app by importing this module from cli.py; the work is in autotune/calibrate.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from autotune.calibrate import calibrate as fit_runs
from autotune.calibrate import format_calibration, write_calibrated
from autotune.cli import app


@app.command()
def calibrate(
    runs: Annotated[Path, typer.Argument(metavar="RUNS.csv", help="Measured runs, one per line (see the docs).")],
    out: Annotated[Path | None, typer.Option("--out", metavar="FILE",
                                             help="Calibrated hardware file (default: ./<gpu>-calibrated.json).")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the table.")] = False,
) -> None:
    """Fit the hardware efficiencies to measured step times; report error before, after and leave-one-out."""
    cal = fit_runs(runs)
    target = out if out is not None else Path(f"{cal.runs_file.hw_raw['name']}-calibrated.json")
    written = write_calibrated(cal, target)
    if json_out:
        typer.echo(json.dumps({**cal.to_dict(), "out": str(written)}, indent=2, sort_keys=True))
    else:
        typer.echo(format_calibration(cal))
        typer.echo(f"wrote {written}  (use it as --gpu {written})")
