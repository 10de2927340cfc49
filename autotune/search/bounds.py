"""Lower bounds on a candidate's step time and a necessary memory check: what lets the planner prune.

Every bound here must never exceed the best step time any partition of the candidate reaches under the cost
model (tests/search/test_space.py checks this against exhaustive enumeration): a bound that is too high
prunes the optimum and breaks the proof.
"""

from __future__ import annotations

import heapq
import math

from autotune.costmodel.epoverlap import pairing
from autotune.costmodel.estimate import ADAM_STEP_BYTES, CostModel
from autotune.costmodel.memory import whole_tensor_bucket
from autotune.costmodel.schedules import pipeline_lower_bound
from autotune.costmodel.stages import (stage_bwd_s, stage_fwd_s, stage_params, vocab_parallel_comm,
                                       vocab_placement, zero3_exposed)
from autotune.search.space import Candidate
from autotune.search.tables import (CandidateCosts, Sync, candidate_p2p, chunk_ranges, shell_plan,
                                    smallest_stage_params, stage_caps, sync_collectives, tied_sync_seconds)
from autotune.specs.overlap import reduces_inline


def quick_bound(cm: CostModel, c: Candidate, buckets: tuple[int, ...], forced_s: float = 0.0,
                t_max_floor: float = 0.0, memo: dict | None = None, pipe_floor: float = 0.0) -> float:
    """A step time no partition of candidate c can beat, in O(1).

    The work W (every layer at the cheapest recomputation allowed, the fixed vocabulary/p2p terms and the
    `forced_s` full recomputation that memory forces) spread perfectly: t_max >= W/p; t_max >= each stage's
    fixed part; and some stage holds ceil(chunks/p) chunks. The pipeline time is at least m*t_max and, for
    1F1B-like schedules, the last-rank path (schedules.pipeline_lower_bound),
    plus lower bounds on the exposed data-parallel sync (sync_bound), the tied-embedding sync and Adam.
    `t_max_floor` is a bound on t_max found elsewhere (the memory-capped water level, see stage_time_floor),
    `pipe_floor` one on the pipeline time (pivot_path_floor).
    `memo` (one dict per search) keeps the sync bound, shared by every candidate with the same layer, data
    and pipeline degrees, schedule and vocabulary placement (which decide the smallest stage), and each
    candidate's own terms (_quick_terms) for its refined bound, and the fixed terms of its shape."""
    L = cm.model.num_layers
    terms = None if memo is None else memo.get(("terms", c))
    if terms is None:
        terms = _quick_terms(cm, c, buckets, memo)
        if memo is not None:  # the refined bound of a candidate takes the same terms again (issue 13)
            memo["terms", c] = terms
    per_layer, base_work, fixed_max, fixed_min, t_last, share, sync, tied, adam = terms
    work = base_work + forced_s
    chunks = L // c.vpp
    t_max = max(work / c.pp, fixed_max, c.vpp * math.ceil(chunks / c.pp) * per_layer + fixed_min, t_max_floor)
    pipe = max(pipeline_lower_bound(c.schedule, c.num_microbatches, c.vpp, c.pp, t_max, t_last, work, share),
               pipe_floor)
    return pipe + sync + tied + adam


