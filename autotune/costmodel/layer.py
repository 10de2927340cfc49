"""Per-micro-batch costs of one Transformer layer and of the vocabulary layers for one (tp, cp, mbs, sp).

These are the building blocks every stage is made of; the planner precomputes them once per setting and
assembles stages from them, so a whole estimate costs a few dozen arithmetic operations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autotune.costmodel import comm
from autotune.costmodel.compute import PassTime, attention_kernel, memoized_op_time, pass_time
from autotune.costmodel.memory import (LayerActivations, dense_layer_params, embedding_activations,
                                       embedding_params, gathered_input_bytes, head_activations, head_params,
                                       head_transient, layer_activations, moe_expert_share, moe_layer_params,
                                       sac_activations)
from autotune.costmodel.moe import deepep_buffer_bytes, moe_activation_bytes, moe_comm
from autotune.costmodel.ops import (LayerShape, backward_ops, embedding_backward_ops, embedding_forward_ops,
                                    head_backward_ops, head_forward_ops, layer_forward_ops)
from autotune.costmodel.epoverlap import hideable_exchange
from autotune.costmodel.ringattn import cp_exposed
from autotune.costmodel.tpcomm import (recomputed_gathers_s, regathers_inputs, tp_layer_comm,
                                       tp_overlap_buffers)
from autotune.costmodel.tpmodes import layer_tp_comm_s, layer_tp_memory
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.tpgrid import tp_mode_degrees
from autotune.units import ACTIVATION_BYTES, FP32_BYTES, whole_bytes

if TYPE_CHECKING:  # measured.py imports ops and specs only, but layer need not load numpy tables to type it
    from autotune.costmodel.measured import MeasuredOps


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One Transformer layer, one micro-batch, one GPU."""

    fwd: PassTime
    bwd: PassTime
    attn_fwd_s: float
    """Core-attention forward (what ring attention's exchange hides behind)."""
    tp_fwd_s: float
    """Tensor-parallel collectives of the forward (2 all-reduces, or 2 all-gathers + 2 reduce-scatters)."""
    tp_bwd_s: float
    cp_fwd_s: float
    """Ring-attention key/value exchange not hidden behind attention compute, forward."""
    cp_bwd_s: float
    params: int
    """Parameters on this GPU."""
    wgrad_s: float
    """The weight-gradient GEMMs inside bwd: what zero-bubble schedules run apart as W passes."""
    act: LayerActivations
    selective_s: float = -1.0
    """What selective recomputation runs again: the core-attention forward (Megatron), or torchtitan's op-level
    SAC; negative = the attention forward."""
    expert_params: int = 0
    """The routed-expert parameters inside `params` (MoE): reduced and sharded over the expert-data-parallel
    group rather than the data-parallel one."""
    memory_params: int = -1
    """Parameters a stage's memory is charged per layer where that exceeds `params` (-1: params). An MoE model
    with dense layers has the mean layer's parameters as `params` (what its gradients sync and its optimizer
    steps over), but a stage may hold more MoE layers than the mean: with dense-first layers every layer of
    a stage may be MoE, so the MoE layer is charged (state.dense_first_credit brings stage 0's known dense
    layers to their own size; a stage after it holding the rest of them is charged MoE layers for them, which
    undercounts where a dense layer outweighs an MoE layer on its GPU, as DeepSeek-V3's does at tp 1, ep 256);
    a periodic pattern (moe_layer_freq f) puts at most
    ceil(n/f) MoE layers in n consecutive ones, charged as n * (MoE/f + dense*(f-1)/f) plus surplus_params for
    each model chunk of the rank (its chunks are not consecutive with each other)."""
    memory_expert_params: int = -1
    """The routed experts inside memory_params (-1: expert_params)."""
    surplus_params: int = 0
    """Parameters a rank's memory is charged once per model chunk on top of n * memory_params (see
    memory_params)."""
    surplus_expert_params: int = 0
    """The routed experts inside surplus_params."""
    dense_params: int = 0
    """Parameters of one dense layer on this GPU (an MoE model's mean layer where it has dense layers; 0 for
    other layers): what a stage known to hold dense-first layers is charged for each (state.dense_first_credit)."""
    sac_gather_s: float = 0.0
    """torchtitan's backward re-gather of the block inputs, which only its selective checkpointing runs
    (tpcomm.recomputed_gathers_s): charged with that recomputation, not in tp_bwd_s."""
    buffers: int = 0
    """Bytes a GPU allocates once for this layer's collectives, whatever its layer count (under tp overlap,
    Megatron's TE userbuffers or torchtitan's symmetric-memory workspace: tpcomm.tp_overlap_buffers; DeepEP's
    NVLink buffer: moe.deepep_buffer_bytes)."""
    ep_hidden_fwd_s: float = 0.0
    """The part of tp_fwd_s that is the expert all-to-all and hides behind another micro-batch's compute when
    the plan overlaps it (epoverlap.ep_overlapped)."""
    ep_hidden_bwd_s: float = 0.0

    @property
    def stage_params(self) -> int:
        """memory_params, resolved."""
        return self.params if self.memory_params < 0 else self.memory_params

    @property
    def stage_expert_params(self) -> int:
        """memory_expert_params, resolved."""
        return self.expert_params if self.memory_expert_params < 0 else self.memory_expert_params

    def time(self, recompute: str) -> float:
        """Forward + backward + recomputation + exposed communication, seconds."""
        return self.base_time + self.recompute_time(recompute)

    @property
    def base_time(self) -> float:
        return self.fwd.seconds + self.bwd.seconds + self.comm_time

    @property
    def comm_time(self) -> float:
        return self.tp_fwd_s + self.tp_bwd_s + self.cp_fwd_s + self.cp_bwd_s

    def recompute_time(self, recompute: str) -> float:
        """Extra forward work the backward pays: core attention (selective; torchtitan's SAC with the gathers it
        re-runs) or the whole layer (full, its forward collectives included)."""
        if recompute == "selective":
            return self.attn_fwd_s if self.selective_s < 0 else self.selective_s + self.sac_gather_s
        if recompute == "full":
            return self.fwd.seconds + self.tp_fwd_s + self.cp_fwd_s
        return 0.0


