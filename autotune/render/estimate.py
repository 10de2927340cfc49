"""`autotune estimate`: one plan explained term by term (step time, stages, memory, operators), and its --json
document, which `plan --json` extends."""

from __future__ import annotations

from dataclasses import asdict, fields, replace
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.pipeline import Timeline
from autotune.costmodel.stages import StageCost
from autotune.render.common import plan_line, precision_words, rounded
from autotune.render.timeline import schedule_chart, stage_bars, stage_label
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import OVERLAP_KEYS, JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.trainer_jobs import runs_mtp
from autotune.units import gib

_BREAKDOWN_LABELS = {
    "compute_s": "compute", "recompute_s": "recomputation", "tp_comm_s": "tensor-parallel comm",
    "cp_comm_s": "context-parallel comm", "pp_comm_s": "pipeline p2p", "bubble_s": "pipeline bubble",
    "dp_comm_exposed_s": "data-parallel comm (exposed)", "optimizer_s": "optimizer step",
}
_OP_LABELS = {"gemm": "tensor contractions (gemm)", "attention": "attention", "norm": "normalizations (norm)",
              "elementwise": "element-wise", "vocab": "vocabulary layers"}
_MEMORY_LABELS = {"weights": "weights", "gradients": "grads", "optimizer": "optimizer",
                  "activations": "activations", "vocab_activations": "vocab act", "transient": "transient"}


def estimate_json(est: Estimate, model: ModelSpec, hw: HardwareSpec, job: JobSpec) -> dict[str, Any]:
    """`estimate --json`: the fields of CLI.md, then per-stage detail and the operator split."""
    return {
        "plan": est.plan.to_dict(),
        "step_time_s": rounded(est.step_time_s),
        "tokens_per_s": rounded(est.tokens_per_s),
        "model_tflops_per_gpu": rounded(est.model_tflops_per_gpu),
        "mfu": rounded(est.mfu),
        "peak_memory_gib": rounded(gib(est.peak_memory_bytes)),
        "memory_per_stage_gib": [rounded(gib(s.memory.total)) for s in est.stages],
        "usable_memory_gib": rounded(gib(est.usable_memory_bytes)),
        "fits": est.fits,
        "bottleneck_stage": est.bottleneck,
        "breakdown": {k: rounded(v) for k, v in est.breakdown.as_dict().items()},
        "overlap": {"grads_after_backward": est.grads_after_backward, "p2p_waited_share": rounded(est.p2p_exposed)},
        "stages": [_stage_json(s) for s in est.stages],
        "operators": {c: rounded(t) for c, t in est.op_seconds},
        "model_spec": model_spec_json(model),
        "job": job_json(model, hw, job, est.plan.num_gpus),
    }


#: ModelSpec fields newer than the plan documents autotune 0.x already wrote, written only where they differ from
#: their default, so that an earlier release still reads the plan of a model without them (its reader is strict)
WRITTEN_WHEN_SET = ("rotary_fraction", "parallel_block")


def model_spec_json(model: ModelSpec) -> dict[str, Any]:
    """The model's shape as a plan document records it (emit/document.py reads it back)."""
    defaults = {f.name: f.default for f in fields(ModelSpec)}
    return {k: v for k, v in asdict(model).items() if k not in WRITTEN_WHEN_SET or v != defaults[k]}


def job_json(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int) -> dict[str, Any]:
    """The job a plan document was searched or estimated for (`plan`, `estimate` and `check` --json)."""
    return ({"model": model.name, "gpu": hw.name, "gpus": gpus, "gpus_per_node": hw.gpus_per_node,
             "global_batch": job.global_batch, "seq_len": job.seq_len, "dtype": job.dtype,
             "flash_attention": job.flash_attention, "fused_kernels": job.fused_kernels,
             "grad_reduce": job.grad_reduce, "optimizer_states": job.optimizer_states, "kernels": job.trainer}
        | ({"attention_backend": job.runs_attention} if job.trainer != "megatron" and job.flash_attention else {})
        | {key: False for key in OVERLAP_KEYS if not getattr(job, key)}  # a checked config's, where it leaves one off
        | ({"cross_entropy": job.cross_entropy} if job.runs_cross_entropy != _own_loss(job) else {})  # a checked
        # config's, where it runs another loss kernel than the trainer's own
        | ({"moe_dispatcher": job.moe_dispatcher, "moe_imbalance": job.moe_imbalance} if model.is_moe else {})
        | ({"moe_capacity_factor": job.moe_capacity_factor, "moe_pad_to_capacity": job.moe_pad_to_capacity}
           if model.is_moe and job.moe_capacity_factor else {}))


def _own_loss(job: JobSpec) -> str:
    return replace(job, cross_entropy=None).runs_cross_entropy


def _stage_json(s: StageCost) -> dict[str, Any]:
    memory = {k: rounded(gib(v)) for k, v in s.memory.terms().items()}
    memory["total"] = rounded(gib(s.memory.total))
    return {"index": s.index, "layers": s.layers, "has_embedding": s.has_embedding, "has_head": s.has_head,
            "time_s": rounded(s.time_s), "compute_s": rounded(s.compute_s), "recompute_s": rounded(s.recompute_s),
            "tp_comm_s": rounded(s.tp_comm_s), "cp_comm_s": rounded(s.cp_comm_s), "pp_comm_s": rounded(s.pp_comm_s),
            "zero3_comm_s": rounded(s.zero3_comm_s), "params": s.params, "memory_gib": memory}


def estimate_report(est: Estimate, model: ModelSpec, hw: HardwareSpec, job: JobSpec, *,
                    ops: bool = False, timeline: Timeline | None = None) -> RenderableType:
    """The human explanation of one plan: header, plan, summary, step breakdown, stages, operators."""
    parts: list[RenderableType] = [
        Text(f"{model.name} on {hw.name} x {est.plan.num_gpus} ({hw.gpus_per_node} per node), global batch "
             f"{job.global_batch} x {job.seq_len} tokens, {precision_words(job)}", style="bold"),
        Text("plan: " + plan_line(est.plan)
             + (f"  (H = LM head with the {model.name} MTP module(s))" if runs_mtp(model, job) else "")),
        *explanation(est, timeline),
    ]
    if ops:
        parts.append(_ops_table(est))
    spaced: list[RenderableType] = []
    for part in parts[:2]:
        spaced.append(part)
    for part in parts[2:]:  # a blank line before each block after the two header lines
        spaced += [Text(""), part]
    return Group(*spaced)


def explanation(est: Estimate, timeline: Timeline | None) -> list[RenderableType]:
    """The blocks that explain one plan (`estimate`, and the best plan of `plan`): summary, step breakdown,
    stage times and memory, and the pipeline pictures."""
    return [_summary(est), _breakdown_table(est), _stage_time_table(est), _stage_memory_table(est),
            *_pipeline_pictures(est, timeline)]


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
        label = _BREAKDOWN_LABELS.get(key, key)
        if key == "tp_comm_s" and est.plan.ep * est.plan.etp > 1:  # MoE: the token exchange is costed with TP's
            label = "tensor + expert-parallel comm"
        if key == "dp_comm_exposed_s" and est.grads_after_backward:
            label = "data-parallel comm (after the backward)"
        if key == "pp_comm_s" and est.p2p_exposed < 1.0:
            label = f"pipeline p2p ({est.p2p_exposed:.0%} not overlapped)"
        shown = seconds if abs(seconds) >= 5e-5 else 0.0  # a bubble of -1e-16 s (rounding) shows as 0
        table.add_row(label, f"{shown:.4f}", f"{100 * shown / est.step_time_s:.1f}")
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
