"""A mixture-of-experts block on one GPU: router, token permutation, grouped expert GEMMs, the all-to-all
dispatch and combine over the expert-parallel group, and the activations the dispatched tokens keep.

Layout (Megatron-Core's MoE layer with the alltoall token dispatcher, moe/token_dispatcher.py): attention runs
with tp and sequence parallelism, so each GPU routes its tn = T/tp tokens; each token goes to top_k of the E
experts; the GPU sends those tn*k token copies to the ep ranks holding the experts (all-to-all), the etp ranks
of an expert all-gather them (expert tensor parallelism), re-sort them from source-rank order into expert
order, run the E/ep local experts as one grouped GEMM on 1/etp of the expert width (the router probabilities
multiplied in by the activation), and the reverse path (reduce-scatter, all-to-all, un-permute) combines the
results. With balanced routing every GPU receives R = etp*tn*k token copies; the
busiest GPU receives `imbalance` times that and the all-to-all waits for it.
"""

from __future__ import annotations

from autotune.costmodel import comm
from autotune.costmodel.ops import LayerShape, Op, _activation, _gemm, _memory_op
from autotune.specs.hardware import HardwareSpec
from autotune.specs.model import ModelSpec
from autotune.specs.experts import DEEPEP_NVL_PEERS
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
    ]
    deepep = uses_deepep(shape)
    if deepep:
        # DeepEP delivers each token once per GPU holding its experts; the flex dispatcher then gathers the
        # received rows into expert order, probabilities alongside (megatron-core 0.16 token_dispatcher.py,
        # _DeepepManager.get_permuted_hidden_states_by_experts: an index_select of r rows, read and written)
        u = delivered_rows(model, shape)
        ops.append(_memory_op("permute_by_experts", "elementwise", 0.0, 2.0 * e * r * h + 2.0 * FP32_BYTES * r))
    else:
        # permute: gather each token k times into expert order (read k copies, write k copies)
        ops.append(_memory_op("permute", "elementwise", 0.0, 2.0 * e * tn * k * h))
        ops.extend(sort_by_expert_ops("sort_by_expert", shape, r, h, local, with_probs=True))
    ops.append(Op("expert_up", "gemm", 2.0 * r * h * up, e * (r * h + local * h * up + r * up), "gemm",
                  (r / local, up, h), local))
    ops.extend(clamp_ops(model, shape, r, f))
    # the router probabilities are applied here, inside the (fused) activation, not at the un-permute
    ops.extend(_activation(model, shape, r, f))
    ops.append(Op("expert_down", "gemm", 2.0 * r * f * h, e * (r * f + local * f * h + r * h), "gemm",
                  (r / local, h, f), local))
    if model.expert_bias:
        ops.extend(expert_bias_ops(shape, r, h, local))
    if deepep:
        # the rows summed back per delivered token (get_restored_hidden_states_by_experts: a scatter-add of the
        # r rows into u zeroed rows); DeepEP's combine kernel adds the GPUs' partial sums (and the etp shards')
        # into token order itself
        ops.append(_memory_op("unpermute_by_experts", "elementwise", r * h, e * (2.0 * r + 2.0 * u) * h))
    else:
        ops.extend(sort_by_expert_ops("unsort_by_expert", shape, r, h, local, with_probs=False))
        ops.extend(expert_tp_cast_ops(shape, r, h))
        # un-permute: sum the k copies back into token order. No probability weighting here: megatron-core
        # 0.16 moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher.combine_postprocess calls unpermute without
        # probs, as TEGroupedMLP.forward (moe/experts.py) has already multiplied them into the activation output
        ops.append(_memory_op("unpermute", "elementwise", tn * k * h, 2.0 * e * tn * k * h + e * tn * h))
    if model.num_shared_experts:
        width = model.num_shared_experts * model.shared_expert_ffn_hidden_size / shape.tp
        ops.append(_gemm("shared_up", shape.tokens, h, 2 * width if model.gated else width, e))
        ops.extend(_activation(model, shape, shape.tokens, width))
        ops.append(_gemm("shared_down", shape.tokens, width, h, e))
    return ops


def clamps_glu(model: ModelSpec) -> bool:
    """Whether the experts clamp their gated unit: ModelSpec.glu_clamp > 0 (GPT-OSS: Hugging Face
    swiglu_limit 7.0, Megatron activation_func_clamp_value 7). The limit's value changes no cost."""
    return model.glu_clamp > 0 and model.gated