@dataclass(frozen=True, slots=True)
class VocabCost:
    """Input embedding (first stage) and final norm + LM head + cross-entropy (last stage)."""

    embed_fwd: PassTime
    embed_bwd: PassTime
    embed_comm_s: float
    head_fwd: PassTime
    head_bwd: PassTime
    head_comm_s: float
    embed_params: int
    head_params: int
    """LM-head parameters on a separate last stage (a tied head keeps its own copy there)."""
    head_params_shared: int
    """LM-head parameters when the head shares a GPU with a tied embedding (pp == 1)."""
    embed_act: int
    head_act: int
    head_transient: int
    head_wgrad_s: float
    """The LM head's weight-gradient GEMM inside head_bwd (a W pass under zero-bubble schedules)."""
    head_expert_params: int = 0
    """Routed-expert parameters inside head_params (an MoE model's multi-token prediction layers,
    costmodel/mtp.py): sharded over the expert-data-parallel group like a layer's."""

    @property
    def embed_time(self) -> float:
        return self.embed_fwd.seconds + self.embed_bwd.seconds + self.embed_comm_s

    @property
    def head_time(self) -> float:
        return self.head_fwd.seconds + self.head_bwd.seconds + self.head_comm_s


def layer_shape(model: ModelSpec, job: JobSpec, *, tp: int, cp: int, mbs: int, sp: bool, ep: int = 1,
                etp: int = 1) -> LayerShape:
    """Per-GPU sizes of one micro-batch."""
    return LayerShape(tokens=mbs * job.seq_len // cp, kv_tokens=mbs * job.seq_len, mbs=mbs, tp=tp, sp=sp,
                      elem=ACTIVATION_BYTES, flash=job.flash_attention, fused=job.fused_kernels,
                      fp8=job.dtype == "fp8", ep=ep, etp=etp,
                      imbalance=rank_load(job, ep) if model.is_moe else 1.0,
                      dispatcher=job.moe_dispatcher if model.is_moe else "alltoall",
                      cross_entropy=job.runs_cross_entropy,
                      main_grad=job.grad_bytes if job.trainer == "megatron" else 0)


