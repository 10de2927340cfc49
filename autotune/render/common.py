"""What every report shares: the console, the JSON writer (rounded, finite, stable), and the one-line names of a
plan (in full, in brief, as a table cell, as key=value words) and of its stages."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.memory import whole_tensor_bucket
from autotune.render.timeline import stage_label
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan
from autotune.units import gib

#: Console width when stdout is not a terminal, so piped output and tests do not depend on $COLUMNS.
PIPE_WIDTH = 120
#: Decimal places of every float in a JSON document: output is byte-identical across runs and platforms.
DIGITS = 6


def bucket_words(params: int) -> str:
    """A gradient bucket's size: in millions of parameters from a million up, else whole (1e-06M read badly)."""
    return f"{params / 1e6:g}M params" if params >= 1_000_000 else f"{params:,} params"


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
    if isinstance(obj, float):  # -0.0 (a rounded tiny negative) is written 0.0
        return (obj or 0.0) if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {key: _finite(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(value) for value in obj]
    return obj


def rounded(x: float) -> float:
    """A float as JSON documents carry it (DIGITS places)."""
    return round(float(x), DIGITS)


def with_files(doc: dict[str, Any], written: Sequence[Path]) -> dict[str, Any]:
    """A `--json` document plus the files the command wrote."""
    return {**doc, "files": [str(path) for path in written]}


def written_report(written: Sequence[Path]) -> str:
    """The files a command wrote, one plain line each (never wrapped, so scripts can read the paths)."""
    return "\n".join(f"wrote {path}" for path in written)


def precision_words(job: JobSpec) -> str:
    """The job's dtype, with the gradient and Adam state precision where they are not the fp32 default."""
    return (job.dtype + (f", {job.grad_reduce} gradients" if job.grad_reduce != "fp32" else "")
            + (f", {job.optimizer_states} Adam states" if job.optimizer_states != "fp32" else ""))


def plan_line(plan: Plan) -> str:
    """One line naming every choice of a plan."""
    rc = plan.recompute if plan.recompute_layers is None else (
        f"{plan.recompute} ({plan.recompute_layers} layer{'s' if plan.recompute_layers != 1 else ''})")
    mode = "" if plan.tp_mode == "1d" else f" ({plan.tp_mode} grid)"
    experts = f", ep {plan.ep}, etp {plan.etp}" if (plan.ep, plan.etp) != (1, 1) else ""  # MoE plans only
    experts += " (all-to-all overlapped)" if plan.ep_overlap else ""
    return (f"tp {plan.tp}{mode}, pp {plan.pp}, dp {plan.dp}, cp {plan.cp}{experts}, mbs {plan.mbs} x "
            f"{plan.num_microbatches} micro-batches, {plan.schedule} (vpp {plan.vpp}), recompute {rc}, "
            f"zero {plan.zero}, sequence parallel {'on' if plan.sequence_parallel else 'off'}"
            f"{', tp overlap' if plan.tp_overlap else ''}, vocab {plan.vocab}, layers "
            f"{','.join(map(str, plan.layers_per_stage))}, bucket {bucket_words(plan.bucket_size)}")


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
    experts = f" ep {plan.ep} etp {plan.etp}" if (plan.ep, plan.etp) != (1, 1) else ""  # MoE plans only
    experts += " (a2a overlap)" if plan.ep_overlap else ""
    return (f"tp {plan.tp}{mode} pp {plan.pp} dp {plan.dp} cp {plan.cp}{experts}, mbs {plan.mbs} x "
            f"{plan.num_microbatches}, "
            f"{sched}, recompute {rc}, zero {plan.zero}{', sp' if plan.sequence_parallel else ''}"
            f"{' + overlap' if plan.tp_overlap else ''}")


def plan_tag(plan: Plan) -> str:
    """'tp8 pp4 dp32 v5 z1 sel': a plan's degrees (cp and mbs when > 1; ep, etp and epo, the overlapped expert
    all-to-all, for MoE), schedule (v5 interleaved, zb ZB-H1, vhalf V-Half, nothing for 1F1B), ZeRO stage and
    recomputation, short enough for a table cell."""
    parts = [f"tp{plan.tp}" + ("" if plan.tp_mode == "1d" else f"({plan.tp_mode})"), f"pp{plan.pp}"]
    parts += ([f"cp{plan.cp}"] if plan.cp > 1 else []) + [f"dp{plan.dp}"]
    parts += [f"ep{plan.ep}"] if plan.ep > 1 else []
    parts += [f"etp{plan.etp}"] if plan.etp > 1 else []
    parts += ["epo"] if plan.ep_overlap else []
    schedule = {"zb-h1": ["zb"], "v-half": ["vhalf"]}.get(plan.schedule, [f"v{plan.vpp}"] if plan.vpp > 1 else [])
    parts += ([f"mbs{plan.mbs}"] if plan.mbs > 1 else []) + schedule
    parts += [f"z{plan.zero}"] + ({"none": [], "selective": ["sel"], "full": ["full"]}[plan.recompute])
    return " ".join(parts)


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
    if p.recompute_layers is not None:  # full recompute of only that many layers per chunk
        words.insert(words.index(f"recompute={p.recompute}") + 1, f"recompute_layers={p.recompute_layers}")
    if (p.ep, p.etp) != (1, 1):
        words[4:4] = [f"ep={p.ep}", f"etp={p.etp}"] + (["ep_overlap=on"] if p.ep_overlap else [])
    return " ".join([prefix, *words] if prefix else words)


def bucket_warnings(plan: Plan, model: ModelSpec) -> list[str]:
    """A gradient bucket below the smallest weight matrix runs as that matrix (memory.whole_tensor_bucket): said,
    with the size it is costed at, where the plan states one less than half of it, so that the bucket the user
    gave (a flag or a config's key: the callers ask only then) would mean twice the collectives it runs."""
    floor = whole_tensor_bucket(model, plan.tp)
    if 2 * plan.bucket_size >= floor:
        return []
    return [f"bucket {plan.bucket_size:,} parameters is below {model.name}'s smallest weight matrix on a GPU "
            f"({floor:,}): the trainer never splits a tensor, so it is costed as {floor:,}"]


def mfu_warnings(est: Estimate) -> list[str]:
    """MFU above 100%: the model FLOPs count causal attention in full (Megatron-LM's convention, CLI.md), about
    twice the work the kernels do, so at long sequences the figure passes the peak; the step time is unaffected."""
    if est.mfu <= 1.0:
        return []
    return [f"MFU {100 * est.mfu:.1f}% is above 100%: model FLOPs count causal attention in full (Megatron-LM's "
            "convention), about twice what the kernels compute, and attention dominates at this sequence length; "
            "the step time is not affected"]
