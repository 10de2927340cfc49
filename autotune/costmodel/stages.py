"""A pipeline stage assembled from layer and vocabulary costs: its time per micro-batch and its memory."""

from __future__ import annotations

import math
from typing import NamedTuple

from autotune.costmodel import comm
from autotune.costmodel.comm import comm_interference
from autotune.costmodel.layer import LayerCost, VocabCost
from autotune.costmodel.ops import CATEGORIES
from autotune.costmodel.pipeline import Ticks, chunks_per_rank, pass_ticks, peak_in_flight
from autotune.costmodel.placement import VocabPlacement, stage_runs, vocab_placement
from autotune.costmodel.state import dense_first_credit, fixed_state_bytes, layer_state_bytes
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import GRAD_BYTES, WEIGHT_BYTES, StateBytes
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan, chunk_layers
from autotune.units import ACTIVATION_BYTES, FP32_BYTES


class StageMemory(NamedTuple):
    """Bytes one GPU of a stage holds at its peak, term by term. A named tuple for the reason StageCost is one:
    an estimate makes one per rank of another peak (each rank of 1F1B), where a frozen dataclass's __init__
    took twice as long."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    """Transformer-layer activations of every micro-batch in flight."""
    vocab_activations: int
    """Embedding and LM-head/loss activations (fp32 logits) plus the loss's transient scratch."""
    transient: int
    """Working memory: one layer rematerialized by full recompute, ZeRO-3's gathered layer weights, the TP
    overlap's communication buffers (gpu_transient)."""

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.activations + self.vocab_activations
                + self.transient)

    def terms(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "vocab_activations": self.vocab_activations,
                "transient": self.transient}


class StageCost(NamedTuple):
    """One pipeline rank: per-micro-batch times (seconds) and peak memory. Immutable like the specs; a named tuple
    because an estimate builds one per rank (a sweep of 10,000 plans 181k of them: 0.3 us each, where a frozen
    dataclass's __init__ took 1.4 us, a seventh of estimate_throughput), as search.space.Candidate."""

    index: int
    layers: int
    recomputed_layers: int
    """Layers under full recomputation (the rest follow the base setting)."""
    has_embedding: bool
    has_head: bool
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    zero3_comm_s: float
    fwd_s: float
    """Forward of one micro-batch (the window that hides the parameter all-gather)."""
    bwd_s: float
    """Backward of one micro-batch without recomputation (the window that hides gradient reduction)."""
    by_category: tuple[float, ...]
    params: int
    memory: StageMemory
    chunks: tuple[tuple[float, float, float], ...]
    """(F, B, W) seconds of one micro-batch on each of the rank's model chunks: what the schedule runs."""
    expert_params: int
    """The routed-expert parameters inside `params` (MoE): their optimizer state and Adam step are sharded
    over the expert-data-parallel group."""
    time_s: float
    """Busy time per micro-batch: compute_s + recompute_s + tp_comm_s + cp_comm_s + pp_comm_s + zero3_comm_s,
    summed once per stage shape (stage_times; as a property it was summed again on every read, and an estimate
    reads it for every rank)."""


def recomputed_per_chunk(plan: Plan, chunk_layers: int) -> int:
    """Layers of one model chunk under full recomputation (Megatron's block method recomputes the first
    recompute_layers of each chunk, all of them if it has fewer)."""
    if plan.recompute != "full":
        return 0
    if plan.recompute_layers is None:
        return chunk_layers
    return min(plan.recompute_layers, chunk_layers)


def base_recompute(plan: Plan) -> str:
    """The setting of layers not under full recomputation."""
    return "selective" if plan.recompute == "selective" else "none"


