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

_ACT_BYTES = 2


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
    if plan.pp == 1:
        return 0.0
    nbytes = _ACT_BYTES * tokens * hidden / (plan.tp if plan.sequence_parallel else 1)
    link = comm.group_link(hw, plan.pp, plan.tp * plan.cp * plan.dp)
    return 2 * plan.vpp * comm.p2p(nbytes, link)


def build_stage(plan: Plan, index: int, layer: LayerCost, vocab: VocabCost, hw: HardwareSpec, p2p_s: float) -> StageCost:
    """Assemble stage `index` of `plan` from per-layer and vocabulary costs."""
    n = plan.layers_per_stage[index]
    first, last = index == 0, index == plan.pp - 1
    chunk = n // plan.vpp
    rc = recomputed_per_chunk(plan, chunk)
    r = rc * plan.vpp
    base = base_recompute(plan)
    compute = n * (layer.fwd.seconds + layer.bwd.seconds)
    cats = [n * (a + b) for a, b in zip(layer.fwd.by_category, layer.bwd.by_category)]
    fwd = n * (layer.fwd.seconds + layer.tp_fwd_s + layer.cp_fwd_s)
    bwd = n * (layer.bwd.seconds + layer.tp_bwd_s + layer.cp_bwd_s)
    comm_tp = n * (layer.tp_fwd_s + layer.tp_bwd_s)
    params = n * layer.params
    if first:
        compute += vocab.embed_fwd.seconds + vocab.embed_bwd.seconds
        cats[CATEGORIES.index("vocab")] += vocab.embed_fwd.seconds + vocab.embed_bwd.seconds
        fwd += vocab.embed_fwd.seconds
        bwd += vocab.embed_bwd.seconds
        comm_tp += vocab.embed_comm_s
        params += vocab.embed_params
    if last:
        compute += vocab.head_fwd.seconds + vocab.head_bwd.seconds
        cats[CATEGORIES.index("vocab")] += vocab.head_fwd.seconds + vocab.head_bwd.seconds
        fwd += vocab.head_fwd.seconds
        bwd += vocab.head_bwd.seconds
        comm_tp += vocab.head_comm_s
        params += vocab.head_params if plan.pp > 1 else vocab.head_params_shared
    recompute = (n - r) * layer.recompute_time(base) + r * layer.recompute_time("full")
    zero3 = _zero3_exposed(plan, hw, params, fwd, bwd)
    memory = stage_memory(plan, index, layer, vocab, n, rc, params)
    return StageCost(
        index=index, layers=n, recomputed_layers=r, has_embedding=first, has_head=last,
        compute_s=compute, recompute_s=recompute, tp_comm_s=comm_tp, cp_comm_s=n * (layer.cp_fwd_s + layer.cp_bwd_s),
        pp_comm_s=p2p_s, zero3_comm_s=zero3, fwd_s=fwd, bwd_s=bwd, by_category=tuple(cats), params=params,
        memory=memory)


def stage_memory(plan: Plan, index: int, layer: LayerCost, vocab: VocabCost, n: int, rc: int, params: int) -> StageMemory:
    """Peak bytes on one GPU of stage `index` (whole bytes; the solver uses the same integers)."""
    shards = plan.dp * plan.cp
    w, g, o = state_bytes_per_param(plan.zero, shards)
    num, den = activation_multiplier(plan.schedule, index, plan.pp, plan.vpp, plan.num_microbatches)
    chunk = n // plan.vpp
    base = base_recompute(plan)
    chunk_act = rc * layer.act.full + (chunk - rc) * layer.act.get(base)
    vocab_act = 0
    if index == 0:
        vocab_act += -(-num // den) * vocab.embed_act
    if index == plan.pp - 1:
        vocab_act += vocab.head_act + vocab.head_transient
    transient = layer.act.none if rc else 0
    if plan.zero >= 3:
        transient += 2 * layer.params * WEIGHT_BYTES  # the gathered weights of this layer and the prefetched next
    return StageMemory(
        weights=_ceil(params * w), gradients=_ceil(params * g), optimizer=_ceil(params * o),
        activations=num * chunk_act if den == 1 else (num * chunk_act) // 1,
        vocab_activations=vocab_act, transient=transient)


def _zero3_exposed(plan: Plan, hw: HardwareSpec, params: int, fwd_s: float, bwd_s: float) -> float:
    """ZeRO-3/FSDP per micro-batch: weights all-gathered for the forward and again for the backward, gradients
    reduce-scattered; prefetching hides them behind compute, so only the excess shows (Zhao et al. 2023)."""
    if plan.zero < 3:
        return 0.0
    n = plan.dp * plan.cp
    link = comm.group_link(hw, n, plan.tp)
    gather = comm.all_gather(params * WEIGHT_BYTES, n, link)
    scatter = comm.reduce_scatter(params * GRAD_BYTES, n, link)
    return max(0.0, gather - fwd_s) + max(0.0, gather + scatter - bwd_s)


def _ceil(x: float) -> int:
    return int(-(-x // 1))
