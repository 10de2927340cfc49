"""Multi-token prediction (MTP; DeepSeek-V3 technical report, arXiv 2412.19437, section 2.2; Megatron-Core
transformer/multi_token_prediction.py).

Each MTP module predicts one token further from the last layer's output: it embeds the shifted tokens, runs
enorm and hnorm on the embedding and on the hidden states, projects their concatenation 2h -> h (eh_proj, a
column-parallel linear whose output is gathered over the tensor-parallel group and scattered back to the
sequence-parallel layout), runs one Transformer layer, then its final norm, the shared LM head and its own
cross-entropy. Megatron runs every module on the last pipeline stage, which also keeps a copy of the input
embedding for them. So the cost model folds the modules into the output block (VocabCost's head): the stage
that closes the model pays for them in time and memory, and the planner's partition gives it fewer decoder
layers, as Megatron-Bridge's DeepSeek-V3 layouts do (a last stage of one decoder layer, the MTP module and the
loss).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.costmodel import comm
from autotune.costmodel.compute import PassTime, pass_time
from autotune.costmodel.layer import LayerCost, VocabCost
from autotune.costmodel.memory import (dense_layer_params, embedding_activations, embedding_params, head_activations,
                                       layer_params, moe_layer_params)
from autotune.costmodel.ops import (LayerShape, Op, _gemm, _memory_op, _norm, backward_ops, embedding_backward_ops,
                                    embedding_forward_ops, head_backward_ops, head_forward_ops)
from autotune.specs.hardware import HardwareSpec
from autotune.specs.model import ModelSpec


def mtp_forward_ops(model: ModelSpec, shape: LayerShape) -> tuple[Op, ...]:
    """One module's operators besides its Transformer layer: the embedding of the shifted tokens, the two
    norms and their concatenation (sequence-parallel: on T/tp tokens), eh_proj (T x 2h -> h/tp), then the
    final norm, the LM head and the cross-entropy."""
    t, e, h, n = shape.tokens, shape.elem, model.hidden_size, shape.norm_tokens
    return (*embedding_forward_ops(model, shape),
            _norm("mtp_enorm", model, n, h, e, shape.fused), _norm("mtp_hnorm", model, n, h, e, shape.fused),
            _memory_op("mtp_concat", "elementwise", 0.0, 4.0 * e * n * h),
            _gemm("mtp_eh_proj", t, 2 * h, h / shape.tp, e),
            *head_forward_ops(model, shape))


def mtp_backward_ops(model: ModelSpec, shape: LayerShape) -> tuple[Op, ...]:
    """The backward of mtp_forward_ops: the cross-entropy and head gradients, eh_proj's two GEMMs, the norms',
    and the embedding's scatter-add."""
    forward = mtp_forward_ops(model, shape)
    lookup = len(embedding_forward_ops(model, shape))
    middle = forward[lookup:lookup + 4]
    return (*head_backward_ops(model, shape), *backward_ops(middle[::-1], model, shape),
            *embedding_backward_ops(model, shape))


def eh_proj_comm_s(model: ModelSpec, hw: HardwareSpec, shape: LayerShape) -> tuple[float, float]:
    """(forward, backward) seconds of eh_proj's tensor-parallel collectives: with sequence parallelism the
    column-parallel linear gathers its 2h-wide input and reduce-scatters that gradient, and the output is
    gathered over tp in the forward and again (the sequence-parallel scatter's gradient) in the backward;
    without it, the output gather forward and the input gradient's all-reduce backward."""
    if shape.tp == 1:
        return 0.0, 0.0
    link = comm.group_link(hw, shape.tp, 1)
    out = shape.elem * shape.tokens * model.hidden_size
    if shape.sp:
        return (comm.all_gather(2 * out, shape.tp, link) + comm.all_gather(out, shape.tp, link),
                comm.reduce_scatter(2 * out, shape.tp, link) + comm.all_gather(out, shape.tp, link))
    return comm.all_gather(out, shape.tp, link), comm.all_reduce(2 * out, shape.tp, link)


def mtp_params(model: ModelSpec, tp: int = 1) -> int:
    """One module's parameters besides its Transformer layer: enorm, hnorm, eh_proj and the final norm (the
    LM head is the model's)."""
    norm = model.hidden_size * (2 if model.norm == "layernorm" else 1)
    return 3 * norm + 2 * model.hidden_size * model.hidden_size // tp


