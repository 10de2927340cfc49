"""Everything the CLI shows: rich renderables for people, plain dicts for ``--json``.

Functions here take finished results (specs, an `Estimate`, a `PlanResult`) and only format them; no cost is
computed here beyond unit conversion and shares of a total. JSON floats are rounded so that output is
byte-identical across runs and platforms.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.memory import total_params
from autotune.costmodel.pipeline import Timeline
from autotune.costmodel.stages import StageCost
from autotune.scaling import ScalingPoint, ScalingResult
from autotune.search.planner import PlanResult, SearchProgress
from autotune.search.trainers import TrainerBest
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan
from autotune.timeline import schedule_chart, stage_bars, stage_label
from autotune.units import GB, TERA, gib

#: Console width when stdout is not a terminal, so piped output and tests do not depend on $COLUMNS.
PIPE_WIDTH = 120
_DIGITS = 6

_BREAKDOWN_LABELS = {
    "compute_s": "compute", "recompute_s": "recomputation", "tp_comm_s": "tensor-parallel comm",
    "cp_comm_s": "context-parallel comm", "pp_comm_s": "pipeline p2p", "bubble_s": "pipeline bubble",
    "dp_comm_exposed_s": "data-parallel comm (exposed)", "optimizer_s": "optimizer step",
}
_OP_LABELS = {"gemm": "tensor contractions (gemm)", "attention": "attention", "norm": "normalizations (norm)",
              "elementwise": "element-wise", "vocab": "vocabulary layers"}
_MEMORY_LABELS = {"weights": "weights", "gradients": "grads", "optimizer": "optimizer",
                  "activations": "activations", "vocab_activations": "vocab act", "transient": "transient"}


def make_console() -> Console:
    """A stdout console; fixed width when piped (created per command, after test runners swap stdout)."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(width=PIPE_WIDTH, highlight=False)


