"""`autotune calibrate RUNS.csv`: fit the hardware profile's efficiencies to measured step times.

Registered in cli/app.py; the work is in autotune/reports/calibrate.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.cli.options import show_warnings, time_limited
from autotune.errors import SpecError
from autotune.fileio import check_target, decode_text, read_bounded, slug
from autotune.render.common import dump_json
from autotune.reports.calibrate import calibrate as fit_runs
from autotune.reports.calibrate import format_calibration, write_calibrated
from autotune.specs.limits import MAX_CALIBRATION_RUNS, MAX_RUNS_FILE_BYTES


def check_runs_file(path: Path) -> None:
    """The documented maxima of a runs file (size, runs), before anything is parsed or fitted."""
    raw = read_bounded(path, str(path), MAX_RUNS_FILE_BYTES, noun="the runs file",
                       fix="give a CSV of measured runs (see the docs)")
    lines = decode_text(raw, f"{path}: the runs file").splitlines()
    runs = sum(1 for line in lines if line.strip() and not line.lstrip().startswith("#")) - 1  # minus the header
    if runs > MAX_CALIBRATION_RUNS:
        raise SpecError(f"{path}: {runs} runs exceed the maximum of {MAX_CALIBRATION_RUNS} per calibration; split "
                        "the file or keep the runs that matter most")


def _not_the_runs(target: Path, runs: Path) -> None:
    """The calibrated hardware file must not replace the measured runs it was fitted to."""
    if target.resolve() == runs.resolve():
        raise SpecError(f"--out {target} is the runs file itself: writing the hardware file there would replace the "
                        "measured runs; give another --out")


def calibrate(
    runs: Annotated[Path, typer.Argument(metavar="RUNS.csv", help="Measured runs, one per line (see the docs).")],
    out: Annotated[Path | None, typer.Option("--out", metavar="FILE",
                                             help="Calibrated hardware file (default: ./<gpu>-calibrated.json, <gpu> "
                                                  "the hardware file's name with only letters, digits and ._+-).")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the table.")] = False,
    time_limit: Annotated[float, typer.Option("--time-limit", metavar="S", help="Wall-clock limit of the fit in "
                                              "seconds (exit 3 when it strikes; nothing is written).")] = 600.0,
) -> None:
    """Fit the hardware efficiencies to measured step times; report error before, after and leave-one-out."""
    check_runs_file(runs)
    if out is not None:
        check_target(out, directory=False)
        _not_the_runs(out, runs)
    with time_limited(time_limit, "calibrate"):
        cal = fit_runs(runs)
    show_warnings(list(cal.unfit))
    target = out if out is not None else Path(f"{slug(str(cal.runs_file.hw_raw['name']))}-calibrated.json")
    _not_the_runs(target, runs)
    written = write_calibrated(cal, target)
    if json_out:
        typer.echo(dump_json({**cal.to_dict(), "out": str(written)}, sort_keys=True))
    else:
        typer.echo(format_calibration(cal))
        typer.echo(f"wrote {written}  (use it as --gpu {written})")
