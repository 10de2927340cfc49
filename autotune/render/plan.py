"""`autotune plan`: the search's progress bar, the best plan (explained as `estimate` does), the runners-up and
why each lost, the user's own plan beside it (--compare), and the --json document."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.pipeline import Timeline
from autotune.render.common import plan_brief, plan_line, precision_words, rounded, stage_layout
from autotune.render.estimate import estimate_json, explanation, job_json
from autotune.search.planner import PlanResult, SearchProgress
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.trainer_jobs import runs_mtp
from autotune.units import gib


@dataclass(frozen=True, slots=True)
class Comparison:
    """The user's own plan (`plan --compare FILE`), estimated beside the planner's."""

    source: str
    """The file it came from ('-' for stdin)."""
    estimate: Estimate
    problem: str | None
    """Why it does not fit (which stage, which terms), or None when it does."""


@contextmanager
def search_progress(enabled: bool, *, delay_s: float = 1.0) -> Iterator[Callable[[SearchProgress], None] | None]:
    """A progress bar on stderr for a search that runs past `delay_s`: the gap between the best step time
    found and the smallest bound left closes as the proof advances; None (silent) when disabled or when stderr
    is not a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    start = time.perf_counter()
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                   TimeElapsedColumn(), console=Console(stderr=True, highlight=False), transient=True)
    task, origin = None, math.nan  # the bound when the bar first had a plan to measure the gap against

    def update(p: SearchProgress) -> None:
        nonlocal task, origin
        if task is None:
            if time.perf_counter() - start < delay_s:
                return
            bar.start()
            task = bar.add_task(f"searching {p.candidates:,} candidates", total=1.0, status="")
        if math.isinf(p.best_s):
            bar.update(task, completed=0.0, status=f"{p.solves} solves, no plan yet")
            return
        origin = p.bound_s if math.isnan(origin) else min(origin, p.bound_s)
        done = 1.0 if p.best_s <= origin else (p.bound_s - origin) / (p.best_s - origin)
        gap = max(0.0, 1 - p.bound_s / p.best_s)
        bar.update(task, completed=min(max(done, 0.0), 1.0),
                   status=f"{p.solves} solves, best {p.best_s:.4g} s, gap {100 * gap:.1f}%")

    try:
        yield update
    finally:
        if task is not None:
            bar.stop()


def solver_line(result: PlanResult) -> str:
    """'N candidates, X pruned by bound, Y by memory, Z CP-SAT solves, status OPTIMAL, W s'."""
    s = result.stats
    line = (f"{s.candidates} candidates, {s.pruned_bound} pruned by bound, {s.pruned_memory} by memory, "
            f"{s.solved} CP-SAT solves, status {result.status}, {s.wall_s:.2f} s")
    return line if result.status == "OPTIMAL" else f"{line}, gap {100 * result.gap:.1f}%"


def limit_note(result: PlanResult) -> str:
    """What a limit that struck means for the result ('' when none did)."""
    flag = "--time-limit" if result.limit == "time" else "--work-limit"
    if result.status != "OPTIMAL":
        how_far = ("no bound on the optimum was proven yet" if result.gap >= 1.0 else  # no candidate bounded
                   f"the optimum may be up to {100 * result.gap:.1f}% faster")
        return (f"{flag} reached before the search finished: {how_far}; raise {flag} to prove it"
                + (" (the plan found may differ on another machine)" if result.limit == "time" else ""))
    if result.limit == "time":
        return "--time-limit reached while the runners-up were searched: they may differ on another machine"
    return ""


def _faster_by(best: Estimate, other: Estimate) -> float:
    """How much faster `best` is than `other`, in percent of best's step time."""
    return 100 * (other.step_time_s / best.step_time_s - 1)


def plan_json(result: PlanResult, model: ModelSpec, hw: HardwareSpec, job: JobSpec,
              compare: Comparison | None = None) -> dict[str, Any]:
    """`plan --json`: the estimate of the best plan, then the search, the runners-up and the comparison."""
    s = result.stats
    doc = estimate_json(result.best, model, hw, job)
    doc["solver"] = {"status": result.status, "wall_s": rounded(s.wall_s), "candidates": s.candidates,
                     "pruned_bound": s.pruned_bound, "pruned_memory": s.pruned_memory, "solved": s.solved,
                     "gap": rounded(result.gap), "work": rounded(s.work), "limit": result.limit or None,
                     "runners_up_cut": result.runners_up_cut}
    doc["runners_up"] = [{"plan": r.estimate.plan.to_dict(), "step_time_s": rounded(r.estimate.step_time_s),
                          "mfu": rounded(r.estimate.mfu), "peak_memory_gib": rounded(gib(r.estimate.peak_memory_bytes)),
                          "fits": r.estimate.fits, "reason": r.reason} for r in result.runners_up]
    if compare is not None:
        est = compare.estimate
        doc["compare"] = {
            "source": compare.source, "plan": est.plan.to_dict(), "step_time_s": rounded(est.step_time_s),
            "tokens_per_s": rounded(est.tokens_per_s), "model_tflops_per_gpu": rounded(est.model_tflops_per_gpu),
            "mfu": rounded(est.mfu), "peak_memory_gib": rounded(gib(est.peak_memory_bytes)),
            "memory_per_stage_gib": [rounded(gib(st.memory.total)) for st in est.stages], "fits": est.fits,
            "problem": compare.problem, "planner_faster_by_pct": rounded(_faster_by(result.best, est)),
        }
    return doc


