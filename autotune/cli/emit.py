"""`autotune emit`: a trainer's launch config from a saved plan (plan.json or `plan --json`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.cli.inputs import read_document
from autotune.cli.launch import check_emit_options, document_reestimator, launch_config, write_launch
from autotune.cli.options import FormatOpt, MockDataOpt, RunTokensOpt, StrictOpt, show_warnings
from autotune.emit import TRAINERS
from autotune.emit.document import document_trainer, emit_input_from_document
from autotune.fileio import check_target
from autotune.render.common import written_report
from autotune.search.scaling import DEFAULT_TRAIN_TOKENS


def emit_command(
    plan_file: Annotated[str, typer.Option("--plan", metavar="FILE|-", help="A saved plan: plan.json or the output "
                                           "of `autotune plan --json` (- reads stdin).")],
    trainer: Annotated[str, typer.Option("--trainer", metavar="|".join(TRAINERS), help="Trainer to configure.")],
    out: Annotated[str | None, typer.Option("--out", metavar="FILE|DIR", help="Where to write (default: stdout, "
                                            "for a single file); a trainer writing several files needs a DIR.")] = None,
    torchtitan_format: FormatOpt = None, strict: StrictOpt = False,
    model: Annotated[str | None, typer.Option("--model", metavar="NAME|FILE", help="Check that the plan is for "
                                              "this model.")] = None,
    mock_data: MockDataOpt = False, train_tokens: RunTokensOpt = DEFAULT_TRAIN_TOKENS,
) -> None:
    """Write a trainer's launch config from a saved plan."""
    check_emit_options(trainer, torchtitan_format, strict)
    if out is not None:
        check_target(Path(out), directory=False)
    where = "the plan on stdin" if plan_file == "-" else plan_file
    doc = read_document(plan_file, "--plan")
    inp = emit_input_from_document(doc, where, model)
    planned_for = document_trainer(doc, where)
    if planned_for is not None and planned_for.split("+")[0] != trainer:
        show_warnings([f"{where} was searched for {planned_for}, not {trainer}: {trainer} may not run it as planned "
                       f"(plan again with --trainer {trainer} for the best plan it runs)"])
    reestimate, inp = document_reestimator(inp, doc)
    result = launch_config(trainer, inp, torchtitan_format=torchtitan_format, strict=strict,
                           reestimate=reestimate, mock_data=mock_data, train_tokens=train_tokens)
    written = write_launch(out, trainer, result)
    show_warnings(result.warnings)
    if written:
        typer.echo(written_report(written))
