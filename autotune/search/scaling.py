"""The scaling sweep (paper 3 of ../shared/papers.md): the best plan at each GPU count, what it costs to train
a given number of tokens, where the winning strategy changes and where adding GPUs stops paying.

At each size the planner searches the same space; a size where nothing fits, or where the global batch cannot
be split over the GPUs, is a row with its reason, not an error. Scaling efficiency between consecutive sizes is
(throughput ratio) / (GPU ratio): 1.0 is perfect linear scaling, 0.5 means the extra GPUs bought nothing.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from multiprocessing import get_context, resource_tracker

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import InfeasibleError, SolverLimitError, SpecError
from autotune.search.pins import check_space
from autotune.search.planner import DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT, PlanResult, search
from autotune.search.space import SearchSpace, enumerate_candidates
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.limits import check_train_tokens
from autotune.specs.plan import Plan
from autotune.specs.profile import Profile

#: Tokens the time, GPU-hour and cost columns are computed for: one trillion, so the numbers scale by eye
#: (Llama 3 trained on about 15T; multiply by 15).
DEFAULT_TRAIN_TOKENS = 1e12
#: "A doubling of GPUs gives less than 80% of a doubling in throughput" marks diminishing returns.
DEFAULT_EFFICIENCY_THRESHOLD = 0.8
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingPoint:
    """One GPU count of the sweep."""

    gpus: int
    status: str
    """OPTIMAL, FEASIBLE (the work or time limit struck first: the best plan found is shown), INFEASIBLE
    (nothing fits or the batch cannot be split) or TIME_LIMIT (no plan found within the limits)."""
    reason: str
    """Why there is no plan (empty when there is one)."""
    best: Estimate | None
    """The fastest plan found at this size."""
    family: str
    """Coarse strategy family of the best plan (see `strategy_family`); empty without a plan."""
    strategy_change: bool
    """The family differs from the previous size that has a plan."""
    efficiency: float | None
    """Throughput ratio / GPU ratio against the previous size with a plan (None for the first)."""
    past_knee: bool
    """At or past the first size whose efficiency fell below the threshold."""
    tokens_per_s_per_gpu: float | None
    train_days: float | None
    """Wall-clock days to train `train_tokens`."""
    gpu_hours: float | None
    """gpus x hours to train `train_tokens`."""
    cost_per_million_tokens: float | None
    """price per GPU-hour x GPU-hours per million tokens; None without a price."""
    wall_s: float
    """Search time at this size."""
    widened: bool = False
    """`space` held no plan at this size and the plan shown came from the fallback space (scale's `fallback`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingResult:
    points: tuple[ScalingPoint, ...]
    train_tokens: float
    price_per_gpu_hour: float | None
    efficiency_threshold: float
    knee_gpus: int | None
    """The last size before efficiency first fell below the threshold: past it, more GPUs give diminishing
    returns (None when every step stays above)."""


Progress = Callable[[int, int, int], None]
"""Called before each size is searched (after, when sizes run at once) with (index from 1, number of sizes,
GPUs)."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or `taskset` may narrow below the
    machine's count), else the machine's, else 1: the default number of sizes searched at once."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return os.cpu_count() or 1


def global_batch_for_tokens(tokens_per_step: int, seq_len: int) -> int:
    """Sequences per step for a tokens-per-step target; it must be a whole number of sequences."""
    if tokens_per_step <= 0:
        raise SpecError(f"--tokens-per-step must be > 0, got {tokens_per_step}")
    if tokens_per_step % seq_len:
        raise SpecError(f"--tokens-per-step {tokens_per_step} is not a multiple of --seq-len {seq_len}; use a "
                        f"multiple such as {max(1, round(tokens_per_step / seq_len)) * seq_len}")
    return tokens_per_step // seq_len


def check_sweep(gpu_counts: Sequence[int], *, train_tokens: float, price_per_gpu_hour: float | None,
                efficiency_threshold: float) -> None:
    """The sweep's own inputs: sizes positive, increasing, distinct; threshold in (0, 1]; positive amounts."""
    if not gpu_counts:
        raise SpecError("--gpus: give at least one GPU count, e.g. --gpus 64,128,256")
    if any(g <= 0 for g in gpu_counts):
        raise SpecError(f"--gpus {','.join(map(str, gpu_counts))}: every GPU count must be > 0")
    if list(gpu_counts) != sorted(set(gpu_counts)):
        raise SpecError(f"--gpus {','.join(map(str, gpu_counts))}: give distinct GPU counts in increasing order, "
                        f"e.g. {','.join(map(str, sorted(set(gpu_counts))))}")
    if not 0 < efficiency_threshold <= 1:
        raise SpecError(f"--efficiency-threshold must be in (0, 1], got {efficiency_threshold:g}")
    check_train_tokens(train_tokens)
    if price_per_gpu_hour is not None and not 0 < price_per_gpu_hour < math.inf:  # also NaN
        raise SpecError(f"--price-per-gpu-hour must be a finite amount > 0, got {price_per_gpu_hour:g}")


def strategy_family(plan: Plan) -> str:
    """The coarse strategy: pure data parallelism, fully sharded (FSDP / ZeRO-3) or not, else the model-parallel
    axes in use, expert parallelism among them (with '+ZeRO-3' when the data-parallel part is fully sharded)."""
    axes = [name for name, degree in (("tp", plan.tp), ("pp", plan.pp), ("cp", plan.cp), ("ep", plan.ep))
            if degree > 1]
    if not axes:
        return "dp FSDP (ZeRO-3)" if plan.zero == 3 else "dp (ZeRO-0/1/2)"
    return "+".join(axes) + ("+ZeRO-3" if plan.zero == 3 else "")


def scale(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpu_counts: Sequence[int], space: SearchSpace, *,
          train_tokens: float = DEFAULT_TRAIN_TOKENS, price_per_gpu_hour: float | None = None,
          efficiency_threshold: float = DEFAULT_EFFICIENCY_THRESHOLD, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
          work_limit: float = DEFAULT_WORK_LIMIT, progress: Progress | None = None,
          profile: Profile | None = None, jobs: int = 1, fallback: SearchSpace | None = None) -> ScalingResult:
    """The best plan at each GPU count and the sweep's derived columns (raises SpecError on bad input, and when
    the pins hold at no size). `work_limit` and `time_limit_s` apply to each size's search (planner.search);
    `profile`: measured costs for the cost model; `jobs`: sizes searched at once, in separate processes (each
    search is deterministic, so the result is the same for any number); `fallback`: a wider space searched at a
    size where `space` holds no plan (`--profile`'s timed shapes, then every shape: as plan does), the point
    marked `widened`."""
    check_sweep(gpu_counts, train_tokens=train_tokens, price_per_gpu_hour=price_per_gpu_hour,
                efficiency_threshold=efficiency_threshold)
    if jobs < 1:
        raise SpecError(f"--jobs must be >= 1, got {jobs}")
    found: dict[int, tuple[int, str, str, Estimate | None, float, bool]] = {}
    pin_errors, todo = [], []
    for gpus in gpu_counts:
        try:
            _check_either(space, fallback, model, job, gpus, hw.gpus_per_node)
        except SpecError as exc:
            pin_errors.append(str(exc))
            found[gpus] = (gpus, "INFEASIBLE", str(exc), None, 0.0, False)
            continue
        todo.append(gpus)
    if len(pin_errors) == len(gpu_counts):
        raise SpecError(f"no size of the sweep can be planned: {pin_errors[0]}")
    search_one = partial(_best_widening, model, hw, job, space=space, fallback=fallback, time_limit_s=time_limit_s,
                         work_limit=work_limit, profile=profile)
    if jobs == 1 or len(todo) < 2:
        for i, gpus in enumerate(todo, start=1):
            if progress:
                progress(i, len(todo), gpus)
            found[gpus] = (gpus, *search_one(gpus))
    else:
        _start_resource_tracker()
        with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=get_context("spawn"),
                                 initializer=_own_process_group) as pool:
            # the largest sizes first: their searches take longest (fewest micro-batches per pipeline), and the
            # small ones then fill the other processes instead of one large search running alone at the end
            futures = {pool.submit(search_one, gpus): gpus for gpus in sorted(todo, reverse=True)}
            for i, done in enumerate(as_completed(futures), start=1):
                found[futures[done]] = (futures[done], *done.result())
                if progress:
                    progress(i, len(todo), futures[done])
    return _derive([found[g] for g in gpu_counts], train_tokens=train_tokens, price=price_per_gpu_hour,
                   threshold=efficiency_threshold)