def p2p_time(plan: Plan, hw: HardwareSpec, tokens: int, hidden: int, exposed: float = 1.0) -> float:
    """Per micro-batch: one activation send forward and one gradient send backward per model chunk, the
    `exposed` share of them (schedules.exposed_p2p_share) waited on."""
    return p2p_seconds(hw, pp=plan.pp, vpp=plan.vpp, tp=plan.tp, cp=plan.cp, dp=plan.dp,
                       sp=plan.sequence_parallel, tokens=tokens, hidden=hidden, exposed=exposed)


def p2p_seconds(hw: HardwareSpec, *, pp: int, vpp: int, tp: int, cp: int, dp: int, sp: bool, tokens: int,
                hidden: int, exposed: float = 1.0) -> float:
    """p2p_time from the bare degrees (the planner calls it before any Plan exists). Only a 1/tp shard of the
    activation travels between stages: with sequence parallelism it is already split; without, Megatron's
    scatter-gather optimization sends a 1/tp slice from each tp rank and all-gathers it over NVLink on
    arrival (Narayanan et al. 2021, Sec. 4.1)."""
    if pp == 1:
        return 0.0
    full = ACTIVATION_BYTES * tokens * hidden
    send = comm.p2p(full / tp, comm.p2p_link(hw, pp, tp * cp * dp))
    if not sp and tp > 1:
        send += comm.all_gather(full, tp, comm.group_link(hw, tp, 1))
    return 2 * vpp * send * exposed


def stage_params(n: int, layer: LayerCost, vocab: VocabCost, *, first: float, last: float, pp: int,
                 shared: bool | None = None) -> int:
    """Parameters on one GPU of a stage with n layers and `first`/`last` shares of the embedding/head."""
    shared = (pp == 1) if shared is None else shared
    head = vocab.head_params_shared if shared else vocab.head_params
    return n * layer.params + math.ceil(first * vocab.embed_params) + math.ceil(last * head)


def stage_fwd_s(n: int, layer: LayerCost, vocab: VocabCost, *, first: float, last: float) -> float:
    """Forward of one micro-batch through the stage (compute and exposed TP/CP communication)."""
    return (n * (layer.fwd.seconds + layer.tp_fwd_s + layer.cp_fwd_s) + first * vocab.embed_fwd.seconds
            + last * vocab.head_fwd.seconds)


def stage_bwd_s(n: int, layer: LayerCost, vocab: VocabCost, *, first: float, last: float) -> float:
    """Backward of one micro-batch through the stage, recomputation excluded."""
    return (n * (layer.bwd.seconds + layer.tp_bwd_s + layer.cp_bwd_s) + first * vocab.embed_bwd.seconds
            + last * vocab.head_bwd.seconds)


def vocab_parallel_comm(model: ModelSpec, hw: HardwareSpec, *, pp: int, tp: int, cp: int, dp: int,
                        tokens: int) -> tuple[float, float]:
    """Per micro-batch (forward, backward) collectives vocabulary parallelism adds over the pipeline group
    (Yeung et al. 2024): the partial embeddings are all-reduced and the last layer's output is broadcast to
    every rank; the softmax's max and sum (fp32 per token) are all-reduced; backward the input gradient of
    the head is reduced and the embedding's output gradient broadcast. Counted as exposed: the fork
    overlaps part of it with transformer passes, so this errs on the slow side."""
    if pp == 1:
        return 0.0, 0.0
    link = comm.group_link(hw, pp, tp * cp * dp)
    hidden = ACTIVATION_BYTES * tokens * model.hidden_size
    stats = 2 * FP32_BYTES * tokens
    fwd = comm.all_reduce(hidden, pp, link) + comm.all_gather(hidden, pp, link) + comm.all_reduce(stats, pp, link)
    bwd = comm.reduce_scatter(hidden, pp, link) + comm.all_gather(hidden, pp, link)
    return fwd, bwd


#: Micro-batches of activations vocabulary parallelism keeps in flight beyond the schedule's own (Yeung et
#: al. 2024, Table 1: 1F1B holds p, Vocab-1 p+2): its output-layer passes run two slots behind.
VOCAB_PARALLEL_EXTRA_IN_FLIGHT = 2


