"""Pipeline schedules as explicit per-rank operation orders, and their exact timing.

A schedule fixes, for every pipeline rank, the order in which it runs the passes of each micro-batch on
each of its model chunks: F (forward), B (backward; for zero-bubble schedules only the input gradient) and
W (the weight gradient, run apart only by zero-bubble schedules). A pass starts when its rank has finished
the previous pass in its order and the pass it depends on is done: F on virtual stage s needs F of the same
micro-batch on stage s-1; B on s needs B on s+1 (the last stage's B needs its own F); W needs its own B.
The step's pipeline time is then the longest path through that graph, which `simulate` computes exactly in
one pass over a topological order. No closed form is exact for unequal stages (schedules.py has the equal-stage
forms and the lower bounds the planner prunes with); this is the ground truth that `estimate` reports, the
planner optimizes and the timeline shows.

Orders:
- 1f1b (PipeDream-Flush, Megatron's default): rank i runs p-i-1 warm-up forwards, then alternates one
  forward and one backward, then drains the remaining backwards.
- interleaved (Narayanan et al. 2021): v chunks per rank, virtual stage c*p + i; Megatron's order: warm-up
  (p-i-1)*2 + (v-1)*p forward chunk-passes, then 1F1B over chunk-passes; forwards walk chunks in groups of p
  micro-batches.
- zb-h1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with B and W split and rank i
  deferring its W passes by i, so every rank holds at most p micro-batches (1F1B's peak) and the W passes
  fill the drain: bubble (p-1)(F+B-W) for equal stages instead of (p-1)(F+B+W).
- v-half (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024): two chunks per rank in a V, rank
  i holding virtual stages i and 2p-1-i, so the first and the last virtual stage share rank 0 and every rank
  holds a similar amount of activation memory. The order is built once per plan by a greedy list scheduler on
  the plan's F:B:W proportions in small integers (`pass_ticks`): an input gradient first, then a forward of a
  micro-batch already in the V, then a new micro-batch if the rank stays within p+2 chunk activations, then a
  weight gradient. It is kept fixed for the real stage times (so the timing above stays exact).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from itertools import islice
from operator import itemgetter
from typing import Literal

import numpy as np

from autotune.costmodel.passids import PassIds, fixed_pass_ids, pass_ids, round_robin_places
from autotune.costmodel.wavefront import Wavefronts, closed_depths, wavefront_makespan, wavefronts

Kind = Literal["F", "B", "W"]
SPLIT_BACKWARD = ("zb-h1", "v-half")
"""Schedules that run the weight gradient (W) apart from the input gradient (B)."""


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass of one micro-batch through one model chunk of a rank."""

    kind: Kind
    chunk: int
    microbatch: int


@dataclass(frozen=True, slots=True)
class Interval:
    """A pass as it ran: on which rank, from when to when (seconds from the step's start)."""

    rank: int
    op: Pass
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Timeline:
    """The simulated step: its pipeline time and every pass of every rank."""

    makespan: float
    intervals: tuple[Interval, ...]


def chunks_per_rank(schedule: str, vpp: int) -> int:
    """Model chunks one rank holds."""
    return 2 if schedule == "v-half" else vpp


def virtual_stage(schedule: str, rank: int, chunk: int, pp: int) -> int:
    """Position of (rank, chunk) in the model's layer order."""
    if schedule == "v-half":
        return rank if chunk == 0 else 2 * pp - 1 - rank
    return chunk * pp + rank


Ticks = tuple[int, int, int]
UNIT_TICKS: Ticks = (1, 1, 1)


def rank_orders(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks = UNIT_TICKS) -> tuple[tuple[Pass, ...], ...]:
    """The pass order of every rank (`ticks`: the F:B:W proportions a v-half order is built for)."""
    return _orders(schedule, pp, chunks_per_rank(schedule, vpp), m, ticks if schedule == "v-half" else UNIT_TICKS)