def rank_load(job: JobSpec, ep: int) -> float:
    """The busiest GPU's expert tokens over the mean: the job's routing load (JobSpec.moe_load) where experts
    are spread over ep > 1 GPUs. With ep 1 every GPU runs every expert on all of its own tokens, so however the
    router spreads them no GPU waits for another: 1, the capacity where every expert's input is padded to it, or
    at most the capacity where tokens beyond it are dropped."""
    if ep > 1:
        return job.moe_load
    if not job.moe_capacity_factor:
        return 1.0
    return job.moe_capacity_factor if job.moe_pad_to_capacity else min(1.0, job.moe_capacity_factor)


def layer_cost(model: ModelSpec, hw: HardwareSpec, job: JobSpec, *, tp: int, cp: int, mbs: int, sp: bool,
               tp_mode: str = "1d", measured: MeasuredOps | None = None, tp_overlap: bool = False, ep: int = 1,
               etp: int = 1, op_memo: dict | None = None) -> LayerCost:
    """Costs of one Transformer layer under one parallel setting; op times from `measured` where it has them.

    An MoE model's layers are of two kinds (dense-first layers, MoE layers). The pipeline partition places
    layers as identical units, so its layer is the model's mean layer, charged in memory for the most MoE
    layers a stage can hold (blend_layers). `op_memo`: op times kept across calls for this GPU
    (compute.memoized_op_time)."""
    if tp_mode != "1d":
        return _grid_layer_cost(model, hw, job, tp=tp, cp=cp, mbs=mbs, tp_mode=tp_mode, measured=measured)
    if not model.is_moe:
        return _layer_cost(model, hw, job, tp=tp, cp=cp, mbs=mbs, sp=sp, measured=measured, tp_overlap=tp_overlap,
                           op_memo=op_memo)
    moe = _layer_cost(model, hw, job, tp=tp, cp=cp, mbs=mbs, sp=sp, measured=measured, tp_overlap=tp_overlap,
                      ep=ep, etp=etp, moe=True, op_memo=op_memo)
    if not model.num_dense_layers:
        return moe
    dense = dense_layer_cost(model, hw, job, tp=tp, cp=cp, mbs=mbs, sp=sp, measured=measured,
                             tp_overlap=tp_overlap, op_memo=op_memo)
    return blend_layers(moe, dense, model.num_dense_layers / model.num_layers, model.moe_layer_freq)


def dense_layer_cost(model: ModelSpec, hw: HardwareSpec, job: JobSpec, *, tp: int, cp: int, mbs: int, sp: bool,
                     measured: MeasuredOps | None = None, tp_overlap: bool = False,
                     op_memo: dict | None = None) -> LayerCost:
    """A layer with a dense MLP (an MoE model's dense-first layers)."""
    return _layer_cost(model, hw, job, tp=tp, cp=cp, mbs=mbs, sp=sp, measured=measured, tp_overlap=tp_overlap,
                       moe=False, op_memo=op_memo)


def moe_layer_cost(model: ModelSpec, hw: HardwareSpec, job: JobSpec, *, tp: int, cp: int, mbs: int, sp: bool,
                   measured: MeasuredOps | None = None, tp_overlap: bool = False, ep: int = 1, etp: int = 1,
                   op_memo: dict | None = None) -> LayerCost:
    """A layer with the MoE MLP (not the mean of an MoE model's dense and MoE layers that layer_cost gives)."""
    return _layer_cost(model, hw, job, tp=tp, cp=cp, mbs=mbs, sp=sp, measured=measured, tp_overlap=tp_overlap,
                       ep=ep, etp=etp, moe=True, op_memo=op_memo)