def _quick_terms(cm: CostModel, c: Candidate, buckets: tuple[int, ...], memo: dict | None) -> tuple:
    """What quick_bound takes from candidate c alone: (per_layer, L * per_layer + the fixed sum, fixed max and
    min, the last rank's time, the path share, the sync bound, the tied-embedding sync, Adam)."""
    L = cm.model.num_layers
    layer, vocab = (cm.layer(c.tp, c.cp, c.mbs, c.sp, c.tp_mode, c.tp_overlap, c.ep, c.etp, pairing(c)),
                    cm.vocab(c.tp, c.cp, c.mbs, c.sp, c.tp_mode, c.tp_overlap, c.ep, c.etp, c.base))
    # the fixed terms and the smallest stage, shared by the candidates that differ only in ZeRO stage and full
    # recomputation (a third of those quick_bound meets, whose terms took a quarter of its time)
    shape = ("fixed", c.tp, c.cp, c.mbs, c.sp, c.tp_mode, c.tp_overlap, c.ep, c.etp, pairing(c), c.base, c.pp,
             c.vpp, c.dp, c.schedule, c.vocab, c.num_microbatches)
    if (shared := None if memo is None else memo.get(shape)) is None:
        tokens = c.mbs * cm.job.seq_len // c.cp
        p2p = candidate_p2p(cm, c, tokens)
        shared = (*_fixed_terms(cm, c, layer, vocab, p2p, tokens), smallest_stage_params(c, layer, vocab, L))
        if memo is not None:
            memo[shape] = shared
    fixed, vocab_params, smallest = shared
    # full_min >= L/vpp: every layer of every chunk is recomputed in full (trainers that checkpoint whole layers);
    # a smaller full_min forces only min(full_min, k) layers of a chunk of k, left to forced_s
    per_layer = layer.time(c.base) + (layer.recompute_time("full") - layer.recompute_time(c.base)
                                      if c.full_min >= L // c.vpp else 0.0)
    total_params = L * layer.params + vocab_params
    if c.zero >= 2:  # pp == 1: one stage holds everything
        extra = zero3_exposed(shell_plan(c), cm.hw, total_params, stage_fwd_s(L, layer, vocab, first=True, last=True),
                              stage_bwd_s(L, layer, vocab, first=True, last=True), cm.job.grad_bytes, L + 2,
                              reduces_inline(cm.job, c.pp, c.zero))
        fixed = tuple(x + extra for x in fixed)
    fixed_sum, fixed_max, fixed_min, fixed_last = fixed
    chunks = L // c.vpp
    last_layers = c.vpp * ((chunks // c.pp) if c.even_only else (1 if c.vpp > 1 else 0))
    t_last = fixed_last + last_layers * layer.time(c.base)
    # ZB-H1's path share: the forward's part of a rank's time is at least the smallest part among its terms
    # (layers at the most recomputation, point-to-point hops: half, vocabulary layers)
    share = min(layer.fwd.seconds / layer.time("full") if layer.time("full") > 0 else 0.0, 0.5,
                vocab_path_share(vocab))
    key = (c.tp, c.cp, c.mbs, c.sp, c.tp_mode, c.tp_overlap, c.dp, c.zero, c.pp, c.vpp, c.schedule, c.vocab, c.ep,
           c.etp, pairing(c))
    if memo is None or key not in memo:
        sync = _sync_bound(cm, c, buckets, layer, vocab, smallest)
        if memo is not None:
            memo[key] = sync
    else:
        sync = memo[key]
    adam_shards = c.dp * c.cp if c.zero >= 1 else 1
    adam = total_params / c.pp * ADAM_STEP_BYTES / adam_shards / (cm.hw.hbm_bandwidth * cm.hw.efficiency.memory)
    return (per_layer, L * per_layer + fixed_sum, fixed_max, fixed_min, t_last, share, sync, tied_sync_seconds(cm, c),
            adam)


def _fixed_terms(cm: CostModel, c: Candidate, layer, vocab, p2p: float, tokens: int
                 ) -> tuple[tuple[float, float, float, float], int]:
    """(sum, max, min, last rank's) per-micro-batch time that does not scale with the layers, and the
    vocabulary parameters of all ranks, in O(1): ranks between the first and the last are all alike, so
    rank 0, rank 1 (standing for every middle rank) and the last rank are costed (stages.vocab_placement)."""
    hop = p2p if c.pp > 1 else 0.0
    mode = "parallel" if c.vocab == "parallel" else "ends"
    vp = sum(vocab_parallel_comm(cm.model, cm.hw, pp=c.pp, tp=c.tp, cp=c.cp, dp=c.dp, tokens=tokens)) \
        if mode == "parallel" and c.pp > 1 else 0.0
    ranks = sorted({0, min(1, c.pp - 1), c.pp - 1})
    times, params = {}, {}
    for i in ranks:
        place = vocab_placement(c.schedule, mode, c.pp, c.vpp, i)
        times[i] = place.embed * vocab.embed_time + place.head * vocab.head_time + hop + vp
        params[i] = stage_params(0, layer, vocab, first=place.embed, last=place.head, pp=c.pp, shared=place.shared)
    middle = max(c.pp - 2, 0)
    total_time = sum(times[i] for i in {0, c.pp - 1}) + middle * times[min(1, c.pp - 1)]
    total_params = sum(params[i] for i in {0, c.pp - 1}) + middle * params[min(1, c.pp - 1)]
    values = list(times.values())
    return (total_time, max(values), min(values), times[c.pp - 1]), total_params


def vocab_path_share(vocab) -> float:
    """The forward's share of the vocabulary layers' time (ZB-H1's path share, see pipeline_lower_bound)."""
    total = vocab.embed_time + vocab.head_time
    return (vocab.embed_fwd.seconds + vocab.head_fwd.seconds) / total if total > 0 else 1.0


def _sync_bound(cm: CostModel, c: Candidate, buckets: tuple[int, ...], layer, vocab, smallest: int) -> float:
    """Every bucketed sync of candidate c, bounded (sync_bound), at the buckets the estimate runs (at least a
    whole weight matrix, memory.whole_tensor_bucket)."""
    floor = whole_tensor_bucket(cm.model, c.tp)
    buckets = tuple(max(b, floor) for b in buckets)
    # (one layer's window, all vocabulary windows) for the backward and the forward
    windows = {"bwd": (stage_bwd_s(1, layer, vocab, first=False, last=False),
                       stage_bwd_s(0, layer, vocab, first=True, last=True)),
               "fwd": (stage_fwd_s(1, layer, vocab, first=False, last=False),
                       stage_fwd_s(0, layer, vocab, first=True, last=True))}
    return sum(sync_bound(s, buckets, layer.params, cm.model.num_layers, *windows[s.window], c.pp, smallest)
               for s in sync_collectives(cm, c, buckets))


def sync_bound(s: Sync, buckets: tuple[int, ...], layer_params: int, num_layers: int, layer_window: float,
               vocab_window: float, pp: int, smallest_params: int) -> float:
    """Lower bound on the exposed part of a bucketed collective, over every partition.

    With B the bucket, c its time, beta = layer_params*bytes*c/B the communication of one layer and omega its
    window, stage i exposes x_i >= (beta - omega)*n_i - omega*sum_{j<i} n_j - Omega (Omega: every vocabulary
    window, dropped bytes only make x_i larger), and at least one bucket c. The partition minimizing
    max_i x_i equalizes them: S_i = (1 + rho)*S_{i-1} + z/(beta - omega) with rho = omega/(beta - omega),
    so z = L*omega / ((1 + rho)^p - 1) for p stages holding L layers. For p == 1 it is L*(beta - omega).
    Stage 0 has no slack, so its last bucket shows in full: at least one bucket, or its whole buffer when the
    stage may hold less than a bucket (`smallest_params`). A sync after the backward (Sync.whole): stage 0's whole
    buffer, at least the smallest one."""
    if s.whole:
        return max(min(a + slope * smallest_params * s.bytes_per_param for a, slope in s.pieces), 0.0)
    best = math.inf
    for b, c in zip(buckets, s.per_bucket):
        beta = layer_params * s.bytes_per_param * c / (b * s.bytes_per_param)
        omega = layer_window
        z = 0.0
        if beta > omega:
            rho = omega / (beta - omega)
            try:
                z = num_layers * (beta - omega) if pp == 1 or rho == 0 else num_layers * omega / ((1 + rho) ** pp - 1)
            except OverflowError:
                z = 0.0
        last = min(a + slope * min(b, smallest_params) * s.bytes_per_param for a, slope in s.pieces)
        best = min(best, max(last, z - vocab_window))
    return max(best, 0.0)


def memory_possible(cc: CandidateCosts, num_layers: int) -> bool:
    """A necessary condition for a fitting partition: every stage's range is non-empty and the stages
    together can hold every layer."""
    lo_hi = chunk_ranges(cc, num_layers)
    if any(lo > hi for lo, hi in lo_hi) or num_layers % cc.cand.vpp:
        return False
    total = num_layers // cc.cand.vpp
    return sum(lo for lo, _ in lo_hi) <= total <= sum(hi for _, hi in lo_hi)


def forced_recompute_s(cc: CandidateCosts, num_layers: int) -> float:
    """Least full-recomputation time (per micro-batch, summed over stages) that memory forces: place the
    layers that do not fit without it where each extra layer costs the fewest recomputed layers
    (a fractional relaxation of the memory constraints, so a valid lower bound)."""
    c = cc.cand
    if c.full_max == 0 or cc.act_base <= cc.act_full or c.full_min >= num_layers // c.vpp:
        return 0.0  # (the last: every layer is recomputed already, quick_bound counts it)
    total = num_layers // c.vpp
    free, options = 0, []
    caps = stage_caps(cc, num_layers)
    for i, s in enumerate(cc.stages):
        room = cc.usable - s.memory + cc.most_credit(i)
        per_chunk = c.vpp * cc.layer_state + s.in_flight * cc.act_base
        base_cap = max(0.0, room / per_chunk)  # fractional: a relaxation must not discard leftover memory
        free += base_cap
        saving = s.in_flight * (cc.act_base - cc.act_full)
        if saving > 0:
            options.append((per_chunk / saving, caps[i] - base_cap))
    need = total - free
    extra = 0.0
    for ratio, room_chunks in sorted(options):
        if need <= 0:
            break
        take = min(need, max(room_chunks, 0))
        extra += take * ratio
        need -= take
    return extra * c.vpp * cc.full_extra_s


def stage_time_floor(cc: CandidateCosts, num_layers: int) -> float:
    """Lowest t_max any partition reaches under the memory caps: the smallest water level T at which the
    stages together hold every chunk, sum_i floor(n_i(T)) >= L/vpp.

    Stage i holds n chunks in t_i(n) = v*a*n + v*d*rc + c_i, where memory forces rc >= (n*alpha - room)/sigma
    recomputed layers per chunk (alpha: bytes a chunk adds without recompute, sigma: bytes recomputing one of
    its layers saves); n_i(T) inverts this piecewise-linear time. A relaxation of the CP-SAT model (per-stage
    fractional recompute instead of one shared count), so a valid bound; integral chunk counts make it tight."""
    c = cc.cand
    v = c.vpp
    a, d = v * cc.layer_time_s, v * max(cc.full_extra_s, 0.0)
    need = num_layers // v
    pieces = []
    caps = stage_caps(cc, num_layers)
    for i, s in enumerate(cc.stages):
        room = cc.usable - s.memory + cc.most_credit(i)
        alpha = v * cc.layer_state + s.in_flight * cc.act_base
        sigma = s.in_flight * (cc.act_base - cc.act_full) if c.full_max else 0
        pieces.append((s.time_s, max(0.0, room / alpha) if alpha else math.inf, max(0, caps[i]),
                       room, alpha, sigma))
    if sum(p[2] for p in pieces) < need:
        return math.inf
    if a <= 0:
        return max(p[0] for p in pieces)

    def level(piece: tuple, j: int) -> float:
        """The level at which the stage holds j chunks (floor(n_i(T) + 1e-9) >= j), inf if it never does."""
        fixed, cap_base, cap_full, room, alpha, sigma = piece
        if j > cap_full:
            return math.inf
        if j <= cap_base + 1e-9:
            return fixed + (j - 1e-9) * a
        return math.inf if sigma <= 0 else fixed + (j - 1e-9) * (a + d * alpha / sigma) - d * room / sigma

    # the need-th smallest of the levels at which each stage takes one more chunk (each stage's are increasing)
    heap = [(level(piece, 1), i, 1) for i, piece in enumerate(pieces)]
    heapq.heapify(heap)
    for _ in range(need):
        top, i, j = heapq.heappop(heap)
        heapq.heappush(heap, (level(pieces[i], j + 1), i, j + 1))
    return max(top * (1 - 1e-12), max(p[0] for p in pieces) - a, 0.0)
