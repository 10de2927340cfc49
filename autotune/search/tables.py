"""Per-candidate cost coefficients: everything the bounds, the memory check and the CP-SAT model need about
one outer candidate, taken from the cost model so that the solver and the estimate use the same numbers.

Most candidates never reach the solver: bounds.quick_bound needs only the cached layer costs, and
`candidate_costs` builds the per-stage terms (O(pp)) only for the candidates the search visits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from autotune.costmodel import comm
from autotune.costmodel.epoverlap import pairing
from autotune.costmodel.estimate import ADAM_STEP_BYTES, CostModel
from autotune.costmodel.layer import LayerCost, VocabCost
from autotune.costmodel.memory import whole_tensor_bucket
from autotune.costmodel.pipeline import UNIT_TICKS, chunks_per_rank, peak_in_flight
from autotune.costmodel.placement import rank_placements
from autotune.costmodel.schedules import exposed_p2p_share
from autotune.costmodel.stages import (chunk_durations, gpu_transient, layer_passes, p2p_seconds, schedule_ticks,
                                       stage_bwd_s, stage_fwd_s, stage_params, stage_vocab_activations,
                                       vocab_parallel_comm, vocab_parallel_in_flight, vocab_placement, zero3_exposed)
from autotune.costmodel.state import dense_first_credit, fixed_state_bytes, layer_state_bytes
from autotune.search.space import Candidate
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import WEIGHT_BYTES
from autotune.specs.plan import DEFAULT_BUCKET, Plan, default_bucket, is_even_split
from autotune.specs.overlap import gathers_params_in_step, overlaps_grad_reduce, reduces_inline


@dataclass(frozen=True, slots=True)
class StageTerms:
    """Stage i's constants: what its vocabulary layers, point-to-point and ZeRO-3 traffic add."""

    first: float
    """Share of the input embedding on this rank."""
    last: float
    """Share of the output layer on this rank."""
    chunk_fixed: tuple[tuple[float, float, float], ...]
    """(F, B, W) seconds per micro-batch on each chunk that do not scale with the layer count."""
    time_s: float
    """Per micro-batch time that does not scale with the layer count."""
    memory: int
    """Bytes that do not scale with the layer count (vocabulary weights/states/activations, scratch)."""
    in_flight: int
    """Model chunks whose activations the stage holds at its peak."""
    vocab_params: int


@dataclass(frozen=True, slots=True)
class Sync:
    """One bucketed data-parallel collective (gradient reduction or parameter all-gather)."""

    bytes_per_param: int
    per_bucket: tuple[float, ...]
    """Seconds of one full bucket, for each candidate bucket size."""
    window: str
    """'bwd' or 'fwd': the compute it hides behind."""
    pieces: tuple[tuple[float, float], ...]
    """The collective's time as min over (latency, seconds per byte): a stage smaller than a bucket sends
    its whole buffer as one bucket."""
    whole: bool = False
    """The trainer runs it once per step on each stage's whole buffer, after that stage's backward (trainers.
    overlaps_grad_reduce False): only the windows of the stages before hide it, and per_bucket is unused."""


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
    """Bucket sizes (parameters) the solver may pick, as they run: at least a whole weight matrix
    (memory.whole_tensor_bucket)."""
    syncs: tuple[Sync, ...]
    tied_sync_s: float
    adam_s_per_param: float
    layer_fbw: tuple[float, float, float]
    """One layer's (F, B, W) seconds per micro-batch with the base recomputation (B without W)."""
    ticks: tuple[int, int, int]
    """The proportions a v-half order is built for (stages.schedule_ticks)."""
    dense_credit: int = 0
    """Bytes stage 0 is charged less per dense-first layer its first chunk holds (state.dense_first_credit; more
    where it is negative)."""
    dense_first: int = 0
    """The model's dense-first layers (0 where no credit applies: none, or a grid tensor-parallel layer)."""
    bucket_labels: tuple[int, ...] = ()
    """The bucket a plan states for each of `buckets`: the size asked for (the menu's or the pin), which the
    trainer's config gets; the estimate floors it as the search does."""
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    """What the bounds derive from these terms more than once (chunk_ranges, stage_caps, pivot_path_floor)."""

    def credit(self, i: int, k: int) -> int:
        """Bytes stage i with k layers per chunk is charged less for its dense-first layers (rank 0's first
        chunk opens the model): the memory rule of the estimate (stages.build_stages)."""
        return self.dense_credit * min(k, self.dense_first) if i == 0 else 0

    def most_credit(self, i: int) -> int:
        """The largest credit(i, k) of any k (0 for a negative credit: k = 0 takes none), for relaxations (which
        may only loosen the memory rule)."""
        return max(0, self.dense_credit * self.dense_first) if i == 0 else 0

    @property
    def layer_fwd_s(self) -> float:
        return stage_fwd_s(1, self.layer, self.vocab, first=False, last=False)

    @property
    def layer_bwd_s(self) -> float:
        return stage_bwd_s(1, self.layer, self.vocab, first=False, last=False)