@dataclass(frozen=True, slots=True)
class MtpPasses:
    """One module's costs besides its Transformer layer, for one (tp, cp, mbs, sp)."""

    fwd: PassTime
    bwd: PassTime
    wgrad_s: float
    """The weight-gradient GEMMs inside bwd (eh_proj's and the LM head's)."""
    comm_s: float
    """eh_proj's collectives, forward and backward."""


def mtp_passes(model: ModelSpec, hw: HardwareSpec, dtype: str, shape: LayerShape, lookup=None,
               kernel: str = "fused") -> MtpPasses:
    backward = mtp_backward_ops(model, shape)
    wgrad = tuple(op for op in backward if op.name.endswith("_wgrad"))
    return MtpPasses(fwd=pass_time(mtp_forward_ops(model, shape), hw, dtype, lookup, kernel),
                     bwd=pass_time(backward, hw, dtype, lookup, kernel),
                     wgrad_s=pass_time(wgrad, hw, dtype, lookup, kernel).seconds,
                     comm_s=sum(eh_proj_comm_s(model, hw, shape)))


def _plus(a: PassTime, b: PassTime, k: float = 1.0) -> PassTime:
    return PassTime(a.seconds + k * b.seconds, tuple(x + k * y for x, y in zip(a.by_category, b.by_category)),
                    a.flops + k * b.flops)


def _scaled(a: PassTime, seconds: float) -> PassTime:
    """`seconds` of work spread over a's categories in a's proportions (recomputation of a's forward)."""
    k = seconds / a.seconds if a.seconds > 0 else 0.0
    return PassTime(seconds, tuple(k * y for y in a.by_category), k * a.flops)


def with_mtp(vocab: VocabCost, passes: MtpPasses, layer: LayerCost, model: ModelSpec, shape: LayerShape,
             recompute: str) -> VocabCost:
    """The output block with the model's MTP modules folded in. `passes`: mtp_passes at this (tp, cp, mbs, sp);
    `layer`: an MTP module's Transformer layer at the plan's setting (the model's last-layer kind);
    `recompute`: the plan's base recomputation, which Megatron applies to the MTP layers too (their
    activations, and the extra forward in the backward)."""
    k = model.mtp_layers
    if not k:
        return vocab
    rec = layer.recompute_time(recompute)
    rec_compute = min(rec, layer.fwd.seconds)  # full recomputation also re-runs the forward's collectives
    module_comm = vocab.embed_comm_s + vocab.head_comm_s + passes.comm_s + layer.comm_time + rec - rec_compute
    own = mtp_params(model, shape.tp) + layer.params
    # a last stage of its own embeds the shifted tokens itself, in a table of its own: megatron-core's GPTModel
    # builds the embedding wherever MTP runs, and the output layer skips its weight only on the first stage
    # (skip_weight_param_allocation = pre_process and tied), so a tied model holds two tables there too
    table = embedding_params(model, shape.tp)
    acts = (layer.act.get(recompute) + embedding_activations(model, shape) + head_activations(model, shape)
            + 4 * shape.elem * shape.norm_tokens * model.hidden_size)  # the two norm inputs and the concatenation
    return replace(
        vocab,
        head_fwd=_plus(vocab.head_fwd, _plus(passes.fwd, layer.fwd), k),
        head_bwd=_plus(vocab.head_bwd, _plus(_plus(passes.bwd, layer.bwd), _scaled(layer.fwd, rec_compute)), k),
        head_comm_s=vocab.head_comm_s + k * module_comm,
        head_params=vocab.head_params + k * own + table,
        head_params_shared=vocab.head_params_shared + k * own,
        head_expert_params=k * layer.expert_params,
        head_act=vocab.head_act + k * acts,
        head_wgrad_s=vocab.head_wgrad_s + k * (passes.wgrad_s + layer.wgrad_s))


def mtp_total_params(model: ModelSpec) -> int:
    """Parameters of all MTP modules (their LM head and input embedding are the model's own): what DeepSeek's
    685B checkpoint holds beyond the 671B main model, less its copies of the embedding and the head."""
    if not model.is_moe:
        layer = layer_params(model)
    else:
        layer = moe_layer_params(model) if model.is_moe_layer(model.num_layers - 1) else dense_layer_params(model)
    return model.mtp_layers * (mtp_params(model) + layer)
