"""Model FLOPs as Megatron-LM reports them, for tokens/s -> TFLOP/s per GPU -> MFU.

Narayanan et al., SC'21 (arXiv 2104.04473), appendix: every matmul counts 3 x 2mnk (forward, input
gradient, weight gradient), attention scores and values in full (no causal halving), the LM head included,
recomputation excluded. For a GPT block with FFN 4h this is 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)).

Sliding-window layers (GPT-OSS, Gemma 2) count the same way: each query's whole window, min(w, s) keys, with
no masking discount (the band's first-w triangle is not subtracted, as the causal triangle is not for full
layers); attended_keys blends them with the full layers' s.
"""

from __future__ import annotations

from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec


def attended_keys(model: ModelSpec, seq_len: int) -> float:
    """Keys per query the attention FLOPs count, averaged over the layers: s for a full layer (the convention
    above), min(w, s) for a windowed one."""
    share = model.sliding_share
    return (1.0 - share) * seq_len + share * min(model.sliding_window, seq_len) if share else seq_len


def forward_matmul_flops_per_token(model: ModelSpec, seq_len: int, routed: float = 1.0) -> float:
    """Forward matmul FLOPs of one token through every layer and the LM head. An MoE model counts the
    parameters a token is routed through (moe_forward_flops_per_token), as published MoE MFU figures do;
    `routed`: the share of its routed-expert passes that run (routed_share)."""
    if model.is_moe or model.mla:
        return moe_forward_flops_per_token(model, seq_len, routed)
    h, q, kv, f = model.hidden_size, model.q_width, model.kv_width, model.ffn_hidden_size
    up = 2 * f if model.gated else f
    linear = 2 * (h * (q + 2 * kv) + q * h + h * up + f * h)
    attention = 2 * 2 * attended_keys(model, seq_len) * q  # QK^T and PV over the attended keys
    return model.num_layers * (linear + attention) + 2 * h * model.vocab_size


def model_flops_per_step(model: ModelSpec, job: JobSpec) -> float:
    """Model FLOPs of one optimizer step (3x the forward matmuls)."""
    return 3 * forward_matmul_flops_per_token(model, job.seq_len, routed_share(job)) * job.tokens_per_step


def routed_share(job: JobSpec) -> float:
    """The share of the routed-expert passes a step runs: all of them dropless or at a capacity of 1 or more (the
    padding above it is not the model's work); at a capacity factor c < 1 each expert takes c times its mean load
    and drops the rest, so c of them (balanced routing: more drop under imbalance, which the step time prices).
    Without it, MFU counted the dropped tokens' expert work: 153% at c = 0.01 (user-tester)."""
    return min(1.0, job.moe_capacity_factor) if job.moe_capacity_factor else 1.0


def moe_forward_flops_per_token(model: ModelSpec, seq_len: int, routed: float = 1.0) -> float:
    """2 FLOPs per active weight of every linear layer (attention projections, MLA's down and up projections,
    the router, the shared experts and the top_k routed experts of an MoE layer, the dense MLP of a dense
    layer) plus attention's QK^T and PV over the attended keys (attended_keys), plus the LM head: the
    6*N_active*tokens + attention convention of DeepSeek-V3's and Megatron-Core's MoE MFU figures (3x for the
    backward)."""
    h = model.hidden_size
    gated = 3 if model.gated else 2

    def mlp(width: int) -> int:
        return gated * h * width

    if model.mla:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        heads = model.num_heads
        q = (h * model.q_lora_rank + model.q_lora_rank * heads * qk) if model.q_lora_rank else h * heads * qk
        kv = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank * heads * (
            model.qk_nope_head_dim + model.v_head_dim)
        attn_linear = q + kv + heads * model.v_head_dim * h
        scores = attended_keys(model, seq_len) * heads * (qk + model.v_head_dim)
    else:
        attn_linear = h * (model.q_width + 2 * model.kv_width) + model.q_width * h
        scores = 2 * attended_keys(model, seq_len) * model.q_width
    moe = (h * model.num_experts + routed * mlp(model.moe_top_k * model.moe_ffn_hidden_size)
           + mlp(model.num_shared_experts * model.shared_expert_ffn_hidden_size))
    dense = mlp(model.ffn_hidden_size)
    per_layer_attn = 2 * (attn_linear + scores)
    return (model.num_layers * per_layer_attn + 2 * (model.num_moe_layers * moe + model.num_dense_layers * dense)
            + 2 * h * model.vocab_size)
