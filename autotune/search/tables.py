"""Per-candidate cost coefficients: everything the bounds, the memory check and the CP-SAT model need about
one outer candidate, taken from the cost model so that the solver and the estimate use the same numbers.

Two levels, because most candidates never reach the solver: `quick_bound` is O(1) per candidate (cached
layer costs); `candidate_costs` builds the per-stage terms (O(pp)) only for candidates the search visits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.costmodel import comm
from autotune.costmodel.estimate import ADAM_STEP_BYTES, CostModel
from autotune.costmodel.layer import LayerCost, VocabCost
from autotune.costmodel.schedules import activation_multiplier
from autotune.costmodel.stages import (p2p_seconds, stage_bwd_s, stage_fwd_s, stage_params,
                                       stage_vocab_activations, state_bytes, zero3_exposed, zero3_transient)
from autotune.search.space import Candidate
from autotune.specs.job import GRAD_BYTES, WEIGHT_BYTES
from autotune.specs.plan import DEFAULT_BUCKET, Plan, is_even_split


@dataclass(frozen=True, slots=True)
class StageTerms:
    """Stage i's constants: what its vocabulary layers, point-to-point and ZeRO-3 traffic add."""

    first: bool
    last: bool
    time_s: float
    """Per micro-batch time that does not scale with the layer count."""
    memory: int
    """Bytes that do not scale with the layer count (vocabulary weights/states/activations, scratch)."""
    in_flight: int
    """Model chunks whose activations the stage holds at its peak."""
    vocab_params: int
    fwd_s: float
    """Forward of the vocabulary layers on this stage (window that hides the parameter all-gather)."""
    bwd_s: float
    """Backward of the vocabulary layers on this stage (window that hides the gradient reduction)."""


@dataclass(frozen=True, slots=True)
class Sync:
    """One bucketed data-parallel collective (gradient reduction or parameter all-gather)."""

    bytes_per_param: int
    per_bucket: tuple[float, ...]
    """Seconds of one full bucket, for each candidate bucket size."""
    window: str
    """'bwd' or 'fwd': the compute it hides behind."""


@dataclass(frozen=True, slots=True)
class CandidateCosts:
    """A candidate with its per-layer and per-stage cost coefficients."""

    cand: Candidate
    layer: LayerCost
    vocab: VocabCost
    layer_time_s: float
    """Per layer per micro-batch with the base recomputation."""
    full_extra_s: float
    """What full recomputation of one layer adds over the base."""
    layer_state: int
    """Bytes of weights + gradients + optimizer states per layer."""
    act_base: int
    act_full: int
    act_none: int
    stages: tuple[StageTerms, ...]
    usable: int
    buckets: tuple[int, ...]
    """Bucket sizes (parameters) the solver may pick: none larger than the smallest stage's parameters."""
    syncs: tuple[Sync, ...]
    tied_sync_s: float
    adam_s_per_param: float

    @property
    def layer_fwd_s(self) -> float:
        return self.layer.fwd.seconds + self.layer.tp_fwd_s + self.layer.cp_fwd_s

    @property
    def layer_bwd_s(self) -> float:
        return self.layer.bwd.seconds + self.layer.tp_bwd_s + self.layer.cp_bwd_s


def to_plan(c: Candidate, layers: tuple[int, ...], bucket: int = DEFAULT_BUCKET, r: int = 0) -> Plan:
    """The Plan of candidate c completed with a partition, full-recompute layers per chunk and a bucket."""
    recompute, r_layers = c.base, None
    if c.base == "none" and r > 0:
        recompute = "full"
        r_layers = None if r >= max(layers) // c.vpp else r
    return Plan(tp=c.tp, pp=c.pp, dp=c.dp, cp=c.cp, mbs=c.mbs, num_microbatches=c.num_microbatches,
                schedule=c.schedule, vpp=c.vpp, recompute=recompute, recompute_layers=r_layers, zero=c.zero,
                sequence_parallel=c.sp, vocab="ends" if is_even_split(layers) else "balanced",
                layers_per_stage=layers, bucket_size=bucket)


def _shell_plan(c: Candidate) -> Plan:
    """A plan with the candidate's degrees, for cost-model helpers that only read those."""
    return to_plan(c, (0,) * c.pp)