def _check_either(space: SearchSpace, fallback: SearchSpace | None, model: ModelSpec, job: JobSpec, gpus: int,
                  gpus_per_node: int) -> None:
    """check_space of `space`, else of `fallback`: a size is searched when either holds its pins."""
    try:
        check_space(space, model, job, gpus, gpus_per_node)
    except SpecError:
        if fallback is None:
            raise
        check_space(fallback, model, job, gpus, gpus_per_node)


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (which the pool needs) with this thread's signal mask kept:
    starting it unblocks SIGINT in the thread that does (resource_tracker.ensure_running), and the autotune
    command keeps SIGINT blocked so that its own thread answers Ctrl-C at once (autotune/interrupts.py). The
    command's Ctrl-C ends it without releasing the pool's semaphores, which the tracker then removes: without
    the warning it would print for them, the one line stays the only one."""
    warnings = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (warnings, "ignore:resource_tracker:UserWarning")))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ()) if hasattr(signal, "pthread_sigmask") else None
    try:
        resource_tracker.ensure_running()
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if warnings is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = warnings


def _own_process_group() -> None:
    """In each worker: a process group of its own, so a Ctrl-C at the terminal reaches only the command, which
    stops its workers and prints one line (autotune/interrupts.py), not one more line per worker."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()


def _best_widening(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, *, space: SearchSpace,
                   fallback: SearchSpace | None, time_limit_s: float, **limits
                   ) -> tuple[str, str, Estimate | None, float, bool]:
    """_best_at in `space`, else, where it holds no plan, in `fallback` within the time the first left; the last
    item says which answered."""
    start = time.perf_counter()
    status, reason, best, wall = _best_at(model, hw, job, gpus, space=space, time_limit_s=time_limit_s, **limits)
    if best is not None or status != "INFEASIBLE" or fallback is None:
        return status, reason, best, wall, False
    left = max(time_limit_s - (time.perf_counter() - start), 1e-3)
    status, reason, best, more = _best_at(model, hw, job, gpus, space=fallback, time_limit_s=left, **limits)
    return status, reason, best, wall + more, best is not None


