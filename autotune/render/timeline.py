"""Plain-text pictures of a plan's pipeline: per-stage time and memory bars side by side, and the schedule
as a stages x time chart, so the imbalance and the bubbles are visible (paper 4: the vocabulary layers make
the end stages heavier). Pure functions returning lines; render/estimate.py puts them on the terminal."""

from __future__ import annotations

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.pipeline import Timeline
from autotune.costmodel.stages import StageCost
from autotune.specs.plan import Plan
from autotune.units import gib

#: The chart's symbols: a forward pass, a backward (input-gradient) pass, a weight-gradient pass, idle.
SYMBOLS = {"F": "F", "B": "B", "W": "w"}
IDLE = "."


def bar(value: float, full: float, width: int) -> str:
    """A bar of `width` cells filled to value/full ('>' marks overflow past full)."""
    if full <= 0:
        return " " * width
    cells = round(min(value / full, 1.0) * width)
    return "#" * cells + "-" * (width - cells) + (">" if value > full else " ")


def stage_label(s: StageCost, plan: Plan) -> str:
    """'E+4' / '4' / '4+H' (E = embedding, H = LM head on this stage); '4+V/8' under vocabulary parallelism
    (a 1/8 share of both)."""
    if plan.vocab == "parallel" and plan.pp > 1:
        return f"{s.layers}+V/{plan.pp}"
    return ("E+" if s.has_embedding else "") + str(s.layers) + ("+H" if s.has_head else "")


def stage_bars(est: Estimate, width: int = 24) -> list[str]:
    """One line per stage: busy time per micro-batch against the slowest stage, memory against the usable."""
    slowest = max(s.time_s for s in est.stages)
    usable = est.usable_memory_bytes
    lines = [f"{'stage':>5} {'layers':>8}  {'time per micro-batch':<{width + 12}}  memory per GPU"]
    for s in est.stages:
        label = stage_label(s, est.plan)
        lines.append(f"{s.index:>5} {label:>8}  {bar(s.time_s, slowest, width)}{1e3 * s.time_s:8.1f} ms  "
                     f"{bar(s.memory.total, usable, width)}{gib(s.memory.total):6.1f} GiB")
    return lines


def schedule_chart(timeline: Timeline, pp: int, width: int = 96) -> list[str]:
    """Ranks x time: each cell shows the pass kind that fills most of it (F forward, B backward, w weight
    gradient), or '.' when the rank is idle for most of it; the last lines give the scale and legend."""
    span = timeline.makespan
    if span <= 0:
        return []
    cell_s = span / width
    fill = [[dict.fromkeys("FBW", 0.0) for _ in range(width)] for _ in range(pp)]
    busy = [0.0] * pp
    for iv in timeline.intervals:
        busy[iv.rank] += iv.end - iv.start
        for cell in range(int(iv.start / cell_s), min(width, int(iv.end / cell_s) + 1)):
            lo, hi = cell * cell_s, (cell + 1) * cell_s
            fill[iv.rank][cell][iv.op.kind] += max(0.0, min(hi, iv.end) - max(lo, iv.start))
    lines = []
    for r in range(pp):
        row = []
        for cell in fill[r]:
            kind, amount = max(cell.items(), key=lambda kv: kv[1])
            row.append(IDLE if sum(cell.values()) < cell_s / 2 else SYMBOLS[kind])
        lines.append(f"rank {r:>2} |{''.join(row)}| idle {100 * (1 - busy[r] / span):4.1f}%")
    lines.append(f"{'':8}0 ms{'':{width - 8}}{1e3 * span:.0f} ms")
    lines.append(f"{'':8}F forward, B backward, w weight gradient, . idle")
    return lines