def dump_json(obj: Any, *, sort_keys: bool = False) -> str:
    """The one JSON object a ``--json`` command prints (key order as built, so output is stable). JSON has no NaN
    or infinity: a number that is not finite (an undefined ratio) is written as null, never as `NaN`."""
    return json.dumps(_finite(obj), sort_keys=sort_keys, indent=2, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {key: _finite(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(value) for value in obj]
    return obj


def _r(x: float) -> float:
    return round(float(x), _DIGITS)


# ------------------------------------------------------------------------------------------------ catalogs
def models_json(models: Sequence[tuple[ModelSpec, Mapping[str, Any]]]) -> dict[str, Any]:
    """`models --json`: each catalog model's shape, parameter count and source."""
    return {"models": [{
        "name": m.name, "num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_heads": m.num_heads,
        "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim, "ffn_hidden_size": m.ffn_hidden_size,
        "vocab_size": m.vocab_size, "activation": m.activation, "norm": m.norm, "tied_embeddings": m.tied_embeddings,
        "params_B": _r(total_params(m) / 1e9), "published_params_B": raw.get("published_params_B"),
        "description": raw.get("description", ""), "source": m.source,
    } for m, raw in models]}


def models_table(models: Sequence[tuple[ModelSpec, Mapping[str, Any]]]) -> Table:
    table = Table(title="Models (--model NAME, or a path to a config.json)", title_justify="left")
    for col in ("name", "layers", "hidden", "heads/kv", "ffn", "vocab", "act", "params B"):
        table.add_column(col, justify="left" if col in ("name", "act") else "right", no_wrap=True)
    table.add_column("source")  # the only column that shrinks to fit the width
    for m, _ in models:
        table.add_row(m.name, str(m.num_layers), str(m.hidden_size), f"{m.num_heads}/{m.num_kv_heads}",
                      str(m.ffn_hidden_size), str(m.vocab_size), m.activation, f"{total_params(m) / 1e9:.2f}",
                      # the first clause names the source (--json has all of it), cut to one line
                      Text(m.source.split(";")[0], no_wrap=True, overflow="ellipsis"))
    return table


def hardware_json(gpus: Sequence[tuple[HardwareSpec, Mapping[str, Any]]]) -> dict[str, Any]:
    """`hardware --json`: figures in the hardware files' own units."""
    return {"hardware": [{
        "name": hw.name, "memory_GiB": _r(gib(hw.memory_bytes)), "memory_reserve_GiB": _r(gib(hw.memory_reserve_bytes)),
        "hbm_bandwidth_GBps": _r(hw.hbm_bandwidth / GB), "bf16_TFLOPs": _r(hw.peak_flops_bf16 / TERA),
        "fp16_TFLOPs": _r(hw.peak_flops_fp16 / TERA), "fp8_TFLOPs": _r(hw.peak_flops_fp8 / TERA),
        "gpus_per_node": hw.gpus_per_node, "intra_node_GBps": _r(hw.intra_node_bandwidth / GB),
        "inter_node_GBps": _r(hw.inter_node_bandwidth / GB), "description": raw.get("description", ""),
        **({"sources": raw["sources"]} if isinstance(raw.get("sources"), Mapping) else {}),  # optional in a file
    } for hw, raw in gpus]}


def hardware_table(gpus: Sequence[tuple[HardwareSpec, Mapping[str, Any]]]) -> Table:
    table = Table(title="Hardware (--gpu NAME, or a path to a hardware file)", title_justify="left")
    for col in ("name", "memory GiB", "reserve", "HBM GB/s", "bf16 TFLOP/s", "fp8 TFLOP/s", "GPUs/node",
                "intra GB/s", "inter GB/s"):
        table.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for hw, _ in gpus:
        fp8 = f"{hw.peak_flops_fp8 / TERA:g}" if hw.peak_flops_fp8 > 0 else "-"
        table.add_row(hw.name, f"{gib(hw.memory_bytes):g}", f"{gib(hw.memory_reserve_bytes):g}",
                      f"{hw.hbm_bandwidth / GB:g}", f"{hw.peak_flops_bf16 / TERA:g}", fp8, str(hw.gpus_per_node),
                      f"{hw.intra_node_bandwidth / GB:g}", f"{hw.inter_node_bandwidth / GB:g}")
    return table


# ------------------------------------------------------------------------------------------------ estimate
def estimate_json(est: Estimate, model: ModelSpec, hw: HardwareSpec, job: JobSpec) -> dict[str, Any]:
    """`estimate --json`: the fields of CLI.md, then per-stage detail and the operator split."""
    return {
        "plan": est.plan.to_dict(),
        "step_time_s": _r(est.step_time_s),
        "tokens_per_s": _r(est.tokens_per_s),
        "model_tflops_per_gpu": _r(est.model_tflops_per_gpu),
        "mfu": _r(est.mfu),
        "peak_memory_gib": _r(gib(est.peak_memory_bytes)),
        "memory_per_stage_gib": [_r(gib(s.memory.total)) for s in est.stages],
        "usable_memory_gib": _r(gib(est.usable_memory_bytes)),
        "fits": est.fits,
        "bottleneck_stage": est.bottleneck,
        "breakdown": {k: _r(v) for k, v in est.breakdown.as_dict().items()},
        "stages": [_stage_json(s) for s in est.stages],
        "operators": {c: _r(t) for c, t in est.op_seconds},
        "model_spec": asdict(model),
        "job": {"model": model.name, "gpu": hw.name, "gpus": est.plan.num_gpus, "gpus_per_node": hw.gpus_per_node,
                "global_batch": job.global_batch, "seq_len": job.seq_len, "dtype": job.dtype,
                "flash_attention": job.flash_attention, "fused_kernels": job.fused_kernels,
                "grad_reduce": job.grad_reduce, "kernels": job.trainer},
    }


def with_files(doc: dict[str, Any], written: Sequence[Path]) -> dict[str, Any]:
    """A `--json` document plus the files the command wrote."""
    return {**doc, "files": [str(path) for path in written]}


def written_report(written: Sequence[Path]) -> str:
    """The files a command wrote, one plain line each (never wrapped, so scripts can read the paths)."""
    return "\n".join(f"wrote {path}" for path in written)


def _stage_json(s: StageCost) -> dict[str, Any]:
    memory = {k: _r(gib(v)) for k, v in s.memory.terms().items()}
    memory["total"] = _r(gib(s.memory.total))
    return {"index": s.index, "layers": s.layers, "has_embedding": s.has_embedding, "has_head": s.has_head,
            "time_s": _r(s.time_s), "compute_s": _r(s.compute_s), "recompute_s": _r(s.recompute_s),
            "tp_comm_s": _r(s.tp_comm_s), "cp_comm_s": _r(s.cp_comm_s), "pp_comm_s": _r(s.pp_comm_s),
            "zero3_comm_s": _r(s.zero3_comm_s), "params": s.params, "memory_gib": memory}


def estimate_report(est: Estimate, model: ModelSpec, hw: HardwareSpec, job: JobSpec, *,
                    ops: bool = False, timeline: Timeline | None = None) -> RenderableType:
    """The human explanation of one plan: header, plan, summary, step breakdown, stages, operators."""
    parts: list[RenderableType] = [
        Text(f"{model.name} on {hw.name} x {est.plan.num_gpus} ({hw.gpus_per_node} per node), global batch "
             f"{job.global_batch} x {job.seq_len} tokens, {job.dtype}", style="bold"),
        Text("plan: " + plan_line(est.plan)),
        _summary(est),
        _breakdown_table(est),
        _stage_time_table(est),
        _stage_memory_table(est),
        *_pipeline_pictures(est, timeline),
    ]
    if ops:
        parts.append(_ops_table(est))
    spaced: list[RenderableType] = []
    for part in parts[:2]:
        spaced.append(part)
    for part in parts[2:]:  # a blank line before each block after the two header lines
        spaced += [Text(""), part]
    return Group(*spaced)


def plan_line(plan: Plan) -> str:
    """One line naming every choice of a plan."""
    rc = plan.recompute if plan.recompute_layers is None else f"{plan.recompute} ({plan.recompute_layers} layers)"
    mode = "" if plan.tp_mode == "1d" else f" ({plan.tp_mode} grid)"
    experts = f", ep {plan.ep}, etp {plan.etp}" if (plan.ep, plan.etp) != (1, 1) else ""  # MoE plans only
    return (f"tp {plan.tp}{mode}, pp {plan.pp}, dp {plan.dp}, cp {plan.cp}{experts}, mbs {plan.mbs} x {plan.num_microbatches} "
            f"micro-batches, {plan.schedule} (vpp {plan.vpp}), recompute {rc}, zero {plan.zero}, sequence "
            f"parallel {'on' if plan.sequence_parallel else 'off'}{', tp overlap' if plan.tp_overlap else ''}, "
            f"vocab {plan.vocab}, layers "
            f"{','.join(map(str, plan.layers_per_stage))}, bucket {plan.bucket_size / 1e6:g}M params")


def _summary(est: Estimate) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    peak, usable = gib(est.peak_memory_bytes), gib(est.usable_memory_bytes)
    table.add_row("step time", f"{est.step_time_s:.3f} s")
    table.add_row("tokens/s", f"{est.tokens_per_s:,.0f}")
    table.add_row("model TFLOP/s per GPU", f"{est.model_tflops_per_gpu:.1f}")
    table.add_row("MFU", f"{100 * est.mfu:.1f} %")
    table.add_row("peak memory", f"{peak:.2f} GiB of {usable:.2f} GiB usable (stage {_peak_stage(est)})")
    if est.fits:
        table.add_row("fits", Text("yes", style="green"))
    else:
        table.add_row("fits", Text(f"NO: {peak - usable:.2f} GiB over the usable memory", style="bold red"))
    return table


def _peak_stage(est: Estimate) -> int:
    return max(range(len(est.stages)), key=lambda i: (est.stages[i].memory.total, -i))


def _breakdown_table(est: Estimate) -> Table:
    table = Table(title=f"Step time, seen from the slowest stage ({est.bottleneck})", title_justify="left")
    table.add_column("term")
    table.add_column("s", justify="right")
    table.add_column("% of step", justify="right")
    terms = est.breakdown.as_dict()
    for key, seconds in terms.items():
        table.add_row(_BREAKDOWN_LABELS.get(key, key), f"{seconds:.4f}", f"{100 * seconds / est.step_time_s:.1f}")
    table.add_row(Text("total", style="bold"), f"{sum(terms.values()):.4f}", "100.0")
    return table


def _stage_time_table(est: Estimate) -> Table:
    table = Table(title="Stages: time per micro-batch (ms); * = bottleneck; E = embedding, H = LM head",
                  title_justify="left")
    cols = ["stage", "layers", "total", "compute", "recompute", "tp comm", "cp comm", "pp p2p"]
    zero3 = est.plan.zero >= 3
    for col in cols + (["zero3 comm"] if zero3 else []):
        table.add_column(col, justify="right")
    for s in est.stages:
        mark = "*" if s.index == est.bottleneck else ""
        row = [f"{s.index}{mark}", stage_label(s, est.plan)] + [
            f"{1e3 * t:.2f}" for t in (s.time_s, s.compute_s, s.recompute_s, s.tp_comm_s, s.cp_comm_s, s.pp_comm_s)]
        table.add_row(*row, *([f"{1e3 * s.zero3_comm_s:.2f}"] if zero3 else []))
    return table


def _stage_memory_table(est: Estimate) -> Table:
    usable = est.usable_memory_bytes
    table = Table(title=f"Stages: memory per GPU (GiB), {gib(usable):.2f} GiB usable", title_justify="left")
    for col in ["stage", *_MEMORY_LABELS.values(), "total"]:
        table.add_column(col, justify="right")
    table.add_column("of usable", no_wrap=True)
    for s in est.stages:
        terms = [f"{gib(v):.2f}" for v in s.memory.terms().values()]
        table.add_row(str(s.index), *terms, f"{gib(s.memory.total):.2f}", memory_bar(s.memory.total, usable))
    return table


def _pipeline_pictures(est: Estimate, timeline: Timeline | None) -> list[RenderableType]:
    """Per-stage time and memory bars side by side, and the schedule's timeline (pipelines only)."""
    if est.plan.pp == 1:
        return []
    out: list[RenderableType] = [Text("Stages side by side (# = share of the slowest stage / of usable memory)",
                                      style="italic"), Text("\n".join(stage_bars(est)))]
    if timeline is not None:
        out += [Text(f"Pipeline timeline, {est.plan.schedule}, {est.plan.num_microbatches} micro-batches: "
                     f"bubbles are the dots", style="italic"), Text("\n".join(schedule_chart(timeline, est.plan.pp)))]
    return out


def memory_bar(used: int, usable: int, width: int = 20) -> Text:
    """A text bar of used vs usable memory; red and overflowing past the end when it does not fit."""
    frac = used / usable
    filled = min(width, round(frac * width))
    bar = "#" * filled + "." * (width - filled)
    if frac > 1:
        return Text(f"{bar}> {100 * frac:.0f}%", style="red")
    return Text(f"{bar} {100 * frac:.0f}%")


def _ops_table(est: Estimate) -> Table:
    table = Table(title="Compute by operator (slowest stage, per step)", title_justify="left")
    table.add_column("operators")
    table.add_column("s", justify="right")
    table.add_column("share %", justify="right")
    total = sum(t for _, t in est.op_seconds) or 1.0
    for category, seconds in est.op_seconds:
        table.add_row(_OP_LABELS.get(category, category), f"{seconds:.4f}", f"{100 * seconds / total:.1f}")
    return table


# ------------------------------------------------------------------------------------------------ plan
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


def stage_layout(est: Estimate, *, elide: bool = False) -> str:
    """'E+20 | 20 | 20 | 20+H': layers per pipeline stage, E = embedding, H = LM head (V/p: a share of both
    under vocabulary parallelism); `elide` keeps the first
    two and the last stage of a long pipeline."""
    labels = [stage_label(s, est.plan) for s in est.stages]
    if elide and len(labels) > 4:
        labels = [*labels[:2], "...", labels[-1]]
    return " | ".join(labels)


def plan_brief(plan: Plan) -> str:
    """A runner-up's choices in a few words."""
    rc = plan.recompute if plan.recompute_layers is None else f"full x{plan.recompute_layers}"
    sched = plan.schedule if plan.vpp == 1 else f"{plan.schedule} vpp {plan.vpp}"
    mode = "" if plan.tp_mode == "1d" else f" ({plan.tp_mode})"
    return (f"tp {plan.tp}{mode} pp {plan.pp} dp {plan.dp} cp {plan.cp}, mbs {plan.mbs} x {plan.num_microbatches}, "
            f"{sched}, recompute {rc}, zero {plan.zero}{', sp' if plan.sequence_parallel else ''}"
            f"{' + overlap' if plan.tp_overlap else ''}")


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
        return (f"{flag} reached before the search finished: the optimum may be up to {100 * result.gap:.1f}% "
                f"faster; raise {flag} to prove it" + (" (the plan found may differ on another machine)"
                                                       if result.limit == "time" else ""))
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
    doc["solver"] = {"status": result.status, "wall_s": _r(s.wall_s), "candidates": s.candidates,
                     "pruned_bound": s.pruned_bound, "pruned_memory": s.pruned_memory, "solved": s.solved,
                     "gap": _r(result.gap), "work": _r(s.work), "limit": result.limit or None}
    doc["runners_up"] = [{"plan": r.estimate.plan.to_dict(), "step_time_s": _r(r.estimate.step_time_s),
                          "mfu": _r(r.estimate.mfu), "peak_memory_gib": _r(gib(r.estimate.peak_memory_bytes)),
                          "fits": r.estimate.fits, "reason": r.reason} for r in result.runners_up]
    if compare is not None:
        est = compare.estimate
        doc["compare"] = {
            "source": compare.source, "plan": est.plan.to_dict(), "step_time_s": _r(est.step_time_s),
            "tokens_per_s": _r(est.tokens_per_s), "model_tflops_per_gpu": _r(est.model_tflops_per_gpu),
            "mfu": _r(est.mfu), "peak_memory_gib": _r(gib(est.peak_memory_bytes)),
            "memory_per_stage_gib": [_r(gib(st.memory.total)) for st in est.stages], "fits": est.fits,
            "problem": compare.problem, "planner_faster_by_pct": _r(_faster_by(result.best, est)),
        }
    return doc


def plan_report(result: PlanResult, model: ModelSpec, hw: HardwareSpec, job: JobSpec,
                compare: Comparison | None = None, timeline: Timeline | None = None) -> RenderableType:
    """The human report of a search: the best plan explained as `estimate` does, runners-up, comparison."""
    best = result.best
    title = "best plan" if result.status == "OPTIMAL" else "best plan found (not proven optimal)"
    parts: list[RenderableType] = [
        Text(f"{model.name} on {hw.name} x {best.plan.num_gpus} ({hw.gpus_per_node} per node), global batch "
             f"{job.global_batch} x {job.seq_len} tokens, {job.dtype}", style="bold"),
        Text(f"{title}: {plan_line(best.plan)}"),
        Text(f"layers per stage: {stage_layout(best)}  (E = embedding, H = LM head, V/p = 1/p of both)"),
    ]
    note = limit_note(result)
    if note:
        parts.append(Text(note, style="yellow"))
    blocks: list[RenderableType] = [_summary(best), _breakdown_table(best), _stage_time_table(best),
                                    _stage_memory_table(best), *_pipeline_pictures(best, timeline)]
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


# ------------------------------------------------------------------------------------------------ scale
#: `scale --csv` columns, in this order (a stable interface: add at the end only).
SCALING_CSV_COLUMNS = (
    "gpus", "status", "family", "strategy_change", "tp", "pp", "dp", "cp", "mbs", "num_microbatches", "vpp",
    "schedule", "recompute", "zero", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
    "model_tflops_per_gpu", "peak_memory_gib", "scaling_efficiency", "past_diminishing_returns", "train_days",
    "gpu_hours", "cost_per_million_tokens", "reason")
_MARK_CHANGE, _MARK_KNEE = "★", "⚠"


def plan_tag(plan: Plan) -> str:
    """'tp8 pp4 dp32 v5 z1 sel': a plan's degrees (cp and mbs when > 1), interleaving, ZeRO stage and
    recomputation, short enough for a table cell."""
    parts = [f"tp{plan.tp}" + ("" if plan.tp_mode == "1d" else f"({plan.tp_mode})"), f"pp{plan.pp}"] + ([f"cp{plan.cp}"] if plan.cp > 1 else []) + [f"dp{plan.dp}"]
    parts += ([f"mbs{plan.mbs}"] if plan.mbs > 1 else []) + ([f"v{plan.vpp}"] if plan.vpp > 1 else [])
    parts += [f"z{plan.zero}"] + ({"none": [], "selective": ["sel"], "full": ["full"]}[plan.recompute])
    return " ".join(parts)


def _opt(x: float | None) -> float | None:
    return None if x is None else _r(x)


def scaling_point_json(p: ScalingPoint) -> dict[str, Any]:
    """One size of `scale --json` (also the source of the CSV row)."""
    est = p.best
    return {
        "gpus": p.gpus, "status": p.status, "reason": p.reason or None,
        "family": p.family or None, "strategy_change": p.strategy_change,
        "plan": None if est is None else est.plan.to_dict(),
        "step_time_s": None if est is None else _r(est.step_time_s),
        "tokens_per_s": None if est is None else _r(est.tokens_per_s),
        "tokens_per_s_per_gpu": _opt(p.tokens_per_s_per_gpu),
        "mfu": None if est is None else _r(est.mfu),
        "model_tflops_per_gpu": None if est is None else _r(est.model_tflops_per_gpu),
        "peak_memory_gib": None if est is None else _r(gib(est.peak_memory_bytes)),
        "scaling_efficiency": _opt(p.efficiency), "past_diminishing_returns": p.past_knee,
        "train_days": _opt(p.train_days), "gpu_hours": _opt(p.gpu_hours),
        "cost_per_million_tokens": _opt(p.cost_per_million_tokens), "wall_s": _r(p.wall_s),
    }


def scaling_json(result: ScalingResult, model: ModelSpec, hw: HardwareSpec, job: JobSpec) -> dict[str, Any]:
    """`scale --json`: the sweep's inputs, one object per size, the diminishing-returns point."""
    return {
        "model": model.name, "gpu": hw.name, "gpus_per_node": hw.gpus_per_node, "global_batch": job.global_batch,
        "seq_len": job.seq_len, "tokens_per_step": job.tokens_per_step, "dtype": job.dtype,
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
            value = plan.get(col) if col in ("tp", "pp", "dp", "cp", "mbs", "num_microbatches", "vpp", "schedule",
                                             "recompute", "zero") else doc[col]
            row.append("" if value is None else str(value).lower() if isinstance(value, bool) else value)
        writer.writerow(row)
    return out.getvalue()


def _cell(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def scaling_table(result: ScalingResult) -> Table:
    price = result.price_per_gpu_hour
    table = Table(title=f"Best plan at each size (plan: v = interleaved chunks, z = ZeRO stage, sel = selective "
                        f"recompute); days and GPU-hours to train {result.train_tokens:.3g} tokens",
                  title_justify="left", box=None, padding=(0, 1), pad_edge=False,
                  header_style="bold underline")
    cols = ["", "GPUs", "strategy", "plan", "step s", "tokens/s", "MFU %", "tok/s/GPU", "scaling", "days",
            "GPU-hours"] + (["$/M tok"] if price is not None else [])
    for col in cols:
        table.add_column(col, justify="left" if col in ("", "strategy", "plan") else "right",
                         no_wrap=col != "strategy")
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
             f"{job.seq_len} tokens, {job.dtype}", style="bold"),
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


# ------------------------------------------------------------------------------- which trainers run the plan
def trainers_json(fits: Sequence[TrainerBest]) -> list[dict[str, Any]]:
    """`plan --json` without --trainer: per trainer, whether it runs the winner, why not, and its own best."""
    out = []
    for f in fits:
        entry: dict[str, Any] = {"trainer": f.trainer, "runs_best": not f.unsupported,
                                 "unsupported": list(f.unsupported), "status": f.status}
        if f.best is not None:
            entry["best"] = {"plan": f.best.plan.to_dict(), "step_time_s": _r(f.best.step_time_s),
                             "mfu": _r(f.best.mfu), "peak_memory_gib": _r(gib(f.best.peak_memory_bytes))}
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


# ------------------------------------------------------------------------------------------------ --brief
def brief_line(est: Estimate, *, prefix: str = "") -> str:
    """`--brief`: a plan and its figures as one line of key=value words, for grep/awk/cut in a shell pipeline."""
    p = est.plan
    words = [f"tp={p.tp}", f"pp={p.pp}", f"dp={p.dp}", f"cp={p.cp}", f"mbs={p.mbs}",
             f"microbatches={p.num_microbatches}", f"schedule={p.schedule}", f"vpp={p.vpp}",
             f"recompute={p.recompute}", f"zero={p.zero}", f"sp={'on' if p.sequence_parallel else 'off'}",
             f"tp_overlap={'on' if p.tp_overlap else 'off'}", f"tp_mode={p.tp_mode}", f"vocab={p.vocab}",
             f"layers={','.join(map(str, p.layers_per_stage))}", f"step_s={est.step_time_s:.4f}",
             f"tokens_per_s={est.tokens_per_s:.0f}", f"mfu={est.mfu:.4f}",
             f"peak_gib={gib(est.peak_memory_bytes):.2f}", f"fits={'yes' if est.fits else 'no'}"]
    if (p.ep, p.etp) != (1, 1):
        words[4:4] = [f"ep={p.ep}", f"etp={p.etp}"]
    return " ".join([prefix, *words] if prefix else words)


def scaling_brief(result: ScalingResult) -> str:
    """`scale --brief`: one line per GPU count (its status, and its best plan when there is one)."""
    return "\n".join(brief_line(p.best, prefix=f"gpus={p.gpus} status={p.status}") if p.best is not None
                     else f"gpus={p.gpus} status={p.status}" for p in result.points)