def _best_at(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, *, space: SearchSpace, time_limit_s: float,
             work_limit: float, profile: Profile | None = None) -> tuple[str, str, Estimate | None, float]:
    """(status, reason, best, wall seconds) of one size's search; no plan is a status, not an exception."""
    if next(enumerate_candidates(model, job, gpus, hw.gpus_per_node, space), None) is None:
        reason = (f"no valid split: tp x pp x cp x dp must be {gpus} with dp dividing the global batch "
                  f"{job.global_batch} (and tp <= {hw.gpus_per_node}, the pins); use a larger batch")
        return "INFEASIBLE", reason, None, 0.0
    try:
        result: PlanResult = search(model, hw, job, gpus, space, top_k=0, time_limit_s=time_limit_s,
                                    work_limit=work_limit, profile=profile,
                                    cost_model=_sweep_cost_model(model, hw, job, profile))
    except InfeasibleError as exc:
        return "INFEASIBLE", str(exc), None, 0.0
    except SolverLimitError as exc:
        if isinstance(exc.result, PlanResult):
            result = exc.result
        else:
            return "TIME_LIMIT", str(exc), None, time_limit_s
    return result.status, "", result.best, result.stats.wall_s


_SWEEP_COST_MODEL: list[tuple[tuple, CostModel]] = []
"""The cost model of the sweep this process works on, with its inputs."""


def _sweep_cost_model(model: ModelSpec, hw: HardwareSpec, job: JobSpec, profile: Profile | None) -> CostModel:
    """One cost model for every size a process searches: it knows no GPU count, so the layer costs, pass
    orders and simulated schedules it keeps serve the next size too (estimates are the same either way)."""
    inputs = (model, hw, job, profile)
    if not _SWEEP_COST_MODEL or _SWEEP_COST_MODEL[0][0] != inputs:
        _SWEEP_COST_MODEL[:] = [(inputs, CostModel(model, hw, job, profile))]
    return _SWEEP_COST_MODEL[0][1]


def _derive(found: list[tuple[int, str, str, Estimate | None, float, bool]], *, train_tokens: float,
            price: float | None, threshold: float) -> ScalingResult:
    """Per-size throughput, time and cost; family changes and the diminishing-returns point across sizes."""
    points, prev, knee, past = [], None, None, False
    for gpus, status, reason, best, wall, widened in found:
        if best is None:
            points.append(ScalingPoint(gpus=gpus, status=status, reason=reason, best=None, family="",
                                       strategy_change=False, efficiency=None, past_knee=past,
                                       tokens_per_s_per_gpu=None, train_days=None, gpu_hours=None,
                                       cost_per_million_tokens=None, wall_s=wall))
            continue
        family, eff = strategy_family(best.plan), None
        if prev is not None:
            eff = (best.tokens_per_s / prev.best.tokens_per_s) / (gpus / prev.gpus)
            if eff < threshold and not past:
                past, knee = True, prev.gpus
        seconds = train_tokens / best.tokens_per_s
        gpu_hours = gpus * seconds / SECONDS_PER_HOUR
        point = ScalingPoint(
            gpus=gpus, status=status, reason=reason, best=best, family=family,
            strategy_change=prev is not None and family != prev.family, efficiency=eff, past_knee=past,
            tokens_per_s_per_gpu=best.tokens_per_s / gpus, train_days=seconds / SECONDS_PER_DAY, gpu_hours=gpu_hours,
            cost_per_million_tokens=None if price is None else price * gpu_hours / (train_tokens / 1e6), wall_s=wall,
            widened=widened)
        points.append(point)
        prev = point
    return ScalingResult(points=tuple(points), train_tokens=train_tokens, price_per_gpu_hour=price,
                         efficiency_threshold=threshold, knee_gpus=knee)