def to_plan(c: Candidate, layers: tuple[int, ...], bucket: int = DEFAULT_BUCKET, r: int = 0) -> Plan:
    """The Plan of candidate c completed with a partition, full-recompute layers per chunk and a bucket."""
    recompute, r_layers = c.base, None
    if c.base == "none" and r > 0:
        recompute = "full"
        r_layers = None if r >= max(layers) // c.vpp else r
    return Plan(tp=c.tp, pp=c.pp, dp=c.dp, cp=c.cp, mbs=c.mbs, num_microbatches=c.num_microbatches,
                schedule=c.schedule, vpp=c.vpp, recompute=recompute, recompute_layers=r_layers, zero=c.zero,
                sequence_parallel=c.sp,
                vocab="parallel" if c.vocab == "parallel" else ("ends" if is_even_split(layers) else "balanced"),
                layers_per_stage=layers, bucket_size=bucket, tp_mode=c.tp_mode, tp_overlap=c.tp_overlap, ep=c.ep,
                etp=c.etp, ep_overlap=c.ep_overlap)


def shell_plan(c: Candidate) -> Plan:
    """A plan with the candidate's degrees, for cost-model helpers that only read those."""
    return to_plan(c, (0,) * c.pp)


def tied_sync_seconds(cm: CostModel, c: Candidate) -> float:
    model = cm.model
    if not model.tied_embeddings or c.pp == 1 or c.schedule == "v-half":
        return 0.0
    return _tied_sync(cm.hw, model.vocab_size * model.hidden_size // c.tp * cm.job.grad_bytes, c.pp,
                      c.tp * c.cp * c.dp)


@lru_cache(maxsize=4096)
def _tied_sync(hw: HardwareSpec, nbytes: int, pp: int, stride: int) -> float:
    """tied_sync_seconds from what it reads, kept like _collectives."""
    return comm.all_reduce(nbytes, 2, comm.group_link(hw, pp, stride))


def sync_collectives(cm: CostModel, c: Candidate, buckets: tuple[int, ...]) -> tuple[Sync, ...]:
    """The bucketed collectives of the candidate, as estimate.dp_sync_exposed runs them."""
    return _collectives(cm.hw, cm.job.grad_bytes, c.dp * c.cp, c.tp, c.zero, buckets, *_whole_syncs(cm, c))


def _whole_syncs(cm: CostModel, c: Candidate) -> tuple[bool, bool]:
    """Whether the reduction and the weights' all-gather each run once on every stage's whole buffer (after the
    backward, or in the optimizer step) rather than bucket by bucket (CostModel.dp_sync)."""
    whole = not overlaps_grad_reduce(cm.job, c.pp, c.zero)
    return whole, whole or gathers_params_in_step(cm.job, c.zero)


def sync_buckets(cm: CostModel, c: Candidate, buckets: tuple[int, ...]) -> tuple[int, ...]:
    """The bucket sizes the solver picks from: one (the trainer's default where allowed) when every collective the
    bucket would split runs on whole buffers, where the size changes nothing the cost model sees."""
    whole_reduce, whole_gather = _whole_syncs(cm, c)
    if (c.zero < 2 and not whole_reduce) or (c.zero in (1, 2) and not whole_gather):
        return buckets
    return (next((b for b in (default_bucket(cm.job.trainer, c.dp), DEFAULT_BUCKET) if b in buckets), buckets[0]),)


@lru_cache(maxsize=4096)
def _collectives(hw: HardwareSpec, grad_bytes: int, n: int, tp: int, zero: int, buckets: tuple[int, ...],
                 whole: bool = False, whole_gather: bool = False) -> tuple[Sync, ...]:
    """sync_collectives from what it reads: kept, since thousands of candidates of a search share a few
    hundred (issue 13: a tenth of quick_bound's time went into recomputing them)."""
    if n == 1 or zero >= 3:
        return ()
    link = comm.group_link(hw, n, tp)
    reduce, kind = (comm.all_reduce, "all_reduce") if zero == 0 else (comm.reduce_scatter, "reduce_scatter")
    out = [] if zero == 2 else [Sync(grad_bytes, tuple(reduce(b * grad_bytes, n, link) for b in buckets), "bwd",
                                     comm.linear_pieces(kind, n, link), whole)]
    if zero in (1, 2):
        out.append(Sync(WEIGHT_BYTES, tuple(comm.all_gather(b * WEIGHT_BYTES, n, link) for b in buckets), "fwd",
                        comm.linear_pieces("all_gather", n, link), whole_gather))
    return tuple(out)