def clamp_ops(model: ModelSpec, shape: LayerShape, r: float, f: float) -> list[Op]:
    """The clamp before a clamped gated unit, which runs outside the fused activation kernel (megatron-core
    0.16 fusions/fused_bias_geglu.py, weighted_bias_quick_geglu_impl with clamp_value): fc1's output is
    chunked in two, each half clamped (x_glu to max, x_linear to [-max, max]; each reads and writes r x f) and
    the halves concatenated again (reads and writes r x 2f): three memory-bound kernels on the r received
    token copies. Without a clamp, nothing."""
    if not clamps_glu(model):
        return []
    e, n = shape.elem, r * f
    return [_memory_op("expert_clamp_glu", "elementwise", n, 2.0 * e * n),
            _memory_op("expert_clamp_linear", "elementwise", 2.0 * n, 2.0 * e * n),
            _memory_op("expert_clamp_cat", "elementwise", 0.0, 4.0 * e * n)]


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


def expert_tp_cast_ops(shape: LayerShape, r: float, h: int) -> list[Op]:
    """With etp > 1 the combine reduce-scatters the expert outputs in the probabilities' dtype (fp32) and
    casts the result back (megatron-core 0.16 moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher.
    combine_preprocess: `reduce_scatter_to_sequence_parallel_region(hidden_states.to(self.probs.dtype))
    .to(hidden_states.dtype)`): a cast of the r rows up to fp32 and of the r/etp reduced rows back. With
    etp 1 the casts are skipped."""
    if shape.etp <= 1:
        return []
    e = shape.elem
    return [_memory_op("combine_cast_fp32", "elementwise", 0.0, (e + FP32_BYTES) * r * h),
            _memory_op("combine_cast_back", "elementwise", 0.0, (e + FP32_BYTES) * r / shape.etp * h)]


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


def uses_deepep(shape: LayerShape) -> bool:
    """Whether the token exchange runs DeepEP's kernels: asked for, and there is an exchange (Megatron's flex
    dispatcher needs etp*ep > 1)."""
    return shape.dispatcher == "deepep" and shape.ep * shape.etp > 1


#: DeepEP 1.0.0's chunked receive tokens per channel and rank of its default configs (deep_ep/buffer.py,
#: get_dispatch_config / get_combine_config: 256 up to 8 ranks, then 288 up to 64, 560 at 128, 720 beyond), by the
#: largest group each applies to; and megatron-core 0.16's moe_deepep_num_sms 20, two SMs a channel
DEEPEP_RECV_TOKENS = ((8, 256), (64, 288), (128, 560), (1 << 30, 720))
DEEPEP_CHANNELS = 20 // 2


def deepep_buffer_bytes(model: ModelSpec, shape: LayerShape) -> int:
    """DeepEP's NVLink buffer, which Megatron allocates once (megatron-core fused_a2a.get_buffer): at least what
    its intranode dispatch asserts it holds (deep_ep 1.0.0 csrc/deep_ep.cpp, Buffer::intranode_dispatch): per
    channel, NVLink rank (a node's, at most 8) and received token, the token (Megatron's hidden bytes: 2 per
    element), its source index and its top-k indices and weights. The internode RDMA buffer, sized by a hint in a
    header the sdist lacks, is not counted (ep > 8 holds more)."""
    if not uses_deepep(shape):
        return 0
    recv = next(tokens for most, tokens in DEEPEP_RECV_TOKENS if shape.ep * shape.etp <= most)
    per_token = 2 * model.hidden_size + 4 + model.moe_top_k * (8 + 4)
    return DEEPEP_CHANNELS * min(shape.ep * shape.etp, 8) * recv * per_token


def groups_hit(experts: int, top_k: int, groups: int) -> float:
    """Expected number of `groups` equal groups of experts that a token's top_k distinct experts fall in, with
    every set of top_k experts equally likely (balanced routing): groups * (1 - C(E - E/groups, k) / C(E, k)),
    the hypergeometric chance that a group holds none of them, taken away from one."""
    if groups <= 1:
        return 1.0
    held, miss = experts / groups, 1.0
    for i in range(top_k):
        miss *= max(0.0, experts - held - i) / (experts - i)
    return groups * (1.0 - miss)