def pass_ticks(durations: "Durations") -> Ticks:
    """The average chunk's F:B:W in small integers (quarters of the shortest), what v-half is built for:
    its greedy order depends on the proportions, not on the scale."""
    n = sum(len(row) for row in durations)
    avg = [sum(d[k] for row in durations for d in row) / n for k in range(3)]
    unit = min(x for x in avg if x > 0) / 4 if any(x > 0 for x in avg) else 1.0
    return tuple(max(1, min(32, round(x / unit))) for x in avg)  # type: ignore[return-value]


def _ticks(schedule: str, durations: "Durations", ticks: Ticks | None) -> Ticks:
    return UNIT_TICKS if schedule != "v-half" else (pass_ticks(durations) if ticks is None else ticks)


@cache
def _orders(schedule: str, pp: int, v: int, m: int, ticks: Ticks) -> tuple[tuple[Pass, ...], ...]:
    if schedule == "v-half":
        return _v_half(pp, m, ticks)
    passes = _pass_table(v, m)
    if schedule == "interleaved":
        return tuple(_interleaved(i, pp, v, m, passes) for i in range(pp))
    if schedule == "zb-h1":
        return tuple(_zb_h1(i, pp, m, passes) for i in range(pp))
    return tuple(_one_f_one_b(i, pp, m, passes) for i in range(pp))


PassTable = dict[str, list[list[Pass]]]
"""table[kind][chunk][micro-batch]: the passes the orders of all ranks share (made once: they are immutable)."""


def _pass_table(v: int, m: int) -> PassTable:
    return {kind: [[Pass(kind, c, j) for j in range(m)] for c in range(v)] for kind in "FBW"}


def _one_f_one_b(rank: int, pp: int, m: int, passes: PassTable) -> tuple[Pass, ...]:
    f, b = passes["F"][0], passes["B"][0]
    warmup = min(pp - rank - 1, m)
    ops = f[:warmup]
    for j in range(m):
        if warmup + j < m:
            ops.append(f[warmup + j])
        ops.append(b[j])
    return tuple(ops)


def _zb_h1(rank: int, pp: int, m: int, passes: PassTable) -> tuple[Pass, ...]:
    f, b, w = passes["F"][0], passes["B"][0], passes["W"][0]
    warmup = min(pp - rank - 1, m)
    ops = f[:warmup]
    done_w = 0
    for j in range(m):
        if warmup + j < m:
            ops.append(f[warmup + j])
        ops.append(b[j])
        if j - done_w >= rank:  # keep `rank` weight gradients pending: they fill the drain's bubbles
            ops.append(w[done_w])
            done_w += 1
    ops.extend(w[done_w:])
    return tuple(ops)