def in_flight_chunks(plan: Plan, rank: int, ticks: Ticks) -> int:
    """Chunk activations the rank holds at its peak: the schedule's count, plus vocabulary parallelism's."""
    peak = peak_in_flight(plan.schedule, plan.pp, plan.vpp, plan.num_microbatches, ticks)[rank]
    return peak + vocab_parallel_in_flight(plan)


def vocab_parallel_in_flight(plan: Plan) -> int:
    """Chunk activations vocabulary parallelism keeps in flight beyond the schedule's own (0 without it)."""
    if plan.vocab == "parallel" and plan.pp > 1:
        return VOCAB_PARALLEL_EXTRA_IN_FLIGHT * chunks_per_rank(plan.schedule, plan.vpp)
    return 0


def chunk_durations(plan: Plan, n: int, layer: LayerCost, vocab: VocabCost, place: VocabPlacement,
                    rc: int, p2p_s: float, vp_comm: tuple[float, float], extra_bwd_s: float = 0.0
                    ) -> tuple[tuple[float, float, float], ...]:
    """(F, B, W) seconds of one micro-batch on each model chunk of a rank with n layers: layers split evenly
    over the chunks (specs.plan.chunk_layers), the vocabulary shares on their chunks, point-to-point per chunk
    pass, full recompute of up to rc layers per chunk in B, the weight-gradient GEMMs in W."""
    v = chunks_per_rank(plan.schedule, plan.vpp)
    counts = chunk_layers(n, v)
    base = base_recompute(plan)
    rec_base, rec_full = layer.recompute_time(base), layer.recompute_time("full")
    f_layer, b_layer, w_layer = layer_passes(layer, base)
    hop = p2p_s / (2 * v) if plan.pp > 1 else 0.0
    out = []
    for c, per in enumerate(counts):
        f = per * f_layer + hop
        b = per * b_layer + min(rc, per) * (rec_full - rec_base) + hop
        w = per * w_layer
        if c == place.embed_chunk and place.embed:
            f += place.embed * (vocab.embed_fwd.seconds + vocab.embed_comm_s / 2)
            b += place.embed * (vocab.embed_bwd.seconds + vocab.embed_comm_s / 2)
        if c == place.head_chunk and place.head:
            f += place.head * (vocab.head_fwd.seconds + vocab.head_comm_s / 2)
            b += place.head * (vocab.head_bwd.seconds - vocab.head_wgrad_s + vocab.head_comm_s / 2)
            w += place.head * vocab.head_wgrad_s
        if c == 0:
            f += vp_comm[0]
            b += vp_comm[1] + extra_bwd_s
        out.append((f, b, w))
    return tuple(out)


def layer_passes(layer: LayerCost, base: str) -> tuple[float, float, float]:
    """One layer's (F, B, W) seconds per micro-batch: the forward with its exposed TP/CP communication; the
    input gradient with its communication and the base recomputation; the weight-gradient GEMMs."""
    return (layer.fwd.seconds + layer.tp_fwd_s + layer.cp_fwd_s,
            layer.bwd.seconds - layer.wgrad_s + layer.tp_bwd_s + layer.cp_bwd_s + layer.recompute_time(base),
            layer.wgrad_s)


def schedule_ticks(plan: Plan, layer: LayerCost) -> Ticks:
    """The F:B:W proportions of one layer under the plan's base recomputation: what a v-half order is built
    for (independent of the partition, so every partition of a plan runs the same order)."""
    return pass_ticks(((layer_passes(layer, base_recompute(plan)),),))


