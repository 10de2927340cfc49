"""Which trainers run the best plan as planned, and the best plan of each that does not (`plan` without
--trainer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from autotune.costmodel.estimate import Estimate
from autotune.render.common import plan_line, rounded
from autotune.search.trainers import TrainerBest
from autotune.units import gib


def trainers_json(fits: Sequence[TrainerBest]) -> list[dict[str, Any]]:
    """`plan --json` without --trainer: per trainer, whether it runs the winner, why not, and its own best."""
    out = []
    for f in fits:
        entry: dict[str, Any] = {"trainer": f.trainer, "runs_best": not f.unsupported,
                                 "unsupported": list(f.unsupported), "status": f.status}
        if f.best is not None:
            entry["best"] = {"plan": f.best.plan.to_dict(), "step_time_s": rounded(f.best.step_time_s),
                             "mfu": rounded(f.best.mfu), "peak_memory_gib": rounded(gib(f.best.peak_memory_bytes))}
        if f.note:
            entry["note"] = f.note
        out.append(entry)
    return out


def trainers_report(fits: Sequence[TrainerBest], best: Estimate) -> RenderableType:
    """Which trainers run the best plan; for the others, the best plan they do run (`plan --trainer T`)."""
    runs = [f.trainer for f in fits if not f.unsupported]
    fork = "" if runs else " (a Megatron-LM fork may: --trainer megatron --fork NAME)"
    parts: list[RenderableType] = [Text(f"runs the best plan as planned: {', '.join(runs) or 'no trainer'}{fork}",
                                        style="bold")]
    others = [f for f in fits if f.unsupported]
    if others:
        table = Table(title="Best plan of each trainer that does not run it (= plan --trainer T, same pins)",
                      title_justify="left")
        for col in ("trainer", "lacks", "its best plan", "step s", "MFU %"):
            table.add_column(col, justify="right" if col in ("step s", "MFU %") else "left")
        for f in others:
            if f.best is None:
                table.add_row(f.trainer, "; ".join(f.unsupported), f"none ({f.status}): {f.note}", "-", "-")
            else:
                slower = 100 * (f.best.step_time_s / best.step_time_s - 1)
                table.add_row(f.trainer, "; ".join(f.unsupported), f"{plan_line(f.best.plan)} (+{slower:.1f}%)",
                              f"{f.best.step_time_s:.3f}", f"{100 * f.best.mfu:.1f}")
        parts.append(table)
    return Group(*parts)