def parts_hit(model: ModelSpec, parts: int) -> float:
    """Expected number of `parts` equal consecutive shares of the experts (the GPUs or the nodes of the expert-
    parallel group) a token's experts fall in. Group-limited routing (DeepSeek-V3: 8 groups, a token's experts
    from at most 4) draws them from its chosen groups only: where each group spans whole shares, the top-k
    experts fall among the chosen groups' shares; where a share holds whole groups, the chosen groups fall among
    the shares (each holding one of the experts, an upper bound); groups straddling shares bound nothing."""
    experts, k, groups, chosen = model.num_experts, model.moe_top_k, model.moe_router_groups, \
        model.moe_router_group_topk
    if groups <= 1 or not chosen or parts <= 1:
        return groups_hit(experts, k, parts)
    free = groups_hit(experts, k, parts)
    if parts % groups == 0:
        per_group = parts // groups
        return min(free, groups_hit(experts * chosen // groups, k, chosen * per_group))
    if groups % parts == 0:
        return min(free, groups_hit(groups, chosen, parts))
    return free


def delivered_rows(model: ModelSpec, shape: LayerShape) -> float:
    """Token rows DeepEP delivers to the busiest GPU: a token goes once to each GPU holding one of its experts
    (not once per expert, as the alltoall dispatcher sends), to all etp shards of each such expert group."""
    return shape.imbalance * routed_tokens(shape) * shape.etp * parts_hit(model, shape.ep)


#: NVIDIA compute capabilities (major) DeepEP runs on: Ampere, Hopper, Blackwell B200/B300, the GPUs on which
#: Megatron-Bridge 0.3.1 turns it on (training/flex_dispatcher_backend.py skips it elsewhere)
DEEPEP_COMPUTE_CAPABILITIES = (8, 9, 10)


def deepep_refusal(hw: HardwareSpec) -> str:
    """Why DeepEP's kernels cannot run on this GPU ("": they can). A GPU file without a compute capability is
    taken at its word. Which expert groups it runs over is a layout rule of each plan
    (specs.plan.deepep_group_issue)."""
    major = hw.compute_capability.split(".")[0]
    if hw.compute_capability and not (major.isdigit() and int(major) in DEEPEP_COMPUTE_CAPABILITIES):
        return (f"DeepEP runs on NVIDIA GPUs of compute capability 8.x-10.x (Ampere, Hopper, Blackwell), not "
                f"{hw.name} ({hw.compute_capability})")
    return ""


def deepep_exchange(model: ModelSpec, hw: HardwareSpec, shape: LayerShape, dispatch: bool = True) -> float:
    """Seconds of one DeepEP dispatch or combine (the same rows travel back) over the etp*ep group
    (deepseek-ai/DeepEP, normal kernels, as megatron-core 0.16's flex dispatcher calls them: moe/fused_a2a.py).
    A dispatched row carries the hidden state plus the token's indices (int64) and weights (fp32) over the
    etp*k virtual experts the flex dispatcher routes to (router_topk = tp_size * topk); a combined row, the
    hidden state only. Inside a node the rows for the other GPUs cross NVLink. Across nodes DeepEP sends a
    token once to each other node that holds one of its experts, over the GPU's own NIC to the GPU of the same
    local rank there, which forwards it over NVLink to the GPUs that need it; the network and NVLink legs run
    at once, so the slower one counts (DeepEP README: internode dispatch and combine are bounded by the RDMA
    bandwidth)."""
    n = shape.ep * shape.etp
    link = comm.group_link(hw, n, 1)
    row = shape.elem * model.hidden_size
    if dispatch:
        row += shape.etp * model.moe_top_k * (FP32_BYTES + COUNT_BYTES)
    rows = delivered_rows(model, shape)
    g = min(max(1, link.ranks_per_node), DEEPEP_NVL_PEERS)
    if n <= g:
        return link.latency + (n - 1) / n * rows * row / link.bandwidth
    nodes = n / g
    remote = shape.imbalance * routed_tokens(shape) * (nodes - 1) / nodes * parts_hit(model, round(nodes))
    nvlink = comm.group_link(hw, g, 1).bandwidth
    nic = link.nic_bandwidth or comm.p2p_link(hw, 2 * hw.gpus_per_node, 1).bandwidth
    return link.latency + max(remote * row / nic, (g - 1) / g * rows * row / nvlink)


def moe_comm(model: ModelSpec, hw: HardwareSpec, shape: LayerShape) -> tuple[float, float]:
    """(forward, backward) seconds of the token exchange, exposed (Megatron runs it on the compute stream):
    dispatch and combine all-to-alls over the ep group (expert ranks are numbered etp-fastest, so the group's
    stride is etp) and, with etp > 1, an all-gather after dispatch and a reduce-scatter before combine
    (megatron-core 0.16 moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher.token_dispatch, dispatch_postprocess,
    combine_preprocess, token_combine; the probabilities are taken as fp32, as sort_by_expert_ops does). The
    backward sends the gradients the same way back. Before the dispatch the forward all-gathers every rank's
    tokens-per-expert counts (int64, E per rank) over the etp*ep group so each rank knows its receive splits
    (megatron-core 0.16 token_dispatcher.py, preprocess, ep > 1): a small, latency-bound collective."""
    if uses_deepep(shape):
        # dispatch and combine each way; the forward dispatch first exchanges the per-rank receive counts
        # (DeepEP's notify step, which the host waits on): one more latency. The backward runs a combine for
        # the dispatch and a dispatch for the combine on the cached layout, moving hidden states only.
        dispatch, combine = deepep_exchange(model, hw, shape), deepep_exchange(model, hw, shape, dispatch=False)
        return dispatch + combine + comm.group_link(hw, shape.ep * shape.etp, 1).latency, 2 * combine
    copies = shape.imbalance * routed_tokens(shape) * model.moe_top_k  # the busiest GPU's (imbalance x the mean)
    sent = shape.elem * copies * model.hidden_size
    probs = FP32_BYTES * copies
    a2a = 0.0
    if shape.ep > 1:
        # token_dispatch runs two all-to-alls, the tokens and then their probabilities (a collective of its
        # own: one more latency); token_combine one, for the expert outputs. Their backward mirrors them.
        link = comm.group_link(hw, shape.ep, shape.etp)
        a2a = 2 * comm.all_to_all(sent, shape.ep, link) + comm.all_to_all(probs, shape.ep, link)
    etp = 0.0
    if shape.etp > 1:
        # dispatch_postprocess all-gathers the tokens and the probabilities; combine_preprocess reduce-scatters
        # the expert outputs cast to the probabilities' dtype (`hidden_states.to(self.probs.dtype)`: fp32)
        link = comm.group_link(hw, shape.etp, 1)
        etp = (comm.all_gather(shape.etp * sent, shape.etp, link) + comm.all_gather(shape.etp * probs, shape.etp, link)
               + comm.reduce_scatter(shape.etp * sent * FP32_BYTES / shape.elem, shape.etp, link))
    one_pass = a2a + etp
    counts = 0.0
    if shape.ep > 1:
        group = shape.ep * shape.etp
        counts = comm.all_gather(group * model.num_experts * COUNT_BYTES, group, comm.group_link(hw, group, 1))
    return one_pass + counts, one_pass


def moe_activation_bytes(model: ModelSpec, shape: LayerShape) -> float:
    """What an MoE block keeps for its backward beyond the block input and norm outputs: the router's fp32
    probabilities, the permuted expert inputs, the expert activation's input and the down-projection's input
    (all on the R token copies the busiest GPU received), plus the shared experts' intermediate tensors.

    Not the expert outputs: megatron-core 0.16 applies the router probabilities inside the activation
    (moe/experts.py, TEGroupedMLP.forward, bias_act_func: weighted_bias_swiglu_impl /
    weighted_bias_quick_geglu_impl save their input and the probabilities), and the combine's un-permute
    takes no probabilities (moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher.combine_postprocess), so
    nothing of the fc2 output is saved (the per-expert bias `t + b * p` of _apply_bias keeps only b and p).
    A clamped gated unit (GPT-OSS, clamp_ops) also keeps fc1's unclamped output: torch.clamp's backward
    needs its input, and the two clamped halves are views of that one tensor."""
    e, h = shape.elem, model.hidden_size
    g = 1 if shape.fp8 else e
    tn, r = routed_tokens(shape), received_tokens(model, shape)
    f = model.moe_ffn_hidden_size / shape.etp
    up = 2 * f if model.gated else f
    out = FP32_BYTES * tn * model.num_experts + g * r * h + e * r * up + g * r * f
    if clamps_glu(model):
        out += e * r * up
    if model.num_shared_experts:
        width = model.num_shared_experts * model.shared_expert_ffn_hidden_size / shape.tp
        out += e * shape.tokens * (2 * width if model.gated else width) + g * shape.tokens * width
    return out