def _interleaved(rank: int, pp: int, v: int, m: int, passes: PassTable) -> tuple[Pass, ...]:
    total = m * v
    warmup = min((pp - rank - 1) * 2 + (v - 1) * pp, total)

    def chunk_pass(kind: Kind, k: int) -> Pass:
        group = (k // pp) % v
        return passes[kind][group if kind == "F" else v - 1 - group][(k // (pp * v)) * pp + k % pp]

    ops = [chunk_pass("F", k) for k in range(warmup)]
    for k in range(total):
        if warmup + k < total:
            ops.append(chunk_pass("F", warmup + k))
        ops.append(chunk_pass("B", k))
    return tuple(ops)


def v_half_cap(pp: int) -> int:
    """Chunk activations a V-Half rank may hold: p+2 chunks, i.e. p/2+1 micro-batches' worth of a whole
    rank's layers, about half of 1F1B's first stage (p micro-batches), as the paper's V-Half."""
    return pp + 2


def _v_half(pp: int, m: int, ticks: tuple[int, int, int]) -> tuple[tuple[Pass, ...], ...]:
    """Greedy list schedule on integer pass times `ticks` = (F, B, W) (see the module docstring)."""
    stages = 2 * pp
    length = dict(zip("FBW", ticks))
    done: dict[tuple[str, int, int], int] = {}  # (kind, virtual stage, micro-batch) -> finish tick
    orders: list[list[Pass]] = [[] for _ in range(pp)]
    held = [0] * pp
    busy = [0] * pp
    next_f = [[0, 0] for _ in range(pp)]  # next micro-batch to forward, per chunk
    next_b = [[0, 0] for _ in range(pp)]
    next_w = [[0, 0] for _ in range(pp)]
    tick, total = 0, 3 * stages * m
    while len(done) < total:
        started = []
        for r in range(pp):
            if busy[r] > tick:
                continue
            op = _v_half_pick(r, pp, m, tick, done, held, next_f, next_b, next_w)
            if op is not None:
                started.append((r, op))
        for r, op in started:
            s = virtual_stage("v-half", r, op.chunk, pp)
            busy[r] = done[(op.kind, s, op.microbatch)] = tick + length[op.kind]
            orders[r].append(op)
            held[r] += {"F": 1, "B": 0, "W": -1}[op.kind]
        later = [t for t in busy if t > tick]  # nothing changes before the next pass ends
        if not later and len(done) < total:
            raise AssertionError("v-half schedule construction deadlocked")
        tick = min(later, default=tick + 1)
    return tuple(tuple(o) for o in orders)


def _v_half_pick(r, pp, m, tick, done, held, next_f, next_b, next_w) -> Pass | None:
    def ready(key) -> bool:
        return key in done and done[key] <= tick

    for chunk in (1, 0):  # backward: the second leg of the V first (it is earlier in the backward order)
        j = next_b[r][chunk]
        s = virtual_stage("v-half", r, chunk, pp)
        if j < m and ready(("B", s + 1, j) if s < 2 * pp - 1 else ("F", s, j)):
            next_b[r][chunk] += 1
            return Pass("B", chunk, j)
    for chunk in (1, 0):  # forward: finish micro-batches already in flight before starting new ones
        j = next_f[r][chunk]
        s = virtual_stage("v-half", r, chunk, pp)
        # A micro-batch enters this rank's first leg only if the activations of both its chunks, and of the
        # second-leg chunks already promised to micro-batches in the V, stay within the cap; so a
        # micro-batch in the V can always go on (no deadlock) and the cap is never exceeded.
        promised = next_f[r][0] - next_f[r][1]
        if j < m and (s == 0 or ready(("F", s - 1, j))) and (chunk == 1 or held[r] + promised + 2 <= v_half_cap(pp)):
            next_f[r][chunk] += 1
            return Pass("F", chunk, j)
    for chunk in (1, 0):
        j = next_w[r][chunk]
        s = virtual_stage("v-half", r, chunk, pp)
        if j < m and ready(("B", s, j)):
            next_w[r][chunk] += 1
            return Pass("W", chunk, j)
    return None


@dataclass(frozen=True, slots=True)
class _Graph:
    """A topological order of every pass, with the index of its rank predecessor and its dependency."""

    ranks: tuple[int, ...]
    ops: tuple[Pass, ...]
    prev: tuple[int, ...]
    dep: tuple[int, ...]
    chunks: int  # model chunks per rank
    slots: tuple[int, ...]  # each pass's place in makespan's flat table, (rank * chunks + chunk) * 3 + F/B/W
    prev_at: tuple[int, ...]  # prev in makespan's list of end times: entry 0 is the step's start (0.0),
    dep_at: tuple[int, ...]  # entry 1 -inf (no dependency), pass k is entry k + 2


def _ids(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks) -> PassIds:
    """The schedule's passes as integers: a fixed order's from its rules (passids.fixed_pass_ids), without
    building its Pass objects; v-half's (built by a search) and an interleaved order off Megatron's rule
    (m % pp != 0) from the orders themselves."""
    v = chunks_per_rank(schedule, vpp)
    if (schedule in ("1f1b", "zb-h1") and v == 1) or (schedule == "interleaved" and m % pp == 0):
        return fixed_pass_ids(schedule, pp, v, m)
    return pass_ids(schedule, pp, v, m, rank_orders(schedule, pp, vpp, m, ticks))


@cache
def _placed(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks) -> tuple[PassIds, np.ndarray, np.ndarray,
                                                                            np.ndarray]:
    """_graph's order without the passes (makespan needs none): the ids, the pass in rank order (q) at each
    place k, and the place of each one's rank predecessor and dependency (-1: none)."""
    ids = _ids(schedule, pp, vpp, m, ticks)
    total = len(ids.own)
    at = np.array(round_robin_places(ids, f"{schedule} order deadlocks for pp={pp}, vpp={vpp}, m={m}"))
    # every pass's place k, and from it the order's arrays, computed over the passes in rank order (q)
    place = at[ids.own]  # q -> k
    seq = np.empty(total, dtype=np.int64)
    seq[place] = np.arange(total)  # k -> q
    prev = np.concatenate(([-1], place[:-1]))
    prev[ids.starts] = -1  # a rank's first pass follows nothing
    return ids, seq, prev[seq], np.where(ids.need == ids.none, -1, at[ids.need])[seq]


@cache
def _chain(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks) -> tuple[tuple[int, ...], ...]:
    """_Graph's slots, prev_at and dep_at, all makespan's loop reads."""
    ids, seq, prev, dep = _placed(schedule, pp, vpp, m, ticks)
    return (tuple(ids.slot[seq].tolist()), tuple(np.where(prev >= 0, prev + 2, 0).tolist()),
            tuple(np.where(dep >= 0, dep + 2, 1).tolist()))


@cache
def _in_order(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks) -> tuple[Callable[[list], tuple], tuple]:
    """makespan's durations in _chain's order, in one call in C (a call a pass was a third of its loop), and its ends
    that are a rank's last (no pass follows them on their rank)."""
    slots, prev_at, _ = _chain(schedule, pp, vpp, m, ticks)
    return (itemgetter(*slots) if len(slots) > 1 else lambda flat: tuple(map(flat.__getitem__, slots)),  # 1: no tuple
            tuple(sorted(set(range(2, len(slots) + 2)) - set(prev_at))))


@cache
def _graph(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks = UNIT_TICKS) -> _Graph:
    ids, seq, prev, dep = _placed(schedule, pp, vpp, m, ticks)
    slots, prev_at, dep_at = _chain(schedule, pp, vpp, m, ticks)
    ops = [op for order in rank_orders(schedule, pp, vpp, m, ticks) for op in order]
    return _Graph(tuple(ids.rank[seq].tolist()), tuple([ops[q] for q in seq.tolist()]), tuple(prev.tolist()),
                  tuple(dep.tolist()), chunks_per_rank(schedule, vpp), slots, prev_at, dep_at)


Durations = tuple[tuple[tuple[float, float, float], ...], ...]
"""durations[rank][chunk] = (F, B, W) seconds of one micro-batch; for schedules that do not split the
backward, B is the whole backward and W is ignored."""


def simulate(schedule: str, pp: int, vpp: int, m: int, durations: Durations, ticks: Ticks | None = None
             ) -> Timeline:
    """Run the schedule's passes as early as their order and dependencies allow (`ticks`: the proportions
    the v-half order is built for; default: those of `durations`)."""
    g = _graph(schedule, pp, vpp, m, _ticks(schedule, durations, ticks))
    split = schedule in SPLIT_BACKWARD
    end = [0.0] * len(g.ops)
    intervals = []
    for k, (r, op) in enumerate(zip(g.ranks, g.ops)):
        f, b, w = durations[r][op.chunk]
        dur = f if op.kind == "F" else (w if op.kind == "W" else (b if split else b + w))
        start = max(end[g.prev[k]] if g.prev[k] >= 0 else 0.0, end[g.dep[k]] if g.dep[k] >= 0 else 0.0)
        end[k] = start + dur
        intervals.append(Interval(r, op, start, end[k]))
    return Timeline(max(end), tuple(intervals))


def makespan(schedule: str, pp: int, vpp: int, m: int, durations: Durations, ticks: Ticks | None = None) -> float:
    """simulate(...).makespan without the intervals (estimates call it thousands of times): the same additions in
    the same order, a pass a few list lookups, or with many ranks a wavefront at a time in numpy (wavefront.py)."""
    ticks, v = _ticks(schedule, durations, ticks), chunks_per_rank(schedule, vpp)
    if not set(map(len, durations)) <= {v}:  # any row of another length (in C: makespan runs thousands of times)
        raise ValueError(f"durations need {v} (F, B, W) per rank for {schedule} with vpp={vpp}")
    flat = flat_durations(schedule, durations)
    if pp >= WAVEFRONT_MIN_PP and (grid := _wavefronts(schedule, pp, vpp, m, ticks)).pays:
        return wavefront_makespan(grid, flat)
    _, prev_at, dep_at = _chain(schedule, pp, vpp, m, ticks)
    in_order, lasts = _in_order(schedule, pp, vpp, m, ticks)
    push = (end := [0.0, -math.inf]).append  # then one entry per pass, in _graph's order (_Graph.prev_at, dep_at)
    for p, d, x in zip(prev_at, dep_at, in_order(flat)):
        a, b = end[p], end[d]
        push((b if b > a else a) + x)
    # with no negative duration no end falls along a rank: the largest is a rank's last (pp of them, not every pass)
    return max(map(end.__getitem__, lasts)) if min(flat, default=0.0) >= 0 else max(islice(end, 2, None))


#: Ranks from which makespan walks wavefronts (a grid row, three numpy calls, each) rather than passes in Python,
#: where a row holds enough passes (Wavefronts.pays); fewer ranks hold fewer a row, and a grid would not pay.
WAVEFRONT_MIN_PP = 16


@cache
def _wavefronts(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks) -> Wavefronts:
    ids = _ids(schedule, pp, vpp, m, ticks)
    return wavefronts(ids, closed_depths(schedule, ids, pp, m))


def flat_durations(schedule: str, durations: Durations) -> list:
    """The table in _Graph.slots order; schedules that do not split the backward run B + W as one pass."""
    split = schedule in SPLIT_BACKWARD
    return [x for row in durations for f, b, w in row for x in (f, b if split else b + w, w)]


def peak_in_flight(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks = UNIT_TICKS) -> tuple[int, ...]:
    """Most chunk activations each rank holds at once: a chunk's activations live from its F until its
    backward is complete (B, or W when the backward is split). Counted from the order, so it holds for any
    stage times."""
    return _peaks(schedule, pp, vpp, m, ticks if schedule == "v-half" else UNIT_TICKS)  # as rank_orders


@cache
def _peaks(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks) -> tuple[int, ...]:
    # The fixed orders' counts in closed form (tests/costmodel/test_schedules.py checks them against the orders):
    # building an order to count it was most of a search's candidate_costs (issue 13). 1F1B and interleaved
    # hold the warm-up's forwards plus one; ZB-H1 defers rank i's W by i backwards, which keeps min(p, m).
    if schedule == "1f1b":
        return tuple(min(min(pp - i - 1, m) + 1, m) for i in range(pp))
    if schedule == "interleaved" and m % pp == 0:  # (Megatron's rule: another m has no order)
        return tuple(min(min((pp - i - 1) * 2 + (vpp - 1) * pp, m * vpp) + 1, m * vpp) for i in range(pp))
    if schedule == "zb-h1":
        return (min(pp, m),) * pp
    return _counted_peaks(schedule, pp, vpp, m, ticks)


def _counted_peaks(schedule: str, pp: int, vpp: int, m: int, ticks: Ticks) -> tuple[int, ...]:
    """peak_in_flight counted along the orders."""
    release = "W" if schedule in SPLIT_BACKWARD else "B"
    peaks = []
    for order in rank_orders(schedule, pp, vpp, m, ticks):
        held = peak = 0
        for op in order:
            if op.kind == "F":
                held += 1
                peak = max(peak, held)
            elif op.kind == release:
                held -= 1
        peaks.append(peak)
    return tuple(peaks)