def candidate_p2p(cm: CostModel, c: Candidate, tokens: int) -> float:
    """The pipeline sends per micro-batch a candidate's passes wait on (CostModel._stages' p2p_time)."""
    exposed = exposed_p2p_share(cm.job, c.schedule, c.pp, c.vpp, c.num_microbatches)
    return p2p_seconds(cm.hw, pp=c.pp, vpp=c.vpp, tp=c.tp, cp=c.cp, dp=c.dp, sp=c.sp, tokens=tokens,
                       hidden=cm.model.hidden_size, exposed=exposed)


def candidate_costs(cm: CostModel, c: Candidate, buckets: tuple[int, ...]) -> CandidateCosts:
    """Gather the per-stage coefficients of one candidate. A bucket below a whole weight matrix runs as that
    matrix (memory.whole_tensor_bucket): costed so, labelled as asked (the first of those that run alike)."""
    floor = whole_tensor_bucket(cm.model, c.tp)
    labels: dict[int, int] = {}
    for b in sync_buckets(cm, c, buckets):
        labels.setdefault(max(b, floor), b)
    buckets = tuple(labels)
    layer, vocab = (cm.layer(c.tp, c.cp, c.mbs, c.sp, c.tp_mode, c.tp_overlap, c.ep, c.etp, pairing(c)),
                    cm.vocab(c.tp, c.cp, c.mbs, c.sp, c.tp_mode, c.tp_overlap, c.ep, c.etp, c.base))
    plan = shell_plan(c)
    shards = c.dp * c.cp
    L = cm.model.num_layers
    tokens = c.mbs * cm.job.seq_len // c.cp
    p2p = candidate_p2p(cm, c, tokens)
    vp_comm = (vocab_parallel_comm(cm.model, cm.hw, pp=c.pp, tp=c.tp, cp=c.cp, dp=c.dp, tokens=tokens)
               if c.vocab == "parallel" else (0.0, 0.0))
    # only a v-half order depends on the proportions: the others share one cached order (and peak) per shape
    ticks = schedule_ticks(plan, layer) if c.schedule == "v-half" else UNIT_TICKS
    stages = []
    alike: dict = {}  # ranks with the same vocabulary placement (all the middle ones) share their terms
    built: dict = {}  # and, holding as much in flight, the same StageTerms
    peaks, extra = peak_in_flight(c.schedule, c.pp, c.vpp, c.num_microbatches, ticks), vocab_parallel_in_flight(plan)
    for i, (place, pid) in enumerate(rank_placements(c.schedule, plan.vocab, c.pp, c.vpp)):
        if pid not in alike:
            vparams = stage_params(0, layer, vocab, first=place.embed, last=place.head, pp=c.pp,
                                   shared=place.shared)
            zero3 = 0.0
            if c.zero >= 2:  # pp == 1: the single stage holds every layer
                zero3 = zero3_exposed(plan, cm.hw, L * layer.params + vparams,
                                      stage_fwd_s(L, layer, vocab, first=True, last=True),
                                      stage_bwd_s(L, layer, vocab, first=True, last=True), cm.job.grad_bytes, L + 2,
                                      reduces_inline(cm.job, c.pp, c.zero))
            fixed = chunk_durations(plan, 0, layer, vocab, place, 0, p2p, vp_comm, zero3)
            state = fixed_state_bytes(layer, vocab, vparams, place.head, chunks_per_rank(c.schedule, c.vpp), c.zero,
                                      shards, plan.expert_dp, cm.state_bytes)
            alike[pid] = (vparams, fixed, sum(state) + gpu_transient(plan, layer))
        vparams, fixed, memory = alike[pid]
        if place.embed or place.head:  # the embedding's share depends on the rank's micro-batches in flight
            memory += stage_vocab_activations(plan, i, vocab, ticks)
        if (pid, memory, peaks[i]) not in built:  # in flight as stages.in_flight_chunks counts it
            built[pid, memory, peaks[i]] = StageTerms(place.embed, place.head, fixed, sum(map(sum, fixed)), memory,
                                                      peaks[i] + extra, vparams)
        stages.append(built[pid, memory, peaks[i]])
    adam_shards = shards if c.zero >= 1 else 1
    base = layer.recompute_time(c.base)
    dense_first = cm.dense_first(c.tp_mode)
    credit = sum(dense_first_credit(layer, c.zero, shards, plan.expert_dp, cm.state_bytes)) if dense_first else 0
    return CandidateCosts(
        cand=c, layer=layer, vocab=vocab, layer_time_s=layer.time(c.base),
        full_extra_s=layer.recompute_time("full") - base,
        layer_state=sum(layer_state_bytes(layer, c.zero, shards, plan.expert_dp, cm.state_bytes)),
        act_base=layer.act.get(c.base),
        act_full=layer.act.full, act_none=layer.act.none, stages=tuple(stages), usable=cm.hw.usable_memory_bytes,
        buckets=buckets, bucket_labels=tuple(labels.values()), syncs=sync_collectives(cm, c, buckets),
        tied_sync_s=tied_sync_seconds(cm, c),
        adam_s_per_param=ADAM_STEP_BYTES / adam_shards / (cm.hw.hbm_bandwidth * cm.hw.efficiency.memory),
        layer_fbw=layer_passes(layer, c.base), ticks=ticks, dense_credit=credit,
        dense_first=dense_first if credit else 0)


