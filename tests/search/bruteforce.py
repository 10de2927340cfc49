"""Exhaustive search of the planner's space through the cost model alone (no solver, no bounds).

For every outer `Candidate` that `enumerate_candidates` yields, every partition of the layers, every count of
fully recomputed layers per chunk and every gradient bucket the planner may pick, the plan is built with
`tables.to_plan`, checked with `check_plan`, estimated with `CostModel.estimate` and kept if it fits. The
fastest one is the optimum the planner must match.

What "the planner's space" means, mirrored from `search/tables.py` and `search/partition.py` (from the search
package only `enumerate_candidates` and `to_plan` are used):
- partitions: each stage holds a multiple of vpp layers; with pp > 1 and vpp == 1 the first and last stage may
  hold none, every other stage holds at least vpp; pp == 1 holds every layer; a candidate with `even_only`
  (vocab pinned to 'ends') only takes even splits (`is_even_split`; stricter than `tables.chunk_range` with
  vpp > 1); `space.layers_per_stage` pins one split.
- full recomputation: every r in [full_min, full_max] (layers per chunk, 0 = none); r at or above the largest
  chunk all give the same plan ('full' on every layer), so the r are deduplicated through the plan they build.
- buckets: every size of `space.buckets` (a stage smaller than a bucket sends its whole buffer as one).
  When the candidate has no bucketed sync (dp*cp == 1 or ZeRO-3) the bucket cannot change the step time and
  only the first one is evaluated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.costmodel.stages import stage_params
from autotune.errors import InvalidPlanError
from autotune.search.space import Candidate, SearchSpace, bucket_menu, enumerate_candidates
from autotune.search.tables import to_plan
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import check_plan, is_even_split


@dataclass(frozen=True, slots=True)
class BruteForce:
    """The optimum over the space, and how much was evaluated to find it."""

    best: Estimate | None
    """The fastest fitting plan (None: nothing fits)."""
    evaluated: int
    """Plans estimated."""


def partitions(num_layers: int, pp: int, vpp: int, *, even_only: bool = False) -> Iterator[tuple[int, ...]]:
    """Every split of the layers over pp stages the planner allows (see the module docstring)."""
    if num_layers % vpp:
        return
    if pp == 1:
        yield (num_layers,)
        return
    total = num_layers // vpp
    lows, highs = [1] * pp, [total] * pp
    if vpp == 1:
        lows[0] = lows[-1] = 0
    if even_only:  # only counts within one of L/pp can be even (prunes the enumeration, is_even_split decides)
        lo, hi = num_layers // pp, -(-num_layers // pp)
        lows = [max(low, -(-lo // vpp)) for low in lows]
        highs = [hi // vpp] * pp
    for chunks in _compositions(total, lows, highs):
        layers = tuple(vpp * k for k in chunks)
        if not even_only or is_even_split(layers):
            yield layers


def _compositions(total: int, lows: list[int], highs: list[int]) -> Iterator[tuple[int, ...]]:
    """Tuples k with lows[i] <= k[i] <= highs[i] summing to total."""
    if len(lows) == 1:
        if lows[0] <= total <= highs[0]:
            yield (total,)
        return
    for k in range(lows[0], min(highs[0], total - sum(lows[1:])) + 1):
        yield from ((k, *rest) for rest in _compositions(total - k, lows[1:], highs[1:]))


def smallest_stage_params(cm: CostModel, c: Candidate) -> int:
    """Parameters of the smallest stage any partition of candidate c can have (the fewest layers each stage
    may hold, plus its vocabulary layers), from the cost model's `stage_params`."""
    layer = cm.layer(c.tp, c.cp, c.mbs, c.sp, c.tp_mode)
    vocab = cm.vocab(c.tp, c.cp, c.mbs, c.sp)
    fewest = []
    for i in range(c.pp):
        first, last = i == 0, i == c.pp - 1
        if c.pp == 1:
            n = cm.model.num_layers
        else:
            n = 0 if (first or last) and c.vpp == 1 else c.vpp
        fewest.append(stage_params(n, layer, vocab, first=first, last=last, pp=c.pp))
    return min(fewest)


def allowed_buckets(cm: CostModel, c: Candidate, buckets: tuple[int, ...]) -> tuple[int, ...]:
    """The bucket sizes the planner lets candidate c use: all of them (one when there is no bucketed sync)."""
    if c.dp * c.cp == 1 or c.zero >= 3:
        return buckets[:1]
    return buckets


def candidate_optimum(cm: CostModel, c: Candidate, space: SearchSpace, gpus: int) -> BruteForce:
    """The fastest fitting plan of one outer candidate, by exhaustive enumeration."""
    best, evaluated = None, 0
    L = cm.model.num_layers
    for layers in partitions(L, c.pp, c.vpp, even_only=c.even_only):
        if space.layers_per_stage is not None and layers != space.layers_per_stage:
            continue
        seen = set()
        for r in range(c.full_min, c.full_max + 1):
            for bucket in allowed_buckets(cm, c, bucket_menu(space, cm.job.trainer, c.dp)):
                plan = to_plan(c, layers, bucket, r)
                if plan in seen:
                    continue
                seen.add(plan)
                try:
                    check_plan(plan, cm.model, cm.job, gpus, cm.hw.gpus_per_node, allow_idle=space.allow_idle,
                               allow_cross_node_tp=space.allow_cross_node_tp)
                except InvalidPlanError:
                    continue
                est = cm.estimate(plan)
                evaluated += 1
                if est.fits and (best is None or est.step_time_s < best.step_time_s):
                    best = est
    return BruteForce(best, evaluated)


def brute_force(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, space: SearchSpace) -> BruteForce:
    """The fastest fitting plan over every candidate of the space (None when nothing fits)."""
    cm = CostModel(model, hw, job)
    best, evaluated = None, 0
    for c in enumerate_candidates(model, job, gpus, hw.gpus_per_node, space):
        res = candidate_optimum(cm, c, space, gpus)
        evaluated += res.evaluated
        if res.best is not None and (best is None or res.best.step_time_s < best.step_time_s):
            best = res.best
    return BruteForce(best, evaluated)