def infeasible_json(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, message: str,
                    compare: Comparison | None = None) -> dict[str, Any]:
    """`plan --json` when no plan fits (exit 2): the fields of a point of `scale --json` that has none, the job,
    and the compared plan's verdict where --compare gave one, so that a script reads one object either way."""
    doc: dict[str, Any] = {"plan": None, "fits": False, "status": "INFEASIBLE", "reason": message,
                           "job": job_json(model, hw, job, gpus), "solver": {"status": "INFEASIBLE"},
                           "runners_up": []}
    if compare is not None:
        est = compare.estimate
        doc["compare"] = {"source": compare.source, "plan": est.plan.to_dict(), "step_time_s": rounded(est.step_time_s),
                          "peak_memory_gib": rounded(gib(est.peak_memory_bytes)), "fits": est.fits,
                          "problem": compare.problem}
    return doc


def plan_report(result: PlanResult, model: ModelSpec, hw: HardwareSpec, job: JobSpec,
                compare: Comparison | None = None, timeline: Timeline | None = None) -> RenderableType:
    """The human report of a search: the best plan explained as `estimate` does, runners-up, comparison."""
    best = result.best
    title = "best plan" if result.status == "OPTIMAL" else "best plan found (not proven optimal)"
    parts: list[RenderableType] = [
        Text(f"{model.name} on {hw.name} x {best.plan.num_gpus} ({hw.gpus_per_node} per node), global batch "
             f"{job.global_batch} x {job.seq_len} tokens, {precision_words(job)}", style="bold"),
        Text(f"{title}: {plan_line(best.plan)}"),
        Text(f"layers per stage: {stage_layout(best)}  (E = embedding, H = LM head"
             + (f" with the {model.name} MTP module(s)" if runs_mtp(model, job) else "") + ", V/p = 1/p of both)"),
    ]
    note = limit_note(result)
    if note:
        parts.append(Text(note, style="yellow"))
    blocks = explanation(best, timeline)
    if result.runners_up:
        blocks.append(_runners_up_table(result))
    if compare is not None:
        blocks.append(_comparison(result.best, compare))
    blocks.append(Text(f"search: {solver_line(result)}"))
    for block in blocks:
        parts += [Text(""), block]
    return Group(*parts)


def _runners_up_table(result: PlanResult) -> Table:
    table = Table(title="Runners-up, and why each lost (E = embedding, H = LM head)", title_justify="left")
    for col in ("#", "plan", "step s", "MFU %", "peak GiB"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    for rank, r in enumerate(result.runners_up, start=2):
        est = r.estimate
        cell = Text(f"{plan_brief(est.plan)}\nlayers {stage_layout(est, elide=True)}: ")
        cell.append(r.reason, style="" if est.fits else "red")
        table.add_row(str(rank), cell, f"{est.step_time_s:.3f}", f"{100 * est.mfu:.1f}",
                      f"{gib(est.peak_memory_bytes):.1f}")
    return table


def _comparison(best: Estimate, compare: Comparison) -> RenderableType:
    mine = compare.estimate
    table = Table(title=f"Compared with your plan ({compare.source})", title_justify="left")
    for col in ("", "step time s", "tokens/s", "MFU %", "peak memory GiB", "fits", "layers"):
        table.add_column(col, justify="left" if col in ("", "layers") else "right")
    for name, est in (("planner", best), ("yours", mine)):
        table.add_row(name, f"{est.step_time_s:.3f}", f"{est.tokens_per_s:,.0f}", f"{100 * est.mfu:.1f}",
                      f"{gib(est.peak_memory_bytes):.2f}", "yes" if est.fits else Text("NO", style="red"),
                      stage_layout(est, elide=True))
    lines: list[RenderableType] = [table, Text("yours: " + plan_line(mine.plan))]
    if compare.problem is not None:
        lines.append(Text(f"your plan does not fit: {compare.problem}", style="red"))
    pct = _faster_by(best, mine)
    if pct >= 0.05:
        verdict = f"the planner's plan is {pct:.1f}% faster"
    elif pct <= -0.05:
        verdict = f"your plan is {-pct:.1f}% faster" + ("" if not mine.fits else ", in a part of the space the search "
                                                        "does not cover (or was stopped before)")
    else:
        verdict = "the two plans have the same predicted step time"
    lines.append(Text(verdict + ("" if mine.fits else ", and yours does not fit"), style="bold"))
    return Group(*lines)
