"""A mixture-of-experts block on one GPU: router, token permutation, grouped expert GEMMs, the all-to-all
dispatch and combine over the expert-parallel group, and the activations the dispatched tokens keep.

Layout (Megatron-Core's MoE layer with the alltoall token dispatcher, moe/token_dispatcher.py): attention runs
with tp and sequence parallelism, so each GPU routes its tn = T/tp tokens; each token goes to top_k of the E
experts; the GPU sends those tn*k token copies to the ep ranks holding the experts (all-to-all), the etp ranks
of an expert all-gather them (expert tensor parallelism), re-sort them from source-rank order into expert
order, run the E/ep local experts as one grouped GEMM on 1/etp of the expert width, and the reverse path (reduce-scatter, all-to-all, un-permute weighted by the router
probabilities) combines the results. With balanced routing every GPU receives R = etp*tn*k token copies; the
busiest GPU receives `imbalance` times that and the all-to-all waits for it.
"""

from __future__ import annotations

from autotune.costmodel import comm
from autotune.costmodel.ops import LayerShape, Op, _activation, _gemm, _memory_op
from autotune.specs.hardware import HardwareSpec
from autotune.specs.model import ModelSpec
from autotune.units import FP32_BYTES

#: Load imbalance of balanced routing: published MoE throughput benchmarks force it (Megatron-Bridge's
#: performance summary: "force-balanced routing, token-dropless"; --moe-router-force-load-balancing).
BALANCED_IMBALANCE = 1.0
#: The stated default for real (learned) routing with an auxiliary balancing loss or bias (JobSpec.moe_imbalance's
#: default): the busiest expert
#: gets 1.25x the mean, the capacity factor GShard (Lepikhin et al. 2020) and Switch Transformer (Fedus et al.
#: 2021, Sec. 2.2, capacity factor 1.25 in their evaluation) size expert buffers with. Dropless routing makes
#: no buffer, so this is the load the slowest rank carries, not a cap.
ROUTED_IMBALANCE = 1.25
#: Bytes of one token count (torch.long) in the dispatcher's tokens-per-expert tensors.
COUNT_BYTES = 8


def routed_tokens(shape: LayerShape) -> float:
    """Tokens each GPU routes: its sequence-parallel share of the micro-batch (all of it with tp 1)."""
    return shape.norm_tokens


def received_tokens(model: ModelSpec, shape: LayerShape) -> float:
    """Token copies the busiest GPU's experts process: imbalance * etp * tn * top_k."""
    return shape.imbalance * shape.etp * routed_tokens(shape) * model.moe_top_k


def moe_forward_ops(model: ModelSpec, shape: LayerShape) -> list[Op]:
    """The MoE block's forward operators after the post-attention norm (which the caller emits)."""
    e, h, experts, k = shape.elem, model.hidden_size, model.num_experts, model.moe_top_k
    tn = routed_tokens(shape)
    local = experts // shape.ep
    r = received_tokens(model, shape)
    f = model.moe_ffn_hidden_size / shape.etp
    up = 2 * f if model.gated else f
    ops = [
        # router logits: tn x h @ h x E; kept out of the "gemm" category so FP8 runs it in bf16 (as Megatron does)
        Op("router", "elementwise", 2.0 * tn * h * experts, e * (tn * h + h * experts + tn * experts), "gemm",
           (tn, experts, h)),
        # softmax/sigmoid and top-k in fp32: read the logits, write the scores, read them for the top-k,
        # write k probabilities and indices
        _memory_op("router_topk", "elementwise", 5.0 * tn * experts,
                   tn * experts * (e + 2 * FP32_BYTES) + tn * k * 2 * FP32_BYTES),
        # permute: gather each token k times into expert order (read k copies, write k copies)
        _memory_op("permute", "elementwise", 0.0, 2.0 * e * tn * k * h),
    ]
    ops.extend(sort_by_expert_ops("sort_by_expert", shape, r, h, local, with_probs=True))
    ops.append(Op("expert_up", "gemm", 2.0 * r * h * up, e * (r * h + local * h * up + r * up), "gemm",
                  (r / local, up, h), local))
    ops.extend(_activation(model, shape, r, f))
    ops.append(Op("expert_down", "gemm", 2.0 * r * f * h, e * (r * f + local * f * h + r * h), "gemm",
                  (r / local, h, f), local))
    if model.expert_bias:
        ops.extend(expert_bias_ops(shape, r, h, local))
    ops.extend(sort_by_expert_ops("unsort_by_expert", shape, r, h, local, with_probs=False))
    # un-permute: scale each copy by its router probability and sum the k copies back into token order
    ops.append(_memory_op("unpermute", "elementwise", 2.0 * tn * k * h, 2.0 * e * tn * k * h + e * tn * h))
    if model.num_shared_experts:
        width = model.num_shared_experts * model.shared_expert_ffn_hidden_size / shape.tp
        ops.append(_gemm("shared_up", shape.tokens, h, 2 * width if model.gated else width, e))
        ops.extend(_activation(model, shape, shape.tokens, width))
        ops.append(_gemm("shared_down", shape.tokens, width, h, e))
    return ops


