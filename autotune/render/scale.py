"""`autotune scale`: the sweep as a table with its marks, a text plot, CSV, --json and --brief lines, and the
progress bar over the sizes."""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from autotune.render.common import brief_line, plan_tag, precision_words, rounded
from autotune.search.scaling import ScalingPoint, ScalingResult
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.units import gib

#: `scale --csv` columns, in this order (a stable interface: add at the end only).
SCALING_CSV_COLUMNS = (
    "gpus", "status", "family", "strategy_change", "tp", "pp", "dp", "cp", "mbs", "num_microbatches", "vpp",
    "schedule", "recompute", "zero", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
    "model_tflops_per_gpu", "peak_memory_gib", "scaling_efficiency", "past_diminishing_returns", "train_days",
    "gpu_hours", "cost_per_million_tokens", "reason",
    # the rest of the plan, as --json has it (appended: earlier columns keep their places)
    "recompute_layers", "sequence_parallel", "tp_overlap", "tp_mode", "vocab", "layers_per_stage", "bucket_size",
    "ep", "etp", "ep_overlap")
#: Plan columns of the CSV, read from the point's plan (the others are the point's own fields)
_PLAN_COLUMNS = frozenset(("tp", "pp", "dp", "cp", "mbs", "num_microbatches", "vpp", "schedule", "recompute", "zero",
                           "recompute_layers", "sequence_parallel", "tp_overlap", "tp_mode", "vocab",
                           "layers_per_stage", "bucket_size", "ep", "etp", "ep_overlap"))
#: What a plan's JSON leaves out when it is the default (specs/plan.py Plan.to_dict: dense and unoverlapped)
_OMITTED = {"ep": 1, "etp": 1, "ep_overlap": False}
_MARK_CHANGE, _MARK_KNEE = "★", "⚠"


def _opt(x: float | None) -> float | None:
    return None if x is None else rounded(x)


def scaling_point_json(p: ScalingPoint) -> dict[str, Any]:
    """One size of `scale --json` (also the source of the CSV row)."""
    est = p.best
    return {
        "gpus": p.gpus, "status": p.status, "reason": p.reason or None,
        "family": p.family or None, "strategy_change": p.strategy_change,
        "plan": None if est is None else est.plan.to_dict(),
        "step_time_s": None if est is None else rounded(est.step_time_s),
        "tokens_per_s": None if est is None else rounded(est.tokens_per_s),
        "tokens_per_s_per_gpu": _opt(p.tokens_per_s_per_gpu),
        "mfu": None if est is None else rounded(est.mfu),
        "model_tflops_per_gpu": None if est is None else rounded(est.model_tflops_per_gpu),
        "peak_memory_gib": None if est is None else rounded(gib(est.peak_memory_bytes)),
        "scaling_efficiency": _opt(p.efficiency), "past_diminishing_returns": p.past_knee,
        "train_days": _opt(p.train_days), "gpu_hours": _opt(p.gpu_hours),
        "cost_per_million_tokens": _opt(p.cost_per_million_tokens), "wall_s": rounded(p.wall_s),
    }


def scaling_json(result: ScalingResult, model: ModelSpec, hw: HardwareSpec, job: JobSpec) -> dict[str, Any]:
    """`scale --json`: the sweep's inputs, one object per size, the diminishing-returns point."""
    return {
        "model": model.name, "gpu": hw.name, "gpus_per_node": hw.gpus_per_node, "global_batch": job.global_batch,
        "seq_len": job.seq_len, "tokens_per_step": job.tokens_per_step, "dtype": job.dtype,
        "grad_reduce": job.grad_reduce, "optimizer_states": job.optimizer_states, "kernels": job.trainer,
        **({"attention_backend": job.runs_attention} if job.trainer != "megatron" and job.flash_attention else {}),
        "train_tokens": result.train_tokens, "price_per_gpu_hour": result.price_per_gpu_hour,
        "efficiency_threshold": result.efficiency_threshold, "diminishing_returns_after_gpus": result.knee_gpus,
        "points": [scaling_point_json(p) for p in result.points],
    }