def smallest_stage_params(c: Candidate, layer: LayerCost, vocab: VocabCost, num_layers: int) -> int:
    """Fewest parameters any stage of any partition of c can hold (what every bucket must fit in)."""
    vocab_mode = "parallel" if c.vocab == "parallel" else "ends"
    out = []
    for i in {0, c.pp // 2, c.pp - 1}:
        place = vocab_placement(c.schedule, vocab_mode, c.pp, c.vpp, i)
        out.append(stage_params(c.vpp * _min_chunks(c, i, num_layers), layer, vocab, first=place.embed,
                                last=place.head, pp=c.pp, shared=place.shared))
    return min(out)


def _min_chunks(c: Candidate, i: int, num_layers: int) -> int:
    """Fewest chunks' worth of layers stage i may get (ends of a 1F1B pipeline may hold none)."""
    if c.pp == 1:
        return num_layers // c.vpp
    return 0 if (i in (0, c.pp - 1) and c.vpp == 1) else 1


def chunk_ranges(cc: CandidateCosts, num_layers: int) -> tuple[tuple[int, int], ...]:
    """chunk_range of every stage, kept on cc: the memory check, each bound and the baseline ask for them."""
    key = ("ranges", num_layers)
    if (out := cc.memo.get(key)) is None:
        c = cc.cand
        total = num_layers // c.vpp
        even = (-(-(num_layers // c.pp) // c.vpp), -(-num_layers // c.pp) // c.vpp) if c.even_only else None
        out = []
        for i, cap in enumerate(stage_caps(cc, num_layers)):
            lo, hi = _min_chunks(c, i, num_layers), min(total, cap)
            if even:  # n_i in {floor(L/p), ceil(L/p)} and a multiple of vpp
                lo, hi = max(lo, even[0]), min(hi, even[1])
            out.append((lo, hi))
        cc.memo[key] = out = tuple(out)
    return out


def stage_caps(cc: CandidateCosts, num_layers: int) -> tuple[int, ...]:
    """max_chunks of every stage (-1 where even the fixed terms overflow), kept on cc."""
    key = ("caps", num_layers)
    if (out := cc.memo.get(key)) is None:
        c = cc.cand
        act = cc.act_full if c.full_max > 0 else cc.act_base
        layers, most = c.vpp * cc.layer_state, num_layers // c.vpp
        out = []
        for i, s in enumerate(cc.stages):
            per_chunk, room = layers + s.in_flight * act, cc.usable - s.memory + cc.most_credit(i)
            out.append(-1 if room < 0 else min(most, room // per_chunk if per_chunk else num_layers))
        cc.memo[key] = out = tuple(out)
    return out


def chunk_range(cc: CandidateCosts, i: int, num_layers: int) -> tuple[int, int]:
    """Allowed chunks' worth of layers (k, n = k*vpp) on stage i: structure, vocab placement and memory."""
    return chunk_ranges(cc, num_layers)[i]


def max_chunks(cc: CandidateCosts, i: int, num_layers: int) -> int:
    """Most chunks' worth of layers stage i can hold with the most recomputation allowed (memory is linear
    in k; the scratch of full recompute is left out, so this is an upper bound)."""
    return stage_caps(cc, num_layers)[i]


def window_s(cc: CandidateCosts, i: int, k: int, window: str) -> float:
    """Forward or backward of stage i holding k chunks' worth of layers (recomputation excluded)."""
    s = cc.stages[i]
    stage_window = stage_bwd_s if window == "bwd" else stage_fwd_s
    return stage_window(cc.cand.vpp * k, cc.layer, cc.vocab, first=s.first, last=s.last)
