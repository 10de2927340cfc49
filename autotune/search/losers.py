"""What the planner says about the plans that could not win: candidates that would be fast but do not fit
(which terms overflow on which stage), and why nothing fits or the space is empty (what to change)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.search.coarse import coarse_memory
from autotune.search.space import Candidate, SearchSpace
from autotune.search.tables import to_plan
from autotune.search.validate import memory_summary
from autotune.specs.hardware import HardwareSpec
from autotune.specs.plan import even_split
from autotune.units import gib


@dataclass(frozen=True, slots=True)
class RunnerUp:
    """A plan that lost, and why."""

    estimate: Estimate
    reason: str


def min_memory_plan(cm: CostModel, c: Candidate, pinned: tuple[int, ...] | None = None):
    """The even split (or the pinned one) with the most recomputation the candidate allows: about its
    smallest-memory plan."""
    L = cm.model.num_layers
    if pinned is not None:  # (a split whose stages the candidate's chunks cannot divide is no plan of it)
        if len(pinned) != c.pp or any(n % c.vpp for n in pinned):
            return None
        return to_plan(c, pinned, r=max(pinned) // c.vpp if c.full_max else 0)
    layers = even_split(L, c.pp)
    if any(n % c.vpp for n in layers):
        if L % c.vpp:
            return None
        layers = tuple(c.vpp * k for k in even_split(L // c.vpp, c.pp))  # whole chunks, as even as they go
    return to_plan(c, layers, r=max(layers) // c.vpp if c.full_max else 0)


def memory_losers(cm: CostModel, too_big: list[tuple[float, Candidate]], best: Estimate, top_k: int,
                   pinned: tuple[int, ...] | None) -> tuple[RunnerUp, ...]:
    """Candidates whose bound beat the winner but that cannot fit: which terms overflow on which stage."""
    out = []
    for lb, c in sorted(too_big, key=lambda e: e[0]):
        if lb >= best.step_time_s or len(out) >= top_k:
            break
        plan = min_memory_plan(cm, c, pinned)
        if plan is None:
            continue
        est = cm.estimate(plan)
        worst = max(est.stages, key=lambda s: s.memory.total)
        out.append(RunnerUp(est, f"out of memory: stage {worst.index} needs "
                                 f"{memory_summary(worst.memory.terms())} > {gib(est.usable_memory_bytes):.1f} GiB"))
    return tuple(out)


def infeasible_message(cm: CostModel, cands: list[Candidate], space: SearchSpace) -> str:
    """What is short and by how much, for the candidate that comes closest to fitting. Memory alone picks it, in
    the order of a floor no plan of a candidate goes below (coarse_memory), until the floor passes the smallest
    found: timing every candidate's schedule took llama4-maverick on 64 GPUs 77 s, past any --time-limit
    (user-tester). The one picked is then estimated in full."""
    smallest = None  # (peak bytes, index in cands, plan): the earliest of the smallest, as a scan in order finds
    floors = coarse_memory(cm, cands, {})
    for floor, i in sorted(zip(floors, range(len(cands)))):  # a candidate's plans need at least its floor
        if smallest is not None and floor > smallest[0]:
            break
        plan = min_memory_plan(cm, cands[i], space.layers_per_stage)
        if plan is None:
            continue
        peak = max(s.memory.total for s in cm.stages(plan))
        if smallest is None or (peak, i) < smallest[:2]:
            smallest = (peak, i, plan)
    best = None if smallest is None else cm.estimate(smallest[2])
    if best is None:
        return "no plan in the search space fits: relax the pins (--tp/--pp/--mbs/--layers-per-stage)"
    worst = max(best.stages, key=lambda s: s.memory.total)
    fixes = ["add GPUs"]
    if space.recompute is not None and "full" not in space.recompute:
        fixes.append("allow --recompute full")
    if space.zero is not None and 3 not in space.zero:
        fixes.append("allow ZeRO-3 (--zero 3)")
    m, over = worst.memory, worst.memory.total - best.usable_memory_bytes
    job = cm.job
    if job.optimizer_states == "fp32" and job.dtype == "bf16" and job.trainer == "megatron" and m.optimizer / 2 >= over:
        fixes.append("--optimizer-states bf16 (bf16 Adam moments and master remainders: half the optimizer state)")
    if m.activations + m.vocab_activations >= over:  # only then can it help
        fixes.append("a shorter --seq-len")
    fixes[-1] = f"or {fixes[-1]}" if len(fixes) > 1 else fixes[-1]
    return (f"no plan fits: the smallest needs {memory_summary(m.terms())} on stage {worst.index}; "
            f"{gib(best.usable_memory_bytes):.1f} GiB usable per GPU: {', '.join(fixes)}")


def empty_space_message(gpus: int, space: SearchSpace, hw: HardwareSpec) -> str:
    pins = {k: getattr(space, k) for k in ("tp", "pp", "dp", "cp", "mbs", "vpp", "schedule", "zero")
            if getattr(space, k) is not None}
    hint = f" with pins {pins}" if pins else ""
    if space.trainer is not None:
        hint += f" that {space.trainer.name} runs"
    return (f"no valid plan for {gpus} GPUs{hint}: the degrees must multiply to the GPU count and divide the "
            f"heads and the batch; check --gpus, --global-batch and the pins (tp <= {hw.gpus_per_node} per node)")