def build_stages(plan: Plan, layer: LayerCost, vocab: VocabCost, hw: HardwareSpec, p2p_s: float,
                 vp_comm: tuple[float, float] = (0.0, 0.0), param_bytes: StateBytes = StateBytes(),
                 ticks: Ticks | None = None, memo: dict | None = None, dense_first: int = 0,
                 grads_inline: bool = False) -> tuple[StageCost, ...]:
    """Assemble every stage of `plan` from per-layer and vocabulary costs (estimates are called thousands of
    times per second): ranks alike come in runs (placement.stage_runs), whose parts are found once per run and
    only the stage objects, which differ in their index, are made per rank. `ticks`: schedule_ticks(plan,
    layer), if the caller has it. `memo`: a dict kept across calls for plans that differ only in their
    partition (with the same costs), which then share every stage of equal index and layer count; its "times"
    and "states" (stage_times and stage_state by layers and placement) may be shared with plans that differ in
    what those do not read (stagememo: times across schedules but v-half and ZeRO 0/1, bytes across recomputation).
    `dense_first`: the model's dense-first layers, which open rank 0's first chunk (dense_first_credit).
    `grads_inline`: ZeRO-2's reduce-scatters stall the backward (zero3_exposed's `inline`)."""
    v = chunks_per_rank(plan.schedule, plan.vpp)
    ticks = schedule_ticks(plan, layer) if ticks is None else ticks
    extra_in_flight, per_gpu = vocab_parallel_in_flight(plan), gpu_transient(plan, layer)
    memo = {} if memo is None else memo  # middle stages with equal layer counts cost the same:
    # The stages and their memories are kept from a shape's second plan on (a partition search): a sweep or a
    # search meets most shapes once, and objects kept alive for nothing make the garbage collector walk them
    times, states = memo.setdefault("times", {}), memo.setdefault("states", {})
    again = "memories" in memo
    memories = memo.setdefault("memories", {}) if again else {}
    built = memo.setdefault("built", {}) if again else None
    memo.setdefault("memories", {})  # (empty: it marks the shape seen)
    out: list[StageCost] = []
    # tuple.__new__ takes the fields as one tuple, in C, where the named tuples' __new__ is a Python function taking
    # each by name (and _make one checking the length): a fifth less per object, and an estimate makes one per rank
    new = tuple.__new__
    for start, _, n, place, pid, parts in stage_runs(plan.layers_per_stage, plan.schedule, plan.vocab, plan.pp,
                                                     plan.vpp, plan.num_microbatches, ticks):
        dense = min(chunk_layers(n, v)[0], dense_first) if start == 0 else 0  # rank 0's first chunk opens the model
        timing = times.get((n, pid))
        if timing is None:
            timing = times[n, pid] = stage_times(plan, layer, vocab, hw, n, place, p2p_s, vp_comm, param_bytes.grad,
                                                 grads_inline)
        fields, tail, act_chunk, rc_transient = timing
        key = (n, pid, dense)
        state = states.get(key)
        if state is None:
            state = states[key] = stage_state(plan, layer, vocab, n, place, dense, fields[-1], param_bytes)
        for first, after, peak in parts:
            # ranks alike in layers, placement, dense layers and peak hold alike: a shape seen before keeps its
            # memories; a new one makes each part's (two runs of a plan rarely share one: no look-ups for them)
            memory = memories.get((*key, peak)) if again else None
            if memory is None:
                memory = new(StageMemory, (state[0], state[1], state[2], (peak + extra_in_flight) * act_chunk,
                                           vocab_activations(plan, place, peak, vocab) if place.embed or place.head
                                           else 0, rc_transient + per_gpu))
                if again:
                    memories[(*key, peak)] = memory
            if built is None:
                if after - first == 1:  # (1F1B: every rank's peak differs)
                    out.append(new(StageCost, (first, *fields, memory, *tail)))
                else:
                    rest = (*fields, memory, *tail)
                    out += [new(StageCost, (i, *rest)) for i in range(first, after)]
                continue
            for i in range(first, after):
                stage = built.get((i, n))
                if stage is None:
                    stage = built[i, n] = new(StageCost, (i, *fields, memory, *tail))
                out.append(stage)
    return tuple(out)


