"""Per-micro-batch costs of one Transformer layer and of the vocabulary layers for one (tp, cp, mbs, sp).

These are the building blocks every stage is made of; the planner precomputes them once per setting and
assembles stages from them, so a whole estimate costs a few dozen arithmetic operations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autotune.costmodel import comm
from autotune.costmodel.compute import PassTime, pass_time
from autotune.costmodel.memory import (LayerActivations, embedding_activations, embedding_params, head_activations,
                                       head_params, head_transient, layer_activations, layer_params)
from autotune.costmodel.ops import (LayerShape, backward_ops, embedding_backward_ops, embedding_forward_ops,
                                    head_backward_ops, head_forward_ops, layer_forward_ops)
from autotune.costmodel.tpmodes import layer_tp_comm_s, layer_tp_memory
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.tpgrid import tp_mode_degrees
from autotune.units import ACTIVATION_BYTES, FP32_BYTES

if TYPE_CHECKING:  # measured.py imports ops and specs only, but layer need not load numpy tables to type it
    from autotune.costmodel.measured import MeasuredOps


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One Transformer layer, one micro-batch, one GPU."""

    fwd: PassTime
    bwd: PassTime
    attn_fwd_s: float
    """Core-attention forward: what selective recomputation runs again."""
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
        """Extra forward work the backward pays: core attention (selective) or the whole layer (full)."""
        if recompute == "selective":
            return self.attn_fwd_s
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

    @property
    def embed_time(self) -> float:
        return self.embed_fwd.seconds + self.embed_bwd.seconds + self.embed_comm_s

    @property
    def head_time(self) -> float:
        return self.head_fwd.seconds + self.head_bwd.seconds + self.head_comm_s


def layer_shape(model: ModelSpec, job: JobSpec, *, tp: int, cp: int, mbs: int, sp: bool) -> LayerShape:
    """Per-GPU sizes of one micro-batch."""
    return LayerShape(tokens=mbs * job.seq_len // cp, kv_tokens=mbs * job.seq_len, mbs=mbs, tp=tp, sp=sp,
                      elem=ACTIVATION_BYTES, flash=job.flash_attention, fused=job.fused_kernels)


def layer_cost(model: ModelSpec, hw: HardwareSpec, job: JobSpec, *, tp: int, cp: int, mbs: int, sp: bool,
               tp_mode: str = "1d", measured: MeasuredOps | None = None) -> LayerCost:
    """Costs of one Transformer layer under one parallel setting; op times from `measured` where it has them."""
    if tp_mode != "1d":
        return _grid_layer_cost(model, hw, job, tp=tp, cp=cp, mbs=mbs, tp_mode=tp_mode, measured=measured)
    shape = layer_shape(model, job, tp=tp, cp=cp, mbs=mbs, sp=sp)
    fwd_ops = layer_forward_ops(model, shape)
    bwd_ops = backward_ops(fwd_ops, model, shape)
    attn_fwd = tuple(op for op in fwd_ops if op.category == "attention")
    attn_bwd = tuple(op for op in bwd_ops if op.category == "attention")
    lookup = None if measured is None else measured.lookup(tp)
    fwd, bwd = pass_time(fwd_ops, hw, job.dtype, lookup), pass_time(bwd_ops, hw, job.dtype, lookup)
    attn_fwd_s = pass_time(attn_fwd, hw, job.dtype, lookup).seconds
    tp_pass = _tp_layer_comm(model, hw, shape)
    cp_fwd, cp_bwd = _cp_exchange(model, hw, shape, cp)
    return LayerCost(
        fwd=fwd, bwd=bwd, attn_fwd_s=attn_fwd_s, tp_fwd_s=tp_pass, tp_bwd_s=tp_pass,
        cp_fwd_s=max(0.0, cp_fwd - attn_fwd_s),
        cp_bwd_s=max(0.0, cp_bwd - pass_time(attn_bwd, hw, job.dtype, lookup).seconds),
        params=layer_params(model, tp), act=layer_activations(model, shape),
        wgrad_s=_wgrad_seconds(bwd_ops, hw, job.dtype, lookup))


def _wgrad_seconds(bwd_ops, hw: HardwareSpec, dtype: str, lookup=None) -> float:
    """Time of the weight-gradient GEMMs of a backward op list."""
    return pass_time(tuple(op for op in bwd_ops if op.name.endswith("_wgrad")), hw, dtype, lookup).seconds


def _tp_layer_comm(model: ModelSpec, hw: HardwareSpec, shape: LayerShape) -> float:
    """Megatron's two collectives per pass (after attention and after the MLP; Shoeybi et al. 2019). With
    sequence parallelism each all-reduce becomes an all-gather before and a reduce-scatter after the block
    (Korthikanti et al. 2022): the same bytes on the wire, twice the latency steps."""
    if shape.tp == 1:
        return 0.0
    nbytes = shape.elem * shape.tokens * model.hidden_size
    link = comm.group_link(hw, shape.tp, 1)
    if shape.sp:
        return 2 * (comm.all_gather(nbytes, shape.tp, link) + comm.reduce_scatter(nbytes, shape.tp, link))
    return 2 * comm.all_reduce(nbytes, shape.tp, link)


def _cp_exchange(model: ModelSpec, hw: HardwareSpec, shape: LayerShape, cp: int) -> tuple[float, float]:
    """Ring attention: cp-1 point-to-point steps passing this rank's K and V chunk on (forward); the
    backward also passes dK and dV, twice the bytes (Liu et al. 2023; Megatron's context parallelism)."""
    if cp == 1:
        return 0.0, 0.0
    kv_bytes = 2 * shape.elem * shape.tokens * model.kv_width / shape.tp
    link = comm.group_link(hw, cp, shape.tp)
    step = comm.p2p(kv_bytes, link)
    return (cp - 1) * step, 2 * (cp - 1) * step


def vocab_cost(model: ModelSpec, hw: HardwareSpec, job: JobSpec, *, tp: int, cp: int, mbs: int, sp: bool,
               measured: MeasuredOps | None = None) -> VocabCost:
    """Costs of the vocabulary layers (vocab-parallel over tp, as in Megatron-LM)."""
    shape = layer_shape(model, job, tp=tp, cp=cp, mbs=mbs, sp=sp)
    lookup = None if measured is None else measured.lookup(tp)
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
        embed_fwd=pass_time(embedding_forward_ops(model, shape), hw, job.dtype, lookup),
        embed_bwd=pass_time(embedding_backward_ops(model, shape), hw, job.dtype, lookup),
        embed_comm_s=embed_comm,
        head_fwd=pass_time(head_forward_ops(model, shape), hw, job.dtype, lookup),
        head_bwd=pass_time(head_backward_ops(model, shape), hw, job.dtype, lookup),
        head_comm_s=head_comm,
        embed_params=embedding_params(model, tp),
        head_params=head_params(model, tp, separate_stage=True),
        head_params_shared=head_params(model, tp, separate_stage=False),
        embed_act=embedding_activations(model, shape),
        head_act=head_activations(model, shape),
        head_transient=head_transient(model, shape),
        head_wgrad_s=_wgrad_seconds(head_backward_ops(model, shape), hw, job.dtype, lookup),
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
    return replace(local, tp_fwd_s=comm_s.fwd_s, tp_bwd_s=comm_s.bwd_s, params=mem.params, act=act)
