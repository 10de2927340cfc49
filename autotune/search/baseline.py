"""The plans every candidate's partition search starts from: the even split (picotron's obvious baseline) and
the balanced split (chunks of layers added one at a time to the stage that stays fastest, so the stages that
carry the vocabulary layers get fewer). Each is completed with the least full recomputation that fits and the
bucket that hides the most synchronization, and timed by the cost model (never by the solver), so the planner
holds a real plan for a candidate before CP-SAT runs: it is the solver's hint and a bound it must beat, and
no plan the planner returns is slower than the even split of its own candidate.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import InvalidPlanError
from autotune.search.partition import Hint
from autotune.search.tables import CandidateCosts, chunk_ranges, to_plan
from autotune.search.validate import validate_plan
from autotune.specs.plan import even_split


def baseline_splits(cc: CandidateCosts, num_layers: int, pinned: tuple[int, ...] | None = None
                    ) -> list[tuple[int, ...]]:
    """Chunks' worth of layers per stage (k_i, n_i = vpp*k_i) of the even and the balanced split, each within
    the stage's range (structure, vocabulary placement, memory); the pinned partition alone when there is one."""
    c = cc.cand
    v = c.vpp
    if num_layers % v:
        return []
    ranges = chunk_ranges(cc, num_layers)
    if pinned is not None:
        splits = [tuple(n // v for n in pinned)] if all(n % v == 0 for n in pinned) else []
    else:
        splits = [even_split(num_layers // v, c.pp)]
        balanced = _balanced(cc, ranges, num_layers // v)
        if balanced is not None and balanced != splits[0]:
            splits.append(balanced)
    return [k for k in splits if all(lo <= n <= hi for n, (lo, hi) in zip(k, ranges))]


def _balanced(cc: CandidateCosts, ranges: tuple[tuple[int, int], ...], total: int) -> tuple[int, ...] | None:
    """Water-filling: every stage at its fewest chunks, then each further chunk to the stage whose time per
    micro-batch (fixed terms + chunks x one chunk's layers) stays the smallest; ties to the lower rank."""
    k = [lo for lo, _ in ranges]
    left = total - sum(k)
    if left < 0 or left > sum(hi - lo for lo, hi in ranges):
        return None
    per_chunk = cc.cand.vpp * cc.layer_time_s
    heap = [((n + 1) * per_chunk + s.time_s, i) for i, (s, n) in enumerate(zip(cc.stages, k)) if n < ranges[i][1]]
    heapq.heapify(heap)
    for _ in range(left):
        _, i = heapq.heappop(heap)
        k[i] += 1
        if k[i] < ranges[i][1]:
            heapq.heappush(heap, ((k[i] + 1) * per_chunk + cc.stages[i].time_s, i))
    return tuple(k)


def least_recompute(cc: CandidateCosts, chunks: tuple[int, ...]) -> int | None:
    """The fewest layers per chunk under full recomputation (r, rc_i = min(r, k_i)) with which every stage fits
    (the memory rule of partition_terms.memory_constraints); None when none does."""
    c = cc.cand
    for r in range(c.full_min, max(min(c.full_max, max(chunks)), c.full_min) + 1):
        if all(_stage_bytes(cc, i, k, min(r, k)) <= cc.usable for i, k in enumerate(chunks)):
            return r
    return None


def _stage_bytes(cc: CandidateCosts, i: int, k: int, rc: int) -> int:
    s = cc.stages[i]
    total = k * (cc.cand.vpp * cc.layer_state + s.in_flight * cc.act_base) + s.memory - cc.credit(i, k)
    if rc:
        total += rc * s.in_flight * (cc.act_full - cc.act_base) + cc.act_none
    return total


def baseline_plans(cm: CostModel, cc: CandidateCosts, gpus: int, *, pinned: tuple[int, ...] | None = None,
                   allow_idle: bool = False, allow_cross_node_tp: bool = False) -> list[tuple[Estimate, Hint]]:
    """The even and balanced splits of candidate cc that fit, each with its estimate (validated, never from
    the solver) and as a hint for the solver, fastest first."""
    out = []
    for chunks in baseline_splits(cc, cm.model.num_layers, pinned):
        r = least_recompute(cc, chunks)
        if r is None:
            continue
        plan = to_plan(cc.cand, tuple(cc.cand.vpp * k for k in chunks), cc.bucket_labels[0], r)
        if len(cc.bucket_labels) > 1:  # the stages do not depend on the bucket: time the sync alone for each
            stages = cm.stages(plan)
            sync = [cm.dp_sync(replace(plan, bucket_size=b), stages) for b in cc.bucket_labels]
            plan = replace(plan, bucket_size=cc.bucket_labels[sync.index(min(sync))])
        try:
            est = validate_plan(plan, cm, gpus, allow_idle=allow_idle, allow_cross_node_tp=allow_cross_node_tp)
        except InvalidPlanError:
            continue
        out.append((est, Hint(chunks, r, plan.bucket_size)))
    return sorted(out, key=lambda e: e[0].step_time_s)