def blend_layers(moe: LayerCost, dense: LayerCost, w: float, freq: int = 1) -> LayerCost:
    """The mean layer of a model whose layers are a share w dense, 1 - w MoE (times and parameters), with the
    memory a stage is charged per layer and once (LayerCost.memory_params) for its pattern: dense-first layers
    (freq 1) or a periodic pattern of one MoE layer in every `freq`."""
    def mix(a: float, b: float) -> float:
        return (1 - w) * a + w * b

    def mix_pass(a: PassTime, b: PassTime) -> PassTime:
        return PassTime(mix(a.seconds, b.seconds), tuple(mix(x, y) for x, y in zip(a.by_category, b.by_category)),
                        mix(a.flops, b.flops))

    act = LayerActivations(none=max(moe.act.none, dense.act.none), selective=max(moe.act.selective,
                           dense.act.selective), full=max(moe.act.full, dense.act.full))
    selective = -1.0 if moe.selective_s < 0 else mix(moe.selective_s, dense.selective_s)
    return LayerCost(fwd=mix_pass(moe.fwd, dense.fwd), bwd=mix_pass(moe.bwd, dense.bwd),
                     attn_fwd_s=mix(moe.attn_fwd_s, dense.attn_fwd_s), tp_fwd_s=mix(moe.tp_fwd_s, dense.tp_fwd_s),
                     tp_bwd_s=mix(moe.tp_bwd_s, dense.tp_bwd_s), cp_fwd_s=mix(moe.cp_fwd_s, dense.cp_fwd_s),
                     cp_bwd_s=mix(moe.cp_bwd_s, dense.cp_bwd_s), params=round(mix(moe.params, dense.params)),
                     wgrad_s=mix(moe.wgrad_s, dense.wgrad_s), act=act, selective_s=selective,
                     expert_params=round((1 - w) * moe.expert_params),
                     sac_gather_s=mix(moe.sac_gather_s, dense.sac_gather_s),
                     memory_params=math.ceil((moe.params + (freq - 1) * dense.params) / freq),
                     memory_expert_params=math.ceil(moe.expert_params / freq),
                     surplus_params=moe.params - math.ceil((moe.params + (freq - 1) * dense.params) / freq),
                     surplus_expert_params=moe.expert_params - math.ceil(moe.expert_params / freq),
                     dense_params=dense.params, buffers=max(moe.buffers, dense.buffers),
                     ep_hidden_fwd_s=(1 - w) * moe.ep_hidden_fwd_s, ep_hidden_bwd_s=(1 - w) * moe.ep_hidden_bwd_s)


def _layer_cost(model: ModelSpec, hw: HardwareSpec, job: JobSpec, *, tp: int, cp: int, mbs: int, sp: bool,
                measured: MeasuredOps | None = None, tp_overlap: bool = False, ep: int = 1, etp: int = 1,
                moe: bool = False, op_memo: dict | None = None) -> LayerCost:
    """One layer of one kind (dense MLP or mixture of experts)."""
    shape = layer_shape(model, job, tp=tp, cp=cp, mbs=mbs, sp=sp, ep=ep, etp=etp)
    fwd_ops = layer_forward_ops(model, shape, moe)
    bwd_ops = backward_ops(fwd_ops, model, shape)
    attn_fwd = tuple(op for op in fwd_ops if op.category == "attention")
    attn_bwd = tuple(op for op in bwd_ops if op.category == "attention")
    kernel = attention_kernel(job)
    lookup = memoized_op_time(hw, job.dtype, kernel, None if measured is None else measured.lookup(tp, cp), op_memo)
    fwd, bwd = pass_time(fwd_ops, hw, job.dtype, lookup, kernel), pass_time(bwd_ops, hw, job.dtype, lookup, kernel)
    attn_fwd_s = pass_time(attn_fwd, hw, job.dtype, lookup, kernel).seconds
    blocks = 2 if not moe or model.num_shared_experts else 1  # an MoE block without shared experts needs no
    # tensor-parallel collective around its MLP: each rank routes its own sequence-parallel tokens
    tp_fwd, tp_bwd = tp_layer_comm(model, hw, job, shape, fwd_ops, bwd_ops, lookup, tp_overlap, blocks,
                                   memoized_op_time(hw, job.dtype, kernel, None, op_memo))
    hidden = (0.0, 0.0)
    if moe:  # the token exchange counts with the tensor-parallel collectives: both sit on the compute stream
        ep_fwd, ep_bwd = moe_comm(model, hw, shape)
        hidden = hideable_exchange(ep_fwd, ep_bwd, fwd.seconds + bwd.seconds + tp_fwd + tp_bwd)
        tp_fwd, tp_bwd = tp_fwd + ep_fwd, tp_bwd + ep_bwd
    cp_fwd, cp_bwd = cp_exposed(model, hw, shape, cp, job.trainer, attn_fwd_s,
                                pass_time(attn_bwd, hw, job.dtype, lookup, kernel).seconds)
    return LayerCost(
        fwd=fwd, bwd=bwd, attn_fwd_s=attn_fwd_s, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd,
        cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd,  # what the ring attention's steps leave of the exchange (ringattn.py)
        params=moe_layer_params(model, tp, ep, etp) if moe else dense_layer_params(model, tp),
        act=_activations(model, shape, job, moe),
        sac_gather_s=recomputed_gathers_s(model, hw, job, shape, blocks),
        selective_s=_sac_seconds(fwd_ops, hw, job, lookup) if job.trainer == "torchtitan" else -1.0,
        wgrad_s=_wgrad_seconds(bwd_ops, hw, job.dtype, lookup, kernel),
        expert_params=moe_expert_share(model, tp, ep, etp) if moe else 0,
        buffers=tp_overlap_buffers(model, hw, job, shape, tp_overlap) + (deepep_buffer_bytes(model, shape) if moe
                                                                          else 0),
        ep_hidden_fwd_s=hidden[0], ep_hidden_bwd_s=hidden[1])