def tied_sync_seconds(cm: CostModel, c: Candidate) -> float:
    model = cm.model
    if not model.tied_embeddings or c.pp == 1:
        return 0.0
    link = comm.group_link(cm.hw, c.pp, c.tp * c.cp * c.dp)
    return comm.all_reduce(model.vocab_size * model.hidden_size // c.tp * GRAD_BYTES, 2, link)


def sync_collectives(cm: CostModel, c: Candidate, buckets: tuple[int, ...]) -> tuple[Sync, ...]:
    """The bucketed collectives of the candidate, as estimate.dp_sync_exposed runs them."""
    n = c.dp * c.cp
    if n == 1 or c.zero >= 3:
        return ()
    link = comm.group_link(cm.hw, n, c.tp)
    reduce = comm.all_reduce if c.zero == 0 else comm.reduce_scatter
    out = [Sync(GRAD_BYTES, tuple(reduce(b * GRAD_BYTES, n, link) for b in buckets), "bwd")]
    if c.zero in (1, 2):
        out.append(Sync(WEIGHT_BYTES, tuple(comm.all_gather(b * WEIGHT_BYTES, n, link) for b in buckets), "fwd"))
    return tuple(out)


def fit_buckets(buckets: tuple[int, ...], smallest_stage_params: int) -> tuple[int, ...]:
    """Bucket sizes no larger than the smallest stage (so every stage fills at least one bucket, which keeps
    the solver's linear model exact); if none is, one bucket of the smallest stage's size."""
    fit = tuple(b for b in buckets if b <= smallest_stage_params)
    return fit or (max(1, smallest_stage_params),)


def quick_bound(cm: CostModel, c: Candidate, buckets: tuple[int, ...], forced_s: float = 0.0,
                t_max_floor: float = 0.0) -> float:
    """A step time no partition of candidate c can beat, in O(1).

    The work W (every layer at the cheapest recomputation allowed, the fixed vocabulary/p2p terms and the
    `forced_s` full recomputation that memory forces) spread perfectly: t_max >= W/p; t_max >= each stage's
    fixed part; and some stage holds ceil(chunks/p) chunks. Then T = (m - 1/v)*t_max + W/v (schedules.py),
    plus lower bounds on the exposed data-parallel sync (sync_bound), the tied-embedding sync and Adam.
    `t_max_floor` is a bound on t_max found elsewhere (the memory-capped water level, see stage_time_floor)."""
    L = cm.model.num_layers
    layer, vocab = cm.layer(c.tp, c.cp, c.mbs, c.sp), cm.vocab(c.tp, c.cp, c.mbs, c.sp)
    p2p = p2p_seconds(cm.hw, pp=c.pp, vpp=c.vpp, tp=c.tp, cp=c.cp, dp=c.dp, sp=c.sp,
                      tokens=c.mbs * cm.job.seq_len // c.cp, hidden=cm.model.hidden_size)
    per_layer = layer.time(c.base) + (layer.recompute_time("full") - layer.recompute_time(c.base)
                                      if c.full_min > 0 else 0.0)
    if c.pp == 1:
        fixed = [vocab.embed_time + vocab.head_time]
    else:
        fixed = [vocab.embed_time + p2p, vocab.head_time + p2p] + [p2p] * (c.pp - 2)
    vocab_params = vocab.embed_params + (vocab.head_params if c.pp > 1 else vocab.head_params_shared)
    total_params = L * layer.params + vocab_params
    buckets = fit_buckets(buckets, smallest_stage_params(c, layer, vocab, L))
    if c.zero >= 3:  # pp == 1: one stage holds everything
        fixed[0] += zero3_exposed(_shell_plan(c), cm.hw, total_params,
                                  stage_fwd_s(L, layer, vocab, first=True, last=True),
                                  stage_bwd_s(L, layer, vocab, first=True, last=True))
    work = L * per_layer + sum(fixed) + forced_s
    chunks = L // c.vpp
    t_max = max(work / c.pp, max(fixed), c.vpp * math.ceil(chunks / c.pp) * per_layer + min(fixed), t_max_floor)
    pipe = (c.num_microbatches - 1 / c.vpp) * t_max + work / c.vpp
    # (one layer's window, all vocabulary windows) for the backward and the forward
    windows = {"bwd": (stage_bwd_s(1, layer, vocab, first=False, last=False),
                       stage_bwd_s(0, layer, vocab, first=True, last=True)),
               "fwd": (stage_fwd_s(1, layer, vocab, first=False, last=False),
                       stage_fwd_s(0, layer, vocab, first=True, last=True))}
    sync = 0.0
    for s in sync_collectives(cm, c, buckets):
        sync += sync_bound(s, buckets, layer.params, L, *windows[s.window], c.pp)
    adam_shards = c.dp * c.cp if c.zero >= 1 else 1
    adam = total_params / c.pp * ADAM_STEP_BYTES / adam_shards / (cm.hw.hbm_bandwidth * cm.hw.efficiency.memory)
    return pipe + sync + tied_sync_seconds(cm, c) + adam


def sync_bound(s: Sync, buckets: tuple[int, ...], layer_params: int, num_layers: int, layer_window: float,
               vocab_window: float, pp: int) -> float:
    """Lower bound on the exposed part of a bucketed collective, over every partition.

    With B the bucket, c its time, beta = layer_params*bytes*c/B the communication of one layer and omega its
    window, stage i exposes x_i >= (beta - omega)*n_i - omega*sum_{j<i} n_j - Omega (Omega: every vocabulary
    window, dropped bytes only make x_i larger), and at least one bucket c. The partition minimizing
    max_i x_i equalizes them: S_i = (1 + rho)*S_{i-1} + z/(beta - omega) with rho = omega/(beta - omega),
    so z = L*omega / ((1 + rho)^p - 1) for p stages holding L layers. For p == 1 it is L*(beta - omega)."""
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
        best = min(best, max(c, z - vocab_window))
    return max(best, 0.0)


def candidate_costs(cm: CostModel, c: Candidate, buckets: tuple[int, ...]) -> CandidateCosts:
    """Gather the per-stage coefficients of one candidate."""
    layer, vocab = cm.layer(c.tp, c.cp, c.mbs, c.sp), cm.vocab(c.tp, c.cp, c.mbs, c.sp)
    plan = _shell_plan(c)
    shards = c.dp * c.cp
    L = cm.model.num_layers
    p2p = p2p_seconds(cm.hw, pp=c.pp, vpp=c.vpp, tp=c.tp, cp=c.cp, dp=c.dp, sp=c.sp,
                      tokens=c.mbs * cm.job.seq_len // c.cp, hidden=cm.model.hidden_size)
    stages = []
    for i in range(c.pp):
        first, last = i == 0, i == c.pp - 1
        vparams = stage_params(0, layer, vocab, first=first, last=last, pp=c.pp)
        fwd = (vocab.embed_fwd.seconds if first else 0.0) + (vocab.head_fwd.seconds if last else 0.0)
        bwd = (vocab.embed_bwd.seconds if first else 0.0) + (vocab.head_bwd.seconds if last else 0.0)
        time_s = (vocab.embed_time if first else 0.0) + (vocab.head_time if last else 0.0) + p2p
        if c.zero >= 3:  # pp == 1: the single stage holds every layer
            time_s += zero3_exposed(plan, cm.hw, L * layer.params + vparams,
                                    stage_fwd_s(L, layer, vocab, first=True, last=True),
                                    stage_bwd_s(L, layer, vocab, first=True, last=True))
        memory = (sum(state_bytes(vparams, c.zero, shards)) + stage_vocab_activations(plan, i, vocab)
                  + zero3_transient(plan, layer))
        num, _ = activation_multiplier(c.schedule, i, c.pp, c.vpp, c.num_microbatches)
        stages.append(StageTerms(first, last, time_s, memory, num, vparams, fwd, bwd))
    fitted = fit_buckets(buckets, smallest_stage_params(c, layer, vocab, L))
    adam_shards = shards if c.zero >= 1 else 1
    return CandidateCosts(
        cand=c, layer=layer, vocab=vocab, layer_time_s=layer.time(c.base),
        full_extra_s=layer.recompute_time("full") - layer.recompute_time(c.base),
        layer_state=sum(state_bytes(layer.params, c.zero, shards)), act_base=layer.act.get(c.base),
        act_full=layer.act.full, act_none=layer.act.none, stages=tuple(stages), usable=cm.hw.usable_memory_bytes,
        buckets=fitted, syncs=sync_collectives(cm, c, fitted), tied_sync_s=tied_sync_seconds(cm, c),
        adam_s_per_param=ADAM_STEP_BYTES / adam_shards / (cm.hw.hbm_bandwidth * cm.hw.efficiency.memory))


def smallest_stage_params(c: Candidate, layer: LayerCost, vocab: VocabCost, num_layers: int) -> int:
    """Fewest parameters any stage of any partition of c can hold (what every bucket must fit in)."""
    return min(stage_params(c.vpp * _min_chunks(c, i, num_layers), layer, vocab, first=i == 0, last=i == c.pp - 1,
                            pp=c.pp) for i in {0, c.pp // 2, c.pp - 1})


def _min_chunks(c: Candidate, i: int, num_layers: int) -> int:
    """Fewest chunks' worth of layers stage i may get (ends of a 1F1B pipeline may hold none)."""
    if c.pp == 1:
        return num_layers // c.vpp
    return 0 if (i in (0, c.pp - 1) and c.vpp == 1) else 1


def chunk_range(cc: CandidateCosts, i: int, num_layers: int) -> tuple[int, int]:
    """Allowed chunks' worth of layers (k, n = k*vpp) on stage i: structure, vocab placement and memory."""
    c = cc.cand
    total = num_layers // c.vpp
    lo, hi = _min_chunks(c, i, num_layers), min(total, max_chunks(cc, i, num_layers))
    if c.even_only:  # n_i in {floor(L/p), ceil(L/p)} and a multiple of vpp
        lo = max(lo, -(-(num_layers // c.pp) // c.vpp))
        hi = min(hi, -(-num_layers // c.pp) // c.vpp)
    return lo, hi


def max_chunks(cc: CandidateCosts, i: int, num_layers: int) -> int:
    """Most chunks' worth of layers stage i can hold with the most recomputation allowed (memory is linear
    in k; the scratch of full recompute is left out, so this is an upper bound)."""
    c, s = cc.cand, cc.stages[i]
    act = cc.act_full if c.full_max > 0 else cc.act_base
    per_chunk = c.vpp * cc.layer_state + s.in_flight * act
    room = cc.usable - s.memory
    if room < 0:
        return -1
    return min(num_layers // c.vpp, room // per_chunk if per_chunk else num_layers)


def memory_possible(cc: CandidateCosts, num_layers: int) -> bool:
    """A necessary condition for a fitting partition: every stage's range is non-empty and the stages
    together can hold every layer."""
    lo_hi = [chunk_range(cc, i, num_layers) for i in range(cc.cand.pp)]
    if any(lo > hi for lo, hi in lo_hi) or num_layers % cc.cand.vpp:
        return False
    total = num_layers // cc.cand.vpp
    return sum(lo for lo, _ in lo_hi) <= total <= sum(hi for _, hi in lo_hi)


def forced_recompute_s(cc: CandidateCosts, num_layers: int) -> float:
    """Least full-recomputation time (per micro-batch, summed over stages) that memory forces: place the
    layers that do not fit without it where each extra layer costs the fewest recomputed layers
    (a fractional relaxation of the memory constraints, so a valid lower bound)."""
    c = cc.cand
    if c.full_max == 0 or cc.act_base <= cc.act_full:
        return 0.0
    total = num_layers // c.vpp
    free, options = 0, []
    for i, s in enumerate(cc.stages):
        room = cc.usable - s.memory
        per_chunk = c.vpp * cc.layer_state + s.in_flight * cc.act_base
        base_cap = max(0.0, room / per_chunk)  # fractional: a relaxation must not discard leftover memory
        free += base_cap
        saving = s.in_flight * (cc.act_base - cc.act_full)
        if saving > 0:
            options.append((per_chunk / saving, max_chunks(cc, i, num_layers) - base_cap))
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
    for i, s in enumerate(cc.stages):
        room = cc.usable - s.memory
        alpha = v * cc.layer_state + s.in_flight * cc.act_base
        sigma = s.in_flight * (cc.act_base - cc.act_full) if c.full_max else 0
        pieces.append((s.time_s, max(0.0, room / alpha) if alpha else math.inf, max(0, max_chunks(cc, i, num_layers)),
                       room, alpha, sigma))
    if sum(p[2] for p in pieces) < need:
        return math.inf
    if a <= 0:
        return max(p[0] for p in pieces)

    def held(level: float) -> int:
        total = 0
        for fixed, cap_base, cap_full, room, alpha, sigma in pieces:
            if level < fixed:
                continue
            n = (level - fixed) / a
            if n > cap_base:
                n = cap_base if sigma <= 0 else min(cap_full, (level - fixed + d * room / sigma) / (a + d * alpha / sigma))
            total += min(cap_full, math.floor(n + 1e-9))
        return total

    lo, hi = max(p[0] for p in pieces) - a, max(p[0] for p in pieces) + (a + d) * need
    lo = max(lo, 0.0)
    for _ in range(64):  # bisection on the level; 64 halvings reach float precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if held(mid) < need else (lo, mid)
    return lo


def window_s(cc: CandidateCosts, i: int, k: int, window: str) -> float:
    """Forward or backward of stage i holding k chunks' worth of layers (recomputation excluded)."""
    s = cc.stages[i]
    if window == "bwd":
        return cc.cand.vpp * k * cc.layer_bwd_s + s.bwd_s
    return cc.cand.vpp * k * cc.layer_fwd_s + s.fwd_s
