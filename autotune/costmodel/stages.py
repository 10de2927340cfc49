"""A pipeline stage assembled from layer and vocabulary costs: its time per micro-batch and its memory."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.costmodel import comm
from autotune.costmodel.layer import LayerCost, VocabCost
from autotune.costmodel.memory import state_bytes_per_param
from autotune.costmodel.ops import CATEGORIES
from autotune.costmodel.schedules import activation_multiplier
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import GRAD_BYTES, WEIGHT_BYTES
from autotune.specs.plan import Plan
from autotune.units import ACTIVATION_BYTES, whole_bytes



@dataclass(frozen=True, slots=True)
class StageMemory:
    """Bytes one GPU of a stage holds at its peak, term by term."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    """Transformer-layer activations of every micro-batch in flight."""
    vocab_activations: int
    """Embedding and LM-head/loss activations (fp32 logits) plus the loss's transient scratch."""
    transient: int
    """Working memory: one layer rematerialized by full recompute, ZeRO-3's gathered layer weights."""

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.activations + self.vocab_activations
                + self.transient)

    def terms(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "activations": self.activations, "vocab_activations": self.vocab_activations,
                "transient": self.transient}


@dataclass(frozen=True, slots=True)
class StageCost:
    """One pipeline rank: per-micro-batch times (seconds) and peak memory."""

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

    @property
    def time_s(self) -> float:
        """Busy time per micro-batch."""
        return (self.compute_s + self.recompute_s + self.tp_comm_s + self.cp_comm_s + self.pp_comm_s
                + self.zero3_comm_s)


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


def p2p_time(plan: Plan, hw: HardwareSpec, tokens: int, hidden: int) -> float:
    """Per micro-batch: one activation send forward and one gradient send backward per model chunk (with
    sequence parallelism only the 1/tp shard travels, Megatron's scatter-gather optimization)."""
    return p2p_seconds(hw, pp=plan.pp, vpp=plan.vpp, tp=plan.tp, cp=plan.cp, dp=plan.dp,
                       sp=plan.sequence_parallel, tokens=tokens, hidden=hidden)


def p2p_seconds(hw: HardwareSpec, *, pp: int, vpp: int, tp: int, cp: int, dp: int, sp: bool, tokens: int,
                hidden: int) -> float:
    """p2p_time from the bare degrees (the planner calls it before any Plan exists)."""
    if pp == 1:
        return 0.0
    nbytes = ACTIVATION_BYTES * tokens * hidden / (tp if sp else 1)
    return 2 * vpp * comm.p2p(nbytes, comm.group_link(hw, pp, tp * cp * dp))


def stage_params(n: int, layer: LayerCost, vocab: VocabCost, *, first: bool, last: bool, pp: int) -> int:
    """Parameters on one GPU of a stage with n layers (the vocabulary layers on the ends)."""
    params = n * layer.params
    if first:
        params += vocab.embed_params
    if last:
        params += vocab.head_params if pp > 1 else vocab.head_params_shared
    return params


def stage_fwd_s(n: int, layer: LayerCost, vocab: VocabCost, *, first: bool, last: bool) -> float:
    """Forward of one micro-batch through the stage (compute and exposed TP/CP communication)."""
    return (n * (layer.fwd.seconds + layer.tp_fwd_s + layer.cp_fwd_s) + (vocab.embed_fwd.seconds if first else 0.0)
            + (vocab.head_fwd.seconds if last else 0.0))


def stage_bwd_s(n: int, layer: LayerCost, vocab: VocabCost, *, first: bool, last: bool) -> float:
    """Backward of one micro-batch through the stage, recomputation excluded."""
    return (n * (layer.bwd.seconds + layer.tp_bwd_s + layer.cp_bwd_s) + (vocab.embed_bwd.seconds if first else 0.0)
            + (vocab.head_bwd.seconds if last else 0.0))


