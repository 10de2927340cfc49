"""Parameter counts and per-layer activation bytes pinned to published numbers and closed forms."""

from __future__ import annotations

import pytest

from autotune.catalog import load_model
from autotune.costmodel import memory
from autotune.costmodel.ops import LayerShape

from ._helpers import gpt_model

# ------------------------------------------------------------------------------------------ parameter counts
# Published totals, each with its source:
#   gpt3-175b   175B    Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1
#   llama3-8b   8.03B   Hugging Face hub, meta-llama/Meta-Llama-3-8B (safetensors total)
#   llama3-70b  70.6B   Hugging Face hub, meta-llama/Meta-Llama-3-70B (safetensors total)
#   llama3-405b 405B    Llama Team 2024, "The Llama 3 Herd of Models", Table 3
#   llama2-70b  69B     Hugging Face hub, meta-llama/Llama-2-70b-hf (safetensors total, 68.98B)
#   gemma3-27b  27.02B  Gemma Team 2025, "Gemma 3 Technical Report", Table 1 (1,416M embedding + 25,600M
#                       non-embedding; the vision encoder apart)
PUBLISHED_PARAMS = {
    "gemma3-27b": 27.016e9,
    "gpt3-175b": 175e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
    "llama3-405b": 405e9,
    "llama2-70b": 69e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_total_params_match_published_within_1_percent(name):
    count = memory.total_params(load_model(name))
    assert count == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


def test_llama3_8b_param_count_by_hand():
    """Meta-Llama-3-8B, counted matrix by matrix (config.json: L=32, h=4096, 32 heads of 128, 8 KV heads,
    FFN 14336, V=128256, untied, RMSNorm, no biases). The Hugging Face safetensors index reports
    8,030,261,248 parameters, the same number."""
    h, kv, f, v, layers = 4096, 8 * 128, 14336, 128256, 32
    attention = h * h + 2 * h * kv + h * h          # q, k, v, o projections
    mlp = 3 * h * f                                  # gate, up, down (SwiGLU)
    norms = 2 * h                                    # two RMSNorm weights per block
    per_layer = attention + mlp + norms              # 218,112,000
    total = layers * per_layer + 2 * v * h + h       # untied embedding and LM head, final norm
    assert per_layer == 218_112_000
    assert total == 8_030_261_248
    assert memory.total_params(load_model("llama3-8b")) == total


def test_tied_head_counts_once_but_a_separate_last_stage_keeps_a_copy():
    """Megatron-LM keeps its own copy of a tied output layer on the last pipeline stage and all-reduces the
    two gradients (Shoeybi et al. 2019 / Megatron's embedding-group sync)."""
    model = gpt_model(hidden=1024, vocab=51200)
    norm = 2 * 1024
    assert memory.head_params(model, separate_stage=False) == norm
    assert memory.head_params(model, 2, separate_stage=True) == norm + 51200 * 1024 // 2


# ---------------------------------------------------------------------------------------------- activations
# Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023,
# arXiv 2205.05198), Table 2: activation bytes per layer of a GPT block (16-bit activations, 1-byte dropout
# masks, MHA, FFN 4h). s = 512, b = 2, h = 1024, a = 16 make every term whole for t in {1, 2, 4, 8}.
S, B, H, A = 512, 2, 1024, 16


def _acts(t: int, sp: bool, *, flash: bool = False) -> memory.LayerActivations:
    shape = LayerShape(tokens=B * S, kv_tokens=B * S, mbs=B, tp=t, sp=sp, elem=2, flash=flash, fused=True)
    return memory.layer_activations(gpt_model(hidden=H, heads=A), shape)


def test_no_parallelism_is_34sbh_plus_5as2b():
    """Korthikanti 2022, eq. (1): s*b*h*(34 + 5*a*s/h)."""
    assert _acts(1, False).none == S * B * H * (34 + 5 * A * S // H)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_tensor_parallel_no_recompute(t):
    """Table 2, 'tensor parallel (baseline)': s*b*h*(10 + 24/t + 5*a*s/(h*t))."""
    assert _acts(t, False).none == S * B * H * (10 + 24 // t + 5 * A * S // (H * t))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_and_sequence_parallel_no_recompute(t):
    """Table 2, 'tensor + sequence parallel': s*b*h/t*(34 + 5*a*s/h)."""
    assert _acts(t, True).none == S * B * H // t * (34 + 5 * A * S // H)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_selective_recompute_with_sequence_parallel(t):
    """Table 2, 'tensor + sequence parallel + selective activation recompute': 34*s*b*h/t."""
    assert _acts(t, True).selective == 34 * S * B * H // t


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_selective_recompute_without_sequence_parallel(t):
    """Table 2, 'tensor parallel + selective activation recompute': s*b*h*(10 + 24/t)."""
    assert _acts(t, False).selective == S * B * H * (10 + 24 // t)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_full_recompute_keeps_only_the_layer_input(t):
    """Table 2, 'full activation recompute': 2*s*b*h; with sequence parallelism the input is the 1/t shard."""
    assert _acts(t, False).full == 2 * S * B * H
    if t > 1:
        assert _acts(t, True).full == 2 * S * B * H // t


def test_flash_attention_keeps_an_fp32_logsumexp_instead_of_scores():
    """FlashAttention (Dao et al. 2022, Sec. 3.1) stores only the output and the softmax statistics: one fp32
    log-sum-exp per query and head, 4*b*s*a/t bytes, instead of the 5*a*s^2*b/t bytes of scores."""
    for t in (1, 4):
        acts = _acts(t, False, flash=True)
        assert acts.none == acts.selective + 4 * B * S * A // t
        assert acts.selective == _acts(t, False).selective


def test_lm_head_keeps_fp32_logits():
    """Korthikanti 2022, Sec. 4.3: the cross-entropy keeps the fp32 logits, 4*s*b*v/t bytes, beside the
    16-bit inputs of the final norm and the LM head (2*s*b*h each)."""
    t, v = 4, 51200
    shape = LayerShape(tokens=B * S, kv_tokens=B * S, mbs=B, tp=t, sp=False, elem=2, flash=True, fused=True)
    assert memory.head_activations(gpt_model(vocab=v), shape) == 4 * S * B * v // t + 2 * 2 * S * B * H


# ---------------------------------------------------------------------------------------------- model states
@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_bytes_per_parameter_follow_megatron_and_zero(d):
    """Megatron-LM documentation, "Distributed Optimizer" (data-type table): 16-bit weights and
    fp32 gradients take 18 bytes/param, 6 + 12/d with the distributed optimizer (ZeRO-1). ZeRO (Rajbhandari
    et al. 2020, Fig. 1) stage 2 also shards gradients, stage 3 also weights."""
    assert sum(memory.state_bytes_per_param(0, d)) == pytest.approx(18)
    assert sum(memory.state_bytes_per_param(1, d)) == pytest.approx(6 + 12 / d)
    assert sum(memory.state_bytes_per_param(2, d)) == pytest.approx(2 + 16 / d)
    assert sum(memory.state_bytes_per_param(3, d)) == pytest.approx(18 / d)