def _activations(model: ModelSpec, shape: LayerShape, job: JobSpec, moe: bool = False) -> LayerActivations:
    """Saved activations per recompute setting; torchtitan's 'selective' is its op-level SAC. An MoE block
    keeps the attention's tensors, the MLP input and the dispatched tokens' (moe.moe_activation_bytes)."""
    if moe:
        act = layer_activations(replace(model, ffn_hidden_size=0), shape)
        extra = whole_bytes(moe_activation_bytes(model, shape))
        gathered = gathered_input_bytes(model, shape, moe_gathered_blocks(model, shape)) if not regathers_inputs(
            job) else 0
        return replace(act, none=act.none + extra + gathered, selective=act.selective + extra)
    act = layer_activations(model, shape)
    if not regathers_inputs(job):  # without checkpointing the gathered QKV and MLP inputs are what is saved
        act = replace(act, none=act.none + gathered_input_bytes(model, shape))
    if job.trainer == "torchtitan" and model.gated:
        return replace(act, selective=min(act.selective, sac_activations(model, shape)))
    return act


def moe_gathered_blocks(model: ModelSpec, shape: LayerShape) -> int:
    """Inputs an MoE layer saves all-gathered where the trainer saves what it gathers (torchtitan 0.3,
    models/common/moe_sharding.py): the attention's, and the MoE block's when something in it runs on the whole
    sequence. Without EP the block's boundary gathers the tokens for the router and the TP-split experts (and
    the shared experts reuse them); with EP the router and routed experts keep the sequence shard, and only
    shared experts gather theirs."""
    return 1 + (shape.ep == 1 or model.num_shared_experts > 0)


def _sac_seconds(fwd_ops, hw: HardwareSpec, job: JobSpec, lookup) -> float:
    """torchtitan's selective activation checkpointing (op mode, activation_checkpoint.py's _custom_policy):
    it saves the outputs of the compute ops (matmuls, SDPA) "except every second mm" and recomputes the rest,
    so the backward re-runs half the linear GEMMs and every memory-bound op of the forward."""
    kernel = attention_kernel(job)
    gemms = pass_time(tuple(op for op in fwd_ops if op.kernel == "gemm" and op.category == "gemm"), hw, job.dtype,
                      lookup, kernel).seconds
    memory = pass_time(tuple(op for op in fwd_ops if op.kernel == "memory"), hw, job.dtype, lookup, kernel).seconds
    return gemms / 2 + memory


def _wgrad_seconds(bwd_ops, hw: HardwareSpec, dtype: str, lookup, kernel: str) -> float:
    """Time of the weight-gradient GEMMs of a backward op list."""
    return pass_time(tuple(op for op in bwd_ops if op.name.endswith("_wgrad")), hw, dtype, lookup, kernel).seconds


