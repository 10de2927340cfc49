"""Per-candidate cost tables: everything the bound, the memory pre-check and the CP-SAT model need about one
outer candidate, taken from the cost model so that the solver and the estimate use the same numbers."""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.costmodel import comm
from autotune.costmodel.estimate import (ADAM_STEP_BYTES, CostModel, grad_sync_exposure, param_sync_exposure,
                                         tied_embedding_sync)
from autotune.costmodel.layer import LayerCost, VocabCost
from autotune.costmodel.schedules import activation_multiplier
from autotune.costmodel.stages import (p2p_time, stage_bwd_s, stage_fwd_s, stage_params, state_bytes,
                                       stage_vocab_activations, zero3_exposed, zero3_transient)
from autotune.search.space import Candidate
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
    dp_group: int
    link: comm.Link
    tied_sync_s: float
    adam_s_per_param: float


def base_plan(c: Candidate, layers: tuple[int, ...] = (), bucket: int = DEFAULT_BUCKET, r: int = 0) -> Plan:
    """A Plan for candidate c (layers may be omitted for per-stage lookups)."""
    recompute, r_layers = c.base, None
    if c.base == "none" and r > 0:
        recompute = "full"
        r_layers = None if layers and r >= max(layers) // c.vpp else r
    if not layers:
        layers = (0,) * c.pp
    return Plan(tp=c.tp, pp=c.pp, dp=c.dp, cp=c.cp, mbs=c.mbs, num_microbatches=c.num_microbatches,
                schedule=c.schedule, vpp=c.vpp, recompute=recompute, recompute_layers=r_layers, zero=c.zero,
                sequence_parallel=c.sp, vocab="ends" if is_even_split(layers) else "balanced",
                layers_per_stage=layers, bucket_size=bucket)


def candidate_costs(cm: CostModel, c: Candidate) -> CandidateCosts:
    """Gather the coefficients of one candidate."""
    layer, vocab = cm.layer(c.tp, c.cp, c.mbs, c.sp), cm.vocab(c.tp, c.cp, c.mbs, c.sp)
    plan = base_plan(c)
    shards = c.dp * c.cp
    p2p_s = p2p_time(plan, cm.hw, c.mbs * cm.job.seq_len // c.cp, cm.model.hidden_size)
    stages = []
    for i in range(c.pp):
        first, last = i == 0, i == c.pp - 1
        vparams = stage_params(0, layer, vocab, first=first, last=last, pp=c.pp)
        time_s = (vocab.embed_time if first else 0.0) + (vocab.head_time if last else 0.0) + p2p_s
        if c.zero >= 3:  # pp == 1: the single stage holds every layer
            n = cm.model.num_layers
            params = stage_params(n, layer, vocab, first=True, last=True, pp=1)
            time_s += zero3_exposed(plan, cm.hw, params, stage_fwd_s(n, layer, vocab, first=True, last=True),
                                    stage_bwd_s(n, layer, vocab, first=True, last=True))
        memory = sum(state_bytes(vparams, c.zero, shards)) + stage_vocab_activations(plan, i, vocab)
        memory += zero3_transient(plan, layer)
        num, _ = activation_multiplier(c.schedule, i, c.pp, c.vpp, c.num_microbatches)
        stages.append(StageTerms(first, last, time_s, memory, num, vparams))
    full_extra = layer.recompute_time("full") - layer.recompute_time(c.base)
    adam_shards = shards if c.zero >= 1 else 1
    return CandidateCosts(
        cand=c, layer=layer, vocab=vocab, layer_time_s=layer.time(c.base), full_extra_s=full_extra,
        layer_state=sum(state_bytes(layer.params, c.zero, shards)), act_base=layer.act.get(c.base),
        act_full=layer.act.full, act_none=layer.act.none, stages=tuple(stages), usable=cm.hw.usable_memory_bytes,
        dp_group=shards, link=comm.group_link(cm.hw, shards, c.tp),
        tied_sync_s=tied_embedding_sync(plan, cm.hw, vocab.embed_params, cm.model.tied_embeddings),
        adam_s_per_param=ADAM_STEP_BYTES / adam_shards / (cm.hw.hbm_bandwidth * cm.hw.efficiency.memory))


def lower_bound(cc: CandidateCosts, num_layers: int) -> float:
    """A step time no partition of this candidate can beat: the work spread perfectly over the stages
    (t_max >= W/p and t_max >= each stage's fixed part), nothing exposed but the fixed tied-embedding sync."""
    c = cc.cand
    per_layer = cc.layer_time_s + (cc.full_extra_s if c.full_min > 0 else 0.0)
    fixed = [s.time_s for s in cc.stages]
    work = num_layers * per_layer + sum(fixed)
    t_max = max(work / c.pp, max(fixed))
    total_params = num_layers * cc.layer.params + sum(s.vocab_params for s in cc.stages)
    adam = total_params / c.pp * cc.adam_s_per_param
    return (c.num_microbatches - 1 / c.vpp) * t_max + work / c.vpp + cc.tied_sync_s + adam


def max_chunks(cc: CandidateCosts, i: int, num_layers: int) -> int:
    """Most model chunks' worth of layers (k, n = k*vpp) stage i can hold with the most recomputation allowed
    (memory is linear in k; the scratch of full recompute is left out, so this bound is optimistic)."""
    c, s = cc.cand, cc.stages[i]
    act = cc.act_full if c.full_max > 0 else cc.act_base
    per_chunk = c.vpp * cc.layer_state + s.in_flight * act
    room = cc.usable - s.memory
    if room < 0:
        return -1
    return min(num_layers // c.vpp, room // per_chunk if per_chunk else num_layers)


def memory_possible(cc: CandidateCosts, num_layers: int) -> bool:
    """A necessary condition for a fitting partition: the stages together can hold every layer."""
    caps = [max_chunks(cc, i, num_layers) for i in range(cc.cand.pp)]
    if min(caps) < (1 if cc.cand.pp > 2 else 0):
        return False
    return sum(caps) * cc.cand.vpp >= num_layers


def grad_table(cc: CandidateCosts, i: int, bucket: int, n: int) -> float:
    """Exposed gradient reduction of stage i holding n layers, before slack."""
    c, s = cc.cand, cc.stages[i]
    params = n * cc.layer.params + s.vocab_params
    bwd = stage_bwd_s(n, cc.layer, cc.vocab, first=s.first, last=s.last)
    return grad_sync_exposure(replace(base_plan(c), bucket_size=bucket), params, bwd, cc.dp_group, cc.link)


def param_table(cc: CandidateCosts, i: int, bucket: int, n: int) -> float:
    """Exposed parameter all-gather of stage i holding n layers (distributed optimizer), before slack."""
    c, s = cc.cand, cc.stages[i]
    params = n * cc.layer.params + s.vocab_params
    fwd = stage_fwd_s(n, cc.layer, cc.vocab, first=s.first, last=s.last)
    return param_sync_exposure(replace(base_plan(c), bucket_size=bucket), params, fwd, cc.dp_group, cc.link)