def scaling_csv(result: ScalingResult) -> str:
    """`scale --csv`: a header and one row per size in SCALING_CSV_COLUMNS order; empty cells for no value;
    no timings, so the bytes are the same on every run."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SCALING_CSV_COLUMNS)
    for p in result.points:
        doc = scaling_point_json(p)
        plan = doc["plan"] or {}
        row = []
        for col in SCALING_CSV_COLUMNS:
            value = (plan.get(col, _OMITTED.get(col) if plan else None) if col in _PLAN_COLUMNS else doc[col])
            if isinstance(value, list):  # layers per stage, ';'-separated as in runs.csv
                value = ";".join(map(str, value))
            row.append("" if value is None else str(value).lower() if isinstance(value, bool) else value)
        writer.writerow(row)
    return out.getvalue()


def _cell(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def scaling_table(result: ScalingResult) -> Table:
    price = result.price_per_gpu_hour
    table = Table(title=f"Best plan at each size (plan: v = interleaved chunks, zb = ZB-H1, vhalf = V-Half, z = "
                        f"ZeRO stage, sel = selective recompute); days and GPU-hours to train "
                        f"{result.train_tokens:.3g} tokens",
                  title_justify="left", box=None, padding=(0, 1), pad_edge=False,
                  header_style="bold underline")
    cols = ["", "GPUs", "strategy", "plan", "step s", "tokens/s", "MFU %", "tok/s/GPU", "scaling", "days",
            "GPU-hours"] + (["$/M tok"] if price is not None else [])
    for col in cols:
        # the words columns wrap (strategy to 'tp+pp+cp', the plan between its words), so a narrow or piped
        # table keeps every figure whole (a price's $/M tok column was cut to '67.02' of 67.027: user-tester)
        table.add_column(col, justify="left" if col in ("", "strategy", "plan") else "right",
                         no_wrap=col not in ("strategy", "plan"), min_width=8 if col == "strategy" else None)

    for p in result.points:
        marks = (_MARK_CHANGE if p.strategy_change else "") + (_MARK_KNEE if p.past_knee and p.best else "")
        if p.best is None:
            cells = [Text(f"no plan ({p.status}, see below)", style="red")] + ["-"] * (len(cols) - 4)
            table.add_row(marks, str(p.gpus), "-", *cells)
            continue
        est = p.best
        row = [marks, str(p.gpus), p.family, plan_tag(est.plan) + ("" if p.status == "OPTIMAL" else " (not proven)"),
               f"{est.step_time_s:.2f}", f"{est.tokens_per_s:,.0f}", f"{100 * est.mfu:.1f}",
               f"{p.tokens_per_s_per_gpu:,.0f}", _cell(p.efficiency, ".2f"), f"{p.train_days:,.1f}",
               f"{p.gpu_hours:,.0f}"]
        table.add_row(*row, *([_cell(p.cost_per_million_tokens, ".3f")] if price is not None else []))
    return table


def scaling_plot(result: ScalingResult, width: int = 50) -> str:
    """A text chart of tokens/s per GPU (bars) against GPUs (one row per size, log2 scale), with the
    throughput at the end of each bar; pure text, the same bytes on every run."""
    values = [p.tokens_per_s_per_gpu for p in result.points if p.tokens_per_s_per_gpu is not None]
    top = max(values, default=0.0) or 1.0
    lines = ["tokens/s per GPU (bars) vs GPUs (rows, each a step on a log2 axis): flat bars = linear scaling"]
    for p in result.points:
        label = f"{p.gpus:>6}"
        if p.tokens_per_s_per_gpu is None:
            lines.append(f"{label} | {'(no plan)':<{width}}")
            continue
        bar = "#" * max(1, round(width * p.tokens_per_s_per_gpu / top))
        mark = (_MARK_CHANGE if p.strategy_change else " ") + (_MARK_KNEE if p.past_knee else " ")
        lines.append(f"{label} | {bar:<{width}} {p.tokens_per_s_per_gpu:>8,.0f} {mark} "
                     f"total {p.best.tokens_per_s:,.0f} tokens/s")
    return "\n".join(lines)


def scaling_report(result: ScalingResult, model: ModelSpec, hw: HardwareSpec, job: JobSpec) -> RenderableType:
    """`scale`'s human output: the header, the table, the marks explained, the plot."""
    legend = (f"{_MARK_CHANGE} = the strategy family changes from the previous size; {_MARK_KNEE} = past "
              f"the point where more GPUs give < {result.efficiency_threshold:.0%} of their share in throughput")
    if result.knee_gpus is not None:
        legend += f" (diminishing returns past {result.knee_gpus} GPUs)"
    parts: list[RenderableType] = [
        Text(f"{model.name} on {hw.name} ({hw.gpus_per_node} per node), global batch {job.global_batch} x "
             f"{job.seq_len} tokens, {precision_words(job)}", style="bold"),
        scaling_table(result),
        Text("scaling = (throughput ratio) / (GPU ratio) against the previous size; " + legend),
    ]
    parts += [Text(f"{p.gpus} GPUs, no plan ({p.status}): {p.reason}", style="red")
              for p in result.points if p.best is None]
    parts += [Text(""), Text(scaling_plot(result))]
    if any(p.status not in ("OPTIMAL", "INFEASIBLE") for p in result.points):
        parts.append(Text("some sizes hit --work-limit or --time-limit before the search finished: raise it to "
                          "prove their plans", style="yellow"))
    return Group(*parts)


@contextmanager
def scale_progress(enabled: bool) -> Iterator[Callable[[int, int, int], None] | None]:
    """A progress bar on stderr over the sizes of a sweep; None (silent) when disabled or when stderr is not a
    terminal."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True, highlight=False), transient=True)
    with bar:
        task = bar.add_task("searching", total=None)

        def update(index: int, sizes: int, gpus: int) -> None:
            bar.update(task, total=sizes, completed=index - 1, description=f"searching {gpus:,} GPUs")
        yield update


def scaling_brief(result: ScalingResult) -> str:
    """`scale --brief`: one line per GPU count (its status, and its best plan when there is one)."""
    return "\n".join(brief_line(p.best, prefix=f"gpus={p.gpus} status={p.status}") if p.best is not None
                     else f"gpus={p.gpus} status={p.status}" for p in result.points)