def build_stages(plan: Plan, layer: LayerCost, vocab: VocabCost, hw: HardwareSpec, p2p_s: float) -> tuple[StageCost, ...]:
    """Assemble every stage of `plan` from per-layer and vocabulary costs (what does not depend on the stage
    is computed once: estimates are called thousands of times per second)."""
    base = base_recompute(plan)
    rec_base, rec_full = layer.recompute_time(base), layer.recompute_time("full")
    per_state = state_bytes(layer.params, plan.zero, plan.dp * plan.cp)
    layer_compute = layer.fwd.seconds + layer.bwd.seconds
    layer_tp = layer.tp_fwd_s + layer.tp_bwd_s
    layer_cp = layer.cp_fwd_s + layer.cp_bwd_s
    cats = tuple(a + b for a, b in zip(layer.fwd.by_category, layer.bwd.by_category))
    vocab_cat = CATEGORIES.index("vocab")
    act_base = layer.act.get(base)
    transient_zero3 = zero3_transient(plan, layer)
    shared: dict[tuple[int, bool, bool], tuple] = {}  # middle stages with equal layer counts cost the same
    out = []
    for index, n in enumerate(plan.layers_per_stage):
        first, last = index == 0, index == plan.pp - 1
        key = (n, first, last)
        if key not in shared:
            vocab_compute = ((vocab.embed_fwd.seconds + vocab.embed_bwd.seconds) if first else 0.0) + \
                ((vocab.head_fwd.seconds + vocab.head_bwd.seconds) if last else 0.0)
            by_category = [n * x for x in cats]
            by_category[vocab_cat] += vocab_compute
            params = stage_params(n, layer, vocab, first=first, last=last, pp=plan.pp)
            fwd = stage_fwd_s(n, layer, vocab, first=first, last=last)
            bwd = stage_bwd_s(n, layer, vocab, first=first, last=last)
            shared[key] = (
                params, fwd, bwd, tuple(by_category), n * layer_compute + vocab_compute,
                n * layer_tp + (vocab.embed_comm_s if first else 0.0) + (vocab.head_comm_s if last else 0.0),
                state_bytes(params - n * layer.params, plan.zero, plan.dp * plan.cp),
                zero3_exposed(plan, hw, params, fwd, bwd))
        params, fwd, bwd, by_category, compute, tp_comm, fixed, zero3 = shared[key]
        rc = recomputed_per_chunk(plan, n // plan.vpp)
        num, _ = activation_multiplier(plan.schedule, index, plan.pp, plan.vpp, plan.num_microbatches)
        memory = StageMemory(
            weights=n * per_state[0] + fixed[0], gradients=n * per_state[1] + fixed[1],
            optimizer=n * per_state[2] + fixed[2],
            activations=num * (rc * layer.act.full + (n // plan.vpp - rc) * act_base),
            vocab_activations=stage_vocab_activations(plan, index, vocab) if first or last else 0,
            transient=(layer.act.none if rc else 0) + transient_zero3)
        out.append(StageCost(
            index=index, layers=n, recomputed_layers=rc * plan.vpp, has_embedding=first, has_head=last,
            compute_s=compute, recompute_s=n * rec_base + rc * plan.vpp * (rec_full - rec_base), tp_comm_s=tp_comm,
            cp_comm_s=n * layer_cp, pp_comm_s=p2p_s, zero3_comm_s=zero3, fwd_s=fwd, bwd_s=bwd,
            by_category=by_category, params=params, memory=memory))
    return tuple(out)


def state_bytes(params: int, zero: int, shards: int) -> tuple[int, int, int]:
    """Whole bytes of (weights, gradients, optimizer states) for `params` parameters."""
    w, g, o = state_bytes_per_param(zero, shards)
    return whole_bytes(params * w), whole_bytes(params * g), whole_bytes(params * o)


def stage_vocab_activations(plan: Plan, index: int, vocab: VocabCost) -> int:
    """Embedding activations of the micro-batches in flight on the first stage; the LM head's fp32 softmax
    and loss scratch of the one micro-batch the last stage holds between its forward and backward."""
    total = 0
    if index == 0:
        num, den = activation_multiplier(plan.schedule, 0, plan.pp, plan.vpp, plan.num_microbatches)
        total += -(-num // den) * vocab.embed_act
    if index == plan.pp - 1:
        total += vocab.head_act + vocab.head_transient
    return total


def zero3_transient(plan: Plan, layer: LayerCost) -> int:
    """ZeRO-3 gathers one layer's full weights and prefetches the next."""
    return 2 * layer.params * WEIGHT_BYTES if plan.zero >= 3 else 0


def zero3_exposed(plan: Plan, hw: HardwareSpec, params: int, fwd_s: float, bwd_s: float) -> float:
    """ZeRO-3/FSDP per micro-batch: weights all-gathered for the forward and again for the backward, gradients
    reduce-scattered; prefetching hides them behind compute, so only the excess shows (Zhao et al. 2023)."""
    if plan.zero < 3:
        return 0.0
    n = plan.dp * plan.cp
    link = comm.group_link(hw, n, plan.tp)
    gather = comm.all_gather(params * WEIGHT_BYTES, n, link)
    scatter = comm.reduce_scatter(params * GRAD_BYTES, n, link)
    return max(0.0, gather - fwd_s) + max(0.0, gather + scatter - bwd_s)
