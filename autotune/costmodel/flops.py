"""Model FLOPs as Megatron-LM reports them, for tokens/s -> TFLOP/s per GPU -> MFU.

Narayanan et al., SC'21 (arXiv 2104.04473), appendix: every matmul counts 3 x 2mnk (forward, input
gradient, weight gradient), attention scores and values in full (no causal halving), the LM head included,
recomputation excluded. For a GPT block with FFN 4h this is 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)).
"""

from __future__ import annotations

from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec


def forward_matmul_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Forward matmul FLOPs of one token through every layer and the LM head."""
    h, q, kv, f = model.hidden_size, model.q_width, model.kv_width, model.ffn_hidden_size
    up = 2 * f if model.gated else f
    linear = 2 * (h * (q + 2 * kv) + q * h + h * up + f * h)
    attention = 2 * 2 * seq_len * q  # QK^T and PV over the whole sequence
    return model.num_layers * (linear + attention) + 2 * h * model.vocab_size


def model_flops_per_step(model: ModelSpec, job: JobSpec) -> float:
    """Model FLOPs of one optimizer step (3x the forward matmuls)."""
    return 3 * forward_matmul_flops_per_token(model, job.seq_len) * job.tokens_per_step