def stage_times(plan: Plan, layer: LayerCost, vocab: VocabCost, hw: HardwareSpec, n: int, place: VocabPlacement,
                p2p_s: float, vp_comm: tuple[float, float], grad_bytes: int, grads_inline: bool = False) -> tuple:
    """What every stage of n layers placed at `place` shares but its index and memory: StageCost's fields from
    `layers` to `params` and those after `memory`; and one chunk's activations and the layer full recompute
    rematerializes (its memory's, from the recomputation). Reads no more of the plan than its degrees, schedule,
    vocabulary mode, recomputation and ZeRO stage from 2 on (ZeRO-2/3 traffic)."""
    v = chunks_per_rank(plan.schedule, plan.vpp)
    base = base_recompute(plan)
    rec_base, rec_full = layer.recompute_time(base), layer.recompute_time("full")
    first, last = place.embed, place.head
    biggest = -(-n // v)  # chunks may differ by one layer; memory is counted at the largest
    rc = recomputed_per_chunk(plan, biggest)
    rc_layers = sum(min(rc, c) for c in chunk_layers(n, v))
    vocab_compute = (first * (vocab.embed_fwd.seconds + vocab.embed_bwd.seconds)
                     + last * (vocab.head_fwd.seconds + vocab.head_bwd.seconds))
    by_category = [n * (a + b) for a, b in zip(layer.fwd.by_category, layer.bwd.by_category)]
    by_category[CATEGORIES.index("vocab")] += vocab_compute
    params = stage_params(n, layer, vocab, first=first, last=last, pp=plan.pp, shared=place.shared)
    fwd = stage_fwd_s(n, layer, vocab, first=first, last=last)
    bwd = stage_bwd_s(n, layer, vocab, first=first, last=last)
    zero3 = zero3_exposed(plan, hw, params, fwd, bwd, grad_bytes, n + (first > 0) + (last > 0), grads_inline)
    compute, recompute = n * (layer.fwd.seconds + layer.bwd.seconds) + vocab_compute, \
        n * rec_base + rc_layers * (rec_full - rec_base)
    tp_comm = (n * (layer.tp_fwd_s + layer.tp_bwd_s) + first * vocab.embed_comm_s + last * vocab.head_comm_s
               + sum(vp_comm))
    cp_comm = n * (layer.cp_fwd_s + layer.cp_bwd_s)
    return ((n, rc_layers, first > 0, last > 0, compute, recompute, tp_comm, cp_comm, p2p_s, zero3, fwd, bwd,
             tuple(by_category), params),
            (chunk_durations(plan, n, layer, vocab, place, rc, p2p_s, vp_comm, zero3), n * layer.expert_params,
             compute + recompute + tp_comm + cp_comm + p2p_s + zero3),
            rc * layer.act.full + (biggest - rc) * layer.act.get(base), layer.act.none if rc else 0)


def stage_state(plan: Plan, layer: LayerCost, vocab: VocabCost, n: int, place: VocabPlacement, dense: int,
                params: int, param_bytes: StateBytes) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes of a stage of n layers and `params` parameters placed at `place`,
    opened by `dense` dense-first layers. Reads no more of the plan than its degrees, schedule and ZeRO stage."""
    v = chunks_per_rank(plan.schedule, plan.vpp)
    shards, zero, expert_dp = plan.dp * plan.cp, plan.zero, plan.expert_dp
    w, g, o = layer_state_bytes(layer, zero, shards, expert_dp, param_bytes)
    fw, fg, fo = fixed_state_bytes(layer, vocab, params - n * layer.params, place.head, v, zero, shards, expert_dp,
                                   param_bytes)
    if not dense:  # (most stages: spelled out, as the three terms are, since an estimate asks for every new shape)
        return n * w + fw, n * g + fg, n * o + fo
    cw, cg, co = dense_first_credit(layer, zero, shards, expert_dp, param_bytes)
    return n * w + fw - dense * cw, n * g + fg - dense * cg, n * o + fo - dense * co


def stage_vocab_activations(plan: Plan, index: int, vocab: VocabCost, ticks: Ticks) -> int:
    """The rank's share of the embedding activations of every micro-batch it holds in flight, and of the
    LM head's fp32 softmax and loss scratch for the one micro-batch between its head forward and backward."""
    return vocab_activations(plan, vocab_placement(plan.schedule, plan.vocab, plan.pp, plan.vpp, index),
                             peak_in_flight(plan.schedule, plan.pp, plan.vpp, plan.num_microbatches, ticks)[index],
                             vocab)


def vocab_activations(plan: Plan, place: VocabPlacement, peak: int, vocab: VocabCost) -> int:
    """stage_vocab_activations of a rank placed at `place` whose schedule holds `peak` chunks at once."""
    total = 0
    if place.embed:
        micro = -(-peak // chunks_per_rank(plan.schedule, plan.vpp))
        if plan.vocab == "parallel":
            micro += VOCAB_PARALLEL_EXTRA_IN_FLIGHT
        total += math.ceil(place.embed * micro * vocab.embed_act)
    if place.head:
        total += math.ceil(place.head * (vocab.head_act + vocab.head_transient))
    return total


def gpu_transient(plan: Plan, layer: LayerCost) -> int:
    """Bytes a GPU holds besides its state and activations, whatever its layer count: under ZeRO-3 one layer's
    gathered full weights and the next one's prefetch; the layer's communication buffers (LayerCost.buffers)."""
    gathered = 2 * (layer.stage_params + layer.surplus_params) * WEIGHT_BYTES if plan.zero >= 3 else 0
    return gathered + layer.buffers


def zero3_exposed(plan: Plan, hw: HardwareSpec, params: int, fwd_s: float, bwd_s: float,
                  grad_bytes: int = GRAD_BYTES, units: int = 1, inline: bool = False) -> float:
    """ZeRO-2/3 per micro-batch. ZeRO-3/FSDP all-gathers the weights for the forward and again for the
    backward and reduce-scatters the gradients; ZeRO-2 keeps only a 1/d shard of the gradients, so it too
    reduce-scatters them in every micro-batch's backward (DeepSpeed's reduce_scatter with overlap_comm).
    Prefetching and bucketing hide them behind compute, so only the excess shows (Zhao et al. 2023). The
    hidden part is not free: while a collective runs, its NCCL channels hold SMs the GEMMs would use, so the
    compute it overlaps slows by comm_interference of the overlapped time. FSDP wraps every Transformer block
    (and the embedding and head) as a unit with its own collectives, so each of the `units` pays the
    collective's latency (torchtitan's fully_shard per block; DeepSpeed's per-module prefetch). `inline`: ZeRO-2
    whose reduction is not overlapped (overlap.overlaps_grad_reduce False: DeepSpeed without overlap_comm, its
    default below ZeRO-3) reduce-scatters each bucket on the compute stream as the backward fills it
    (deepspeed 0.19 runtime/zero/stage_1_and_2.py reduce_ipg_grads), stalling the backward for all of it."""
    if plan.zero < 2:
        return 0.0
    n = plan.dp * plan.cp
    link = comm.group_link(hw, n, plan.tp)
    units = max(1, units)
    gather = units * comm.all_gather(params / units * WEIGHT_BYTES, n, link) if plan.zero >= 3 else 0.0
    scatter = units * comm.reduce_scatter(params / units * grad_bytes, n, link)
    if inline and plan.zero == 2:
        return scatter
    fwd_exposed, bwd_exposed = max(0.0, gather - fwd_s), max(0.0, gather + scatter - bwd_s)
    hidden = 2 * gather + scatter - fwd_exposed - bwd_exposed
    return fwd_exposed + bwd_exposed + comm_interference(hw) * hidden