def sort_by_expert_ops(name: str, shape: LayerShape, r: float, h: int, local: int, with_probs: bool) -> list[Op]:
    """Megatron's alltoall dispatcher's second permutation (megatron-core 0.16 moe/token_dispatcher.py,
    dispatch_postprocess and combine_preprocess, dropless path): the all-to-all delivers the r token copies
    grouped by source rank, so with more than one local expert they are re-sorted into expert order
    (sort_chunks_by_idxs: read and write r x h, plus the fp32 probabilities on the dispatch side) before the
    grouped GEMM, and sorted back after it. One local expert needs neither."""
    if local <= 1:
        return []
    nbytes = 2.0 * shape.elem * r * h + (2.0 * FP32_BYTES * r if with_probs else 0.0)
    return [_memory_op(name, "elementwise", 0.0, nbytes)]


def expert_bias_ops(shape: LayerShape, r: float, h: int, local: int) -> list[Op]:
    """The down projection's per-expert bias, weighted by the router probability (GPT-OSS's experts carry
    biases). Transformer Engine's grouped GEMM returns it unapplied, so Megatron adds it in PyTorch
    (megatron-core 0.16 moe/experts.py, TEGroupedMLP._apply_bias): for each local expert `t + b * p` on that
    expert's r/local rows (two kernels: b * p writes a rows x h tensor, the add reads it and t and writes
    the sum) and one torch.cat of the results (reads and writes all r x h). Not fused, so these are
    2 * local + 1 memory-bound kernels, each paying its launch."""
    e, rows = shape.elem, r / local
    ops: list[Op] = []
    for i in range(local):
        ops.append(_memory_op(f"expert_bias_mul_{i}", "elementwise", rows * h, e * rows * h))
        ops.append(_memory_op(f"expert_bias_add_{i}", "elementwise", rows * h, 3.0 * e * rows * h))
    ops.append(_memory_op("expert_bias_cat", "elementwise", 0.0, 2.0 * e * r * h))
    return ops


def moe_comm(model: ModelSpec, hw: HardwareSpec, shape: LayerShape) -> tuple[float, float]:
    """(forward, backward) seconds of the token exchange, exposed (Megatron runs it on the compute stream):
    dispatch and combine all-to-alls over the ep group (expert ranks are numbered etp-fastest, so the group's
    stride is etp) and, with etp > 1, an all-gather after dispatch and a reduce-scatter before combine. The
    backward sends the gradients the same way back. Before the dispatch the forward all-gathers every rank's
    tokens-per-expert counts (int64, E per rank) over the etp*ep group so each rank knows its receive splits
    (megatron-core 0.16 token_dispatcher.py, preprocess, ep > 1): a small, latency-bound collective."""
    d = shape.elem * routed_tokens(shape) * model.moe_top_k * model.hidden_size
    sent = shape.imbalance * d  # the busiest GPU receives (and later returns) imbalance x the mean
    a2a = comm.all_to_all(sent, shape.ep, comm.group_link(hw, shape.ep, shape.etp)) if shape.ep > 1 else 0.0
    etp = 0.0
    if shape.etp > 1:
        link = comm.group_link(hw, shape.etp, 1)
        etp = comm.all_gather(shape.etp * sent, shape.etp, link) + comm.reduce_scatter(shape.etp * sent, shape.etp,
                                                                                      link)
    one_pass = 2 * a2a + etp
    counts = 0.0
    if shape.ep > 1:
        group = shape.ep * shape.etp
        counts = comm.all_gather(group * model.num_experts * COUNT_BYTES, group, comm.group_link(hw, group, 1))
    return one_pass + counts, one_pass


def moe_activation_bytes(model: ModelSpec, shape: LayerShape) -> float:
    """What an MoE block keeps for its backward beyond the block input and norm outputs: the router's fp32
    probabilities, the permuted expert inputs, the expert activation's input, the down-projection's input and
    the expert outputs the probability weighting needs (all on the R token copies the busiest GPU received),
    plus the shared experts' intermediate tensors."""
    e, h = shape.elem, model.hidden_size
    g = 1 if shape.fp8 else e
    tn, r = routed_tokens(shape), received_tokens(model, shape)
    f = model.moe_ffn_hidden_size / shape.etp
    up = 2 * f if model.gated else f
    out = FP32_BYTES * tn * model.num_experts + g * r * h + e * r * up + g * r * f + e * r * h
    if model.num_shared_experts:
        width = model.num_shared_experts * model.shared_expert_ffn_hidden_size / shape.tp
        out += e * shape.tokens * (2 * width if model.gated else width) + g * shape.tokens * width
    return out