def vocab_cost(model: ModelSpec, hw: HardwareSpec, job: JobSpec, *, tp: int, cp: int, mbs: int, sp: bool,
               measured: MeasuredOps | None = None) -> VocabCost:
    """Costs of the vocabulary layers (vocab-parallel over tp, as in Megatron-LM)."""
    shape = layer_shape(model, job, tp=tp, cp=cp, mbs=mbs, sp=sp)
    lookup = None if measured is None else measured.lookup(tp, cp)
    kernel = attention_kernel(job)  # torchtitan's embedding, head and loss run PyTorch's kernels, not TE's
    link = comm.group_link(hw, tp, 1)
    act_bytes = shape.elem * shape.tokens * model.hidden_size
    if sp:  # reduce-scatter the embedding output; gather the head input, scatter its gradient
        embed_comm = comm.reduce_scatter(act_bytes, tp, link) + comm.all_gather(act_bytes, tp, link)
        head_comm = comm.all_gather(act_bytes, tp, link) + comm.reduce_scatter(act_bytes, tp, link)
    else:
        embed_comm = comm.all_reduce(act_bytes, tp, link)
        head_comm = comm.all_reduce(act_bytes, tp, link)
    # vocab-parallel cross-entropy: all-reduce of the max, the sum of exponentials and the target logit
    head_comm += 3 * comm.all_reduce(FP32_BYTES * shape.tokens, tp, link)
    return VocabCost(
        embed_fwd=pass_time(embedding_forward_ops(model, shape), hw, job.dtype, lookup, kernel),
        embed_bwd=pass_time(embedding_backward_ops(model, shape), hw, job.dtype, lookup, kernel),
        embed_comm_s=embed_comm,
        head_fwd=pass_time(head_forward_ops(model, shape), hw, job.dtype, lookup, kernel),
        head_bwd=pass_time(head_backward_ops(model, shape), hw, job.dtype, lookup, kernel),
        head_comm_s=head_comm,
        embed_params=embedding_params(model, tp),
        head_params=head_params(model, tp, separate_stage=True),
        head_params_shared=head_params(model, tp, separate_stage=False),
        embed_act=embedding_activations(model, shape),
        head_act=head_activations(model, shape),
        head_transient=head_transient(model, shape),
        head_wgrad_s=_wgrad_seconds(head_backward_ops(model, shape), hw, job.dtype, lookup, kernel),
    )


def _grid_layer_cost(model: ModelSpec, hw: HardwareSpec, job: JobSpec, *, tp: int, cp: int, mbs: int,
                     tp_mode: str, measured: MeasuredOps | None = None) -> LayerCost:
    """A 2-D, 2.5-D or 3-D tensor-parallel layer (paper 2). Every device does 1/tp of every operator: the
    micro-batch's token rows are split act_split ways and heads/widths q ways, which is the 1-D layer with tp=q
    and sequence parallelism on mbs/act_split sequences; communication, parameters and activations are the
    mode's own (costmodel/tpmodes.py)."""
    grid = tp_mode_degrees(tp_mode, tp)
    local = layer_cost(model, hw, job, tp=grid.q, cp=cp, mbs=mbs // grid.act_split, sp=True, measured=measured)
    tokens, seq = mbs * job.seq_len // cp, job.seq_len // cp
    comm_s = layer_tp_comm_s(tp_mode, model, hw, tp=tp, tokens=tokens, elem=ACTIVATION_BYTES)
    mem = layer_tp_memory(tp_mode, model, tp=tp, tokens=tokens, elem=ACTIVATION_BYTES, seq_len=seq,
                          flash=job.flash_attention)
    gathered = mem.gathered_act_bytes + mem.saved_weight_bytes  # 3-D keeps gathered inputs and weights
    act = LayerActivations(none=local.act.none + gathered, selective=local.act.selective + gathered,
                           full=local.act.full)
    return replace(local, tp_fwd_s=comm_s.fwd_s, tp_bwd_s=comm_s.bwd_s, params=mem.params, act=act,
                   sac_gather_s=0.0)
