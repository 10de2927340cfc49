"""Parameter counts and per-GPU memory: weights, gradients, optimizer states and activations.

Activation bytes follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(MLSys 2023, arXiv 2205.05198), Section 4 and Table 2: per layer s*b*h*(34 + 5*a*s/h) bytes without
parallelism, s*b*h*(10 + 24/t + 5*a*s/(h*t)) with tensor parallelism, all divided by t with sequence
parallelism, the 5*a*s/h score term gone with selective recomputation, and only the 2*s*b*h layer input kept
with full recomputation. The terms are itemized tensor by tensor below so that GQA, gated MLPs, models
without dropout and flash attention (no s x s scores, an fp32 log-sum-exp instead) get their own sizes; for a
GPT block they reduce exactly to the closed forms (tests/costmodel/test_memory.py checks this).
All results are whole bytes so that the solver, the estimate and the validator agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from autotune.costmodel.ops import LayerShape
from autotune.specs.job import StateBytes
from autotune.specs.model import ModelSpec
from autotune.units import FP32_BYTES, whole_bytes


# ---------------------------------------------------------------------------------------------- parameters
def layer_params(model: ModelSpec, tp: int = 1, ep: int = 1, etp: int | None = None) -> int:
    """Parameters of one Transformer block held by one GPU of a tp group (linear layers split by tp;
    norm weights and the biases of row-parallel layers replicated). For an MoE model: an MoE layer (the
    larger kind), its routed experts split ep ways and each expert etp ways (moe_layer_params)."""
    if model.is_moe:
        return moe_layer_params(model, tp, ep, tp if etp is None else etp)
    return dense_layer_params(model, tp)


def whole_tensor_bucket(model: ModelSpec, tp: int) -> int:
    """The smallest gradient bucket, in parameters, a trainer runs: neither Megatron's DDP (which closes a bucket
    once it reaches the size) nor DeepSpeed (which flushes before a tensor that would overflow it) splits a tensor,
    so a bucket below a weight matrix holds at least one. The floor is the smallest weight matrix of a block on one
    GPU: the attention's output projection, the dense MLP's and an expert's matrices, MLA's down-projections (all
    taken split tp ways, the smallest they get). A DeepSpeed reduce_bucket_size of 1 made ~10^9 collectives of one
    parameter each (user-tester); buckets of real configs (Megatron's 40M and more, DeepSpeed's 500M) stay above."""
    h = model.hidden_size
    widths = [model.q_width, model.ffn_hidden_size, model.moe_ffn_hidden_size,
              model.kv_lora_rank + model.qk_rope_head_dim if model.mla else 0, model.q_lora_rank]
    return max(1, min(w * h for w in widths if w > 0) // tp)


def dense_layer_params(model: ModelSpec, tp: int = 1) -> int:
    """A block with a dense MLP of ffn_hidden_size (every layer of a dense model, the dense-first layers of an
    MoE model)."""
    if model.mla:
        return attention_params(model, tp) + mlp_params(model, model.ffn_hidden_size, tp)
    h, q, kv, f = model.hidden_size, model.q_width, model.kv_width, model.ffn_hidden_size
    up = 2 * f if model.gated else f
    linear = h * (q + 2 * kv) + q * h + h * up + f * h
    norms = 2 * h * (2 if model.norm == "layernorm" else 1)
    split_bias = replicated_bias = 0
    if model.bias in ("qkv", "all"):
        split_bias += q + 2 * kv
    if model.bias == "all":
        split_bias += up
        replicated_bias += 2 * h
    return linear // tp + split_bias // tp + norms + replicated_bias


def attention_params(model: ModelSpec, tp: int = 1) -> int:
    """Attention projections, their biases and the block's two norms. MLA (DeepSeek-V2 paper, Sec. 2.1): the
    query and key/value down-projections and their latent norms are replicated over tp (Megatron builds them
    'duplicated'); the up-projections and the output projection are split."""
    h, heads = model.hidden_size, model.num_heads
    norms = 2 * h * (2 if model.norm == "layernorm" else 1)
    if not model.mla:
        q, kv = model.q_width, model.kv_width
        bias = (q + 2 * kv) // tp if model.bias in ("qkv", "all") else 0
        out_bias = h if model.bias == "all" else 0
        return (h * (q + 2 * kv) + q * h) // tp + bias + out_bias + norms
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    if model.q_lora_rank:
        q_down, q_up = h * model.q_lora_rank + model.q_lora_rank, model.q_lora_rank * heads * qk
    else:
        q_down, q_up = 0, h * heads * qk
    kv_down = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
    kv_up = model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim)
    out = heads * model.v_head_dim * h
    return q_down + kv_down + (q_up + kv_up + out) // tp + norms


def mlp_params(model: ModelSpec, width: int, tp: int = 1, bias: bool = False) -> int:
    """One MLP of inner width `width` (gated: three matrices), split tp ways; biases on request."""
    h = model.hidden_size
    up = 2 * width if model.gated else width
    return (h * up + width * h) // tp + ((up // tp + h) if bias else 0)


def expert_params(model: ModelSpec, etp: int = 1) -> int:
    """One routed expert on one GPU of its expert-tensor-parallel group."""
    return mlp_params(model, model.moe_ffn_hidden_size, etp, model.expert_bias)


def moe_layer_params(model: ModelSpec, tp: int = 1, ep: int = 1, etp: int = 1) -> int:
    """An MoE block on one GPU: attention (tp), the router (h x E, replicated), the shared experts as one dense
    MLP (tp) and num_experts/ep routed experts, each split etp ways (Megatron's expert parallelism)."""
    router = model.hidden_size * model.num_experts
    shared = mlp_params(model, model.num_shared_experts * model.shared_expert_ffn_hidden_size, tp)
    return (attention_params(model, tp) + router + shared
            + model.num_experts // ep * expert_params(model, etp))


def moe_expert_share(model: ModelSpec, tp: int = 1, ep: int = 1, etp: int = 1) -> int:
    """The routed-expert parameters inside moe_layer_params: the part the expert-data-parallel group (not the
    data-parallel group) reduces and shards."""
    return model.num_experts // ep * expert_params(model, etp) if model.is_moe else 0


def active_params(model: ModelSpec, *, input_embedding: bool = True) -> int:
    """Parameters one token passes through: attention, dense MLPs, router, shared experts and top_k routed
    experts per MoE layer, the LM head, and the input embedding unless left out (publishers differ: Mistral
    and Qwen count it, OpenAI's GPT-OSS card does not)."""
    if not model.is_moe:
        total = total_params(model)
        return total if input_embedding else total - embedding_params(model)
    dense = model.num_dense_layers * dense_layer_params(model)
    per_moe = moe_layer_params(model) - (model.num_experts - model.moe_top_k) * expert_params(model)
    # a tied LM head is the embedding's matrix: counted with the head when the input embedding is left out
    head = head_params(model, separate_stage=not model.tied_embeddings or not input_embedding)
    return dense + model.num_moe_layers * per_moe + head + (embedding_params(model) if input_embedding else 0)


def embedding_params(model: ModelSpec, tp: int = 1) -> int:
    """Input embedding (vocab-parallel over tp) plus a learned position table (replicated)."""
    return model.vocab_size * model.hidden_size // tp + model.max_position_embeddings * model.hidden_size


def head_params(model: ModelSpec, tp: int = 1, *, separate_stage: bool = True) -> int:
    """Final norm plus the LM head. A tied head shares the embedding when both sit on one GPU; on a
    separate last pipeline stage Megatron keeps its own copy and all-reduces the two gradients."""
    norm = model.hidden_size * (2 if model.norm == "layernorm" else 1)
    if model.tied_embeddings and not separate_stage:
        return norm
    return norm + model.vocab_size * model.hidden_size // tp


def total_params(model: ModelSpec) -> int:
    """Parameters of the whole model, counting a tied embedding once."""
    layers = (model.num_dense_layers * dense_layer_params(model) + model.num_moe_layers * moe_layer_params(model)
              if model.is_moe else model.num_layers * layer_params(model))
    return layers + embedding_params(model) + head_params(model, separate_stage=False)


# ---------------------------------------------------------------------------------------------- activations
@dataclass(frozen=True, slots=True)
class LayerActivations:
    """Bytes one layer keeps for the backward pass, per micro-batch, under each recompute setting."""

    none: int
    selective: int
    full: int

    def get(self, recompute: str) -> int:
        return {"none": self.none, "selective": self.selective, "full": self.full}[recompute]


def layer_activations(model: ModelSpec, shape: LayerShape) -> LayerActivations:
    """Per-layer stored activations (Korthikanti et al. 2022, itemized; see the module docstring)."""
    t, e, tp = shape.tokens, shape.elem, shape.tp
    g = 1 if shape.fp8 else e  # FP8 training keeps the linear layers' saved inputs as 1-byte copies
    h, f = model.hidden_size, model.ffn_hidden_size
    q, kv = model.q_width / tp, model.kv_width / tp
    up = (2 * f if model.gated else f) / tp
    shard = tp if shape.sp else 1  # tensors that only sequence parallelism splits
    mask = 1 if model.dropout else 0
    replicated = (2 * e * t * h      # the two norm inputs
                  + g * t * h        # QKV GEMM input
                  + mask * t * h     # attention-output dropout mask
                  + g * t * h        # MLP up GEMM input
                  + mask * t * h) / shard  # MLP dropout mask
    split = e * t * (q + kv) + e * t * kv + g * t * q + e * t * up + g * t * f / tp  # Q,K ; V ; out-proj in ; act in ; down in
    if model.qk_norm:  # the query/key norms keep their inputs too
        split += e * t * (q + kv)
    heads = q / model.head_dim
    if shape.flash:
        scores = FP32_BYTES * t * heads  # the softmax log-sum-exp per query and head
    else:
        n_scores = shape.mbs * heads * (t / shape.mbs) * (shape.kv_tokens / shape.mbs)
        scores = n_scores * (e + (mask + e) * mask)  # softmax out; dropout mask and output with dropout
    none = replicated + split + scores
    return LayerActivations(
        none=whole_bytes(none),
        selective=whole_bytes(replicated + split),
        full=whole_bytes(e * t * h / shard),
    )


def gathered_input_bytes(model: ModelSpec, shape: LayerShape, blocks: int = 2) -> int:
    """What a layer keeps beyond layer_activations' 'none' when its column-parallel GEMM inputs are saved
    all-gathered rather than as sequence-parallel shards (torchtitan: the matmul after the gather saves the
    full-sequence tensor, tpcomm.regathers_inputs): per block (QKV, MLP up) the input is t*h instead of t*h/tp
    elements, at the saved-input width layer_activations uses (1 byte under FP8)."""
    if not shape.sp or shape.tp == 1:
        return 0
    g = 1 if shape.fp8 else shape.elem
    return whole_bytes(blocks * g * shape.tokens * model.hidden_size * (1 - 1 / shape.tp))


def sac_activations(model: ModelSpec, shape: LayerShape) -> int:
    """What torchtitan's op-level selective checkpointing keeps per layer (activation_checkpoint.py): the block
    input, the outputs of every other linear (Q, V, the MLP's first up-projection and its down-projection, in
    a Llama block's order wq, wk, wv, wo, w1, w3, w2) and the SDPA output with its fp32 log-sum-exp; the rest
    is recomputed from them."""
    t, e, tp = shape.tokens, shape.elem, shape.tp
    shard = tp if shape.sp else 1
    q, kv, f = model.q_width / tp, model.kv_width / tp, model.ffn_hidden_size / tp
    heads = q / model.head_dim
    saved = e * t * model.hidden_size / shard + e * t * (q + kv + f + q) + e * t * model.hidden_size / shard
    return whole_bytes(saved + FP32_BYTES * t * heads)


def embedding_activations(model: ModelSpec, shape: LayerShape) -> int:
    """The embedding keeps only its dropout mask (its backward needs just the token ids)."""
    return whole_bytes((1 if model.dropout else 0) * shape.tokens * model.hidden_size / (shape.tp if shape.sp else 1))


def head_activations(model: ModelSpec, shape: LayerShape) -> int:
    """Final-norm and LM-head inputs plus the fp32 softmax of s*b*V/tp logits kept for the cross-entropy
    backward (Korthikanti et al. 2022, Section 4.3: 4*s*b*v/t bytes), which dominates for large vocabularies;
    Transformer Engine's loss keeps the gradient it wrote over the 16-bit logits instead (ops.cross_entropy_bytes)."""
    t, e, h = shape.tokens, shape.elem, model.hidden_size
    shard = shape.tp if shape.sp else 1
    kept = e if shape.cross_entropy == "te" else FP32_BYTES
    return whole_bytes(2 * e * t * h / shard + kept * t * model.vocab_size / shape.tp)


def head_transient(model: ModelSpec, shape: LayerShape) -> int:
    """Peak scratch of the loss: the 16-bit logits live beside their fp32 copy for one micro-batch (none where
    Transformer Engine's loss works on the logits in place)."""
    if shape.cross_entropy == "te":
        return 0
    return whole_bytes(shape.elem * shape.tokens * model.vocab_size / shape.tp)


# ---------------------------------------------------------------------------------------------- states
def state_bytes_per_param(zero: int, shards: int, state: StateBytes = StateBytes()) -> tuple[float, float, float]:
    """(weight, gradient, optimizer) bytes per parameter under mixed-precision Adam and a ZeRO stage.

    By default 16-bit weights, fp32 main gradients, fp32 master weights + Adam m and v (Megatron-LM's distributed
    optimizer docs: 18 bytes/param, 6 + 12/d with the distributed optimizer); other dtypes per JobSpec.state_bytes.
    ZeRO (Rajbhandari et al. 2020) stage 1 shards the optimizer states over the `shards` data-parallel ranks,
    stage 2 also the gradients, stage 3 also the weights. The fp32 copy of 16-bit gradients the optimizer steps on
    is sharded with its states: the distributed optimizer copies its shard, the plain one every gradient
    (megatron-core Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads, DeepSpeed's FP16_Optimizer).
    """
    weight = state.weight / (shards if zero >= 3 else 1)
    grad = state.grad / (shards if zero >= 2 else 1)
    opt = (state.optimizer + state.grad_copy) / (shards if zero >= 1 else 1)
    return weight, grad, opt


def state_bytes(params: int, zero: int, shards: int, state: StateBytes = StateBytes()) -> tuple[int, int, int]:
    """Whole bytes of (weights, gradients, optimizer states) for `params` parameters."""
    w, g, o = state_bytes_per_param(zero, shards, state)
    return whole_bytes(params * w), whole_bytes(params * g), whole_bytes(params * o)


@lru_cache(maxsize=65536)  # pure: every stage kind of every estimate asks, and few (params, ZeRO, shards) recur
def split_state_bytes(params: int, experts: int, zero: int, shards: int, expert_shards: int,
                      state: StateBytes = StateBytes()) -> tuple[int, int, int]:
    """state_bytes of `params` parameters of which `experts` are routed experts, sharded by ZeRO over the
    `expert_shards` expert-data-parallel ranks rather than the `shards` data-parallel ones."""
    if not experts:
        return state_bytes(params, zero, shards, state)
    rest = state_bytes(params - experts, zero, shards, state)
    routed = state_bytes(experts, zero, expert_shards, state)
    return rest[0] + routed[0], rest[1] + routed[1], rest[2] + routed[2]
