"""Operator FLOPs and bytes of one layer, pinned to Megatron's counting and to the fusion argument of paper 5."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.costmodel import ops

from ._helpers import gpt_model


def _shape(*, tp=1, sp=False, flash=False, fused=True, b=2, s=1024):
    return ops.LayerShape(tokens=b * s, kv_tokens=b * s, mbs=b, tp=tp, sp=sp, elem=2, flash=flash, fused=fused)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_gpt_layer_forward_flops(tp):
    """Narayanan et al. 2021, appendix: a GPT layer's forward is 24*b*s*h^2 + 4*b*s^2*h matmul FLOPs, split
    evenly over tp (Shoeybi et al. 2019 split every GEMM and the heads)."""
    h, b, s = 1024, 2, 1024
    model = gpt_model(hidden=h, heads=16)
    fwd = ops.layer_forward_ops(model, _shape(tp=tp, b=b, s=s))
    matmul = sum(op.flops for op in fwd if op.kernel == "gemm")
    assert matmul == pytest.approx((24 * b * s * h**2 + 4 * b * s**2 * h) / tp)


def test_backward_is_twice_the_forward_for_gemms():
    """Each GEMM's backward is an input-gradient and a weight-gradient GEMM of the same size."""
    model = gpt_model()
    shape = _shape()
    fwd = ops.layer_forward_ops(model, shape)
    bwd = ops.backward_ops(fwd, model, shape)
    gemm = lambda xs: sum(op.flops for op in xs if op.kernel == "gemm")  # noqa: E731
    assert gemm(bwd) == pytest.approx(2 * gemm(fwd))


def test_flash_attention_skips_the_causal_half_and_its_backward_is_2_5x():
    """FlashAttention-2 (Dao 2023): causal masking skips half the score tiles; the backward runs 5 score-sized
    matmuls against the forward's 2."""
    b, s, h = 2, 1024, 1024
    model = gpt_model(hidden=h, heads=16)
    shape = _shape(flash=True, b=b, s=s)
    fwd = [op for op in ops.layer_forward_ops(model, shape) if op.category == "attention"]
    assert len(fwd) == 1
    assert fwd[0].flops == pytest.approx(4 * b * s * s * h * 0.5)
    bwd = ops.backward_ops(tuple(fwd), model, shape)
    assert bwd[0].flops == pytest.approx(2.5 * fwd[0].flops)
    bidirectional = gpt_model(hidden=h, heads=16, causal=False)
    full = [op for op in ops.layer_forward_ops(bidirectional, shape) if op.category == "attention"]
    assert full[0].flops == pytest.approx(4 * b * s * s * h)


def test_fusion_moves_fewer_bytes():
    """Ivanov et al. 2021 ('Data movement is all you need'): fusing bias+GeLU, bias+dropout+residual and
    scale+mask+softmax removes round trips through HBM; FLOPs stay, bytes drop."""
    model = gpt_model()
    fused = ops.layer_forward_ops(model, _shape(fused=True))
    unfused = ops.layer_forward_ops(model, _shape(fused=False))
    mem = lambda xs: sum(op.bytes for op in xs if op.kernel == "memory")  # noqa: E731
    assert mem(fused) < mem(unfused)
    assert len(fused) < len(unfused)


def test_sequence_parallel_splits_norm_traffic_over_tp():
    """Korthikanti et al. 2022, Sec. 4.2.2: with sequence parallelism norms and dropouts see s/t tokens."""
    model = gpt_model()
    plain = {op.name: op for op in ops.layer_forward_ops(model, _shape(tp=4))}
    sp = {op.name: op for op in ops.layer_forward_ops(model, _shape(tp=4, sp=True))}
    assert sp["input_norm"].flops == pytest.approx(plain["input_norm"].flops / 4)
    assert sp["qkv_proj"].flops == plain["qkv_proj"].flops


# ----------------------------------------------------------------------------- sliding-window attention
def _windowed(window=128, layers=2, **overrides):
    """Four layers of 8 heads of 64, `layers` of them windowed."""
    return gpt_model(hidden=512, heads=8, layers=4, sliding_window=window, sliding_window_layers=layers,
                     **overrides)


@pytest.mark.parametrize(("s", "w"), [(1, 1), (5, 3), (128, 128), (100, 128), (4096, 128), (1000, 1)])
def test_windowed_key_pairs_match_a_brute_force_count(s, w):
    """Query i (0-based) of a causal window of w keys attends to keys max(0, i - w + 1) .. i."""
    brute = sum(i - max(0, i - w + 1) + 1 for i in range(s))
    assert ops.windowed_key_pairs(s, w) == brute


@pytest.mark.parametrize(("s", "w"), [(1, 1), (5, 3), (128, 128), (100, 128), (4096, 128), (1000, 1), (20000, 8192)])
def test_chunked_key_pairs_match_a_brute_force_count(s, w):
    """Llama 4's chunked attention: query i (0-based) attends to the keys of its own chunk of w up to itself,
    i - (i // w) * w + 1 of them; at 32k tokens in 8k chunks that is 4 x 8192*8193/2 = 134,234,112 pairs, a quarter
    of the causal 536,887,296."""
    brute = sum(i - (i // w) * w + 1 for i in range(s))
    assert ops.windowed_key_pairs(s, w, chunked=True) == brute
    assert ops.windowed_key_pairs(32768, 8192, chunked=True) == 4 * 8192 * 8193 / 2 == 134_234_112


def test_llama4_reads_its_chunks_and_costs_them_at_long_sequences():
    """attention_chunk_size 8192 on the RoPE layers (no_rope_layers: 3 of 4) is the catalog's llama4-scout; at
    8192 tokens nothing changes, at 64k the chunked layers cost a fraction of full attention (user-tester: the key
    was ignored, 29.6 s against 21.8 s for a window stand-in)."""
    from dataclasses import replace

    from autotune.catalog import load_hardware, load_model
    from autotune.costmodel.estimate import CostModel
    from autotune.specs.hf_config import model_from_hf_config
    from autotune.specs.job import JobSpec
    from autotune.specs.plan import Plan

    scout = load_model("llama4-scout")
    assert (scout.sliding_window, scout.sliding_window_layers, scout.chunked_attention) == (8192, 36, True)
    config = {"model_type": "llama4_text", "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 8192,
              "intermediate_size_mlp": 16384, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
              "num_hidden_layers": 48, "vocab_size": 202048, "num_local_experts": 16, "num_experts_per_tok": 1,
              "interleave_moe_layer_step": 1, "attention_chunk_size": 8192, "tie_word_embeddings": False}
    parsed = model_from_hf_config(config, "config.json")
    assert (parsed.sliding_window, parsed.sliding_window_layers, parsed.chunked_attention) == (8192, 36, True)
    hw = load_hardware("h100-sxm")
    plan = Plan(tp=8, pp=1, dp=1, cp=8, ep=8, etp=1, mbs=1, num_microbatches=1, recompute="full", zero=3,
                sequence_parallel=True, layers_per_stage=(48,))
    full = replace(scout, sliding_window=0, sliding_window_layers=0, chunked_attention=False)
    for seq, same in ((8192, True), (65536, False)):
        job = JobSpec(global_batch=1, seq_len=seq)
        chunked, dense = (CostModel(m, hw, job).estimate(replace(plan, cp=8 if seq > 8192 else 1,
                                                                 dp=1 if seq > 8192 else 8)).step_time_s
                          for m in (scout, full))
        assert (chunked == dense) is same and chunked <= dense


def test_half_windowed_layers_split_the_attention_by_hand():
    """GPT-OSS's pattern (half the layers windowed, w 128) at s 4096, b 2, 8 heads of 64, tp 1. A full layer:
    QK^T + PV over the causal half, 2 * 2*b*heads*s*s*d / 2 = 2*2*8*4096^2*64 = 34,359,738,368 FLOPs. A
    windowed layer: 4*b*heads*d x (s*w - w(w-1)/2 = 524,288 - 8,128 = 516,160 pairs) = 4*2*8*64*516,160 =
    2,114,191,360. The mean layer carries half of each, both with the full kernel's Q, K, V, O traffic halved."""
    b, s = 2, 4096
    shape = _shape(flash=True, b=b, s=s)
    fwd = {op.name: op for op in ops.layer_forward_ops(_windowed(), shape)}
    full = {op.name: op for op in ops.layer_forward_ops(gpt_model(hidden=512, heads=8, layers=4), shape)}
    assert fwd["flash_attention"].flops == pytest.approx(0.5 * 34_359_738_368)
    assert full["flash_attention"].flops == pytest.approx(34_359_738_368)
    assert fwd["flash_attention_window"].flops == pytest.approx(0.5 * 2_114_191_360)
    io = 2 * (b * s * (512 + 2 * 512) + b * s * 512)
    assert fwd["flash_attention"].bytes == fwd["flash_attention_window"].bytes == pytest.approx(0.5 * io)
    assert fwd["flash_attention_window"].dims == (128.0, 0.0, 64)
    bwd = {op.name: op for op in ops.backward_ops(tuple(fwd.values()), _windowed(), shape)}
    assert bwd["flash_attention_window_bwd"].flops == pytest.approx(2.5 * 0.5 * 2_114_191_360)
    assert bwd["flash_attention_window_bwd"].dims == (128.0, 1.0, 64)


def test_every_layer_windowed_leaves_only_the_window_kernel():
    """Mistral-style: all layers windowed, w 256 < s 1024: one windowed kernel, 4*b*heads*d*(s*w - w(w-1)/2)."""
    shape = _shape(flash=True, b=2, s=1024)
    fwd = [op for op in ops.layer_forward_ops(_windowed(window=256, layers=4), shape) if op.kernel == "attention"]
    assert [op.name for op in fwd] == ["flash_attention_window"]
    assert fwd[0].flops == pytest.approx(4 * 2 * 8 * 64 * (1024 * 256 - 256 * 255 / 2))


@pytest.mark.parametrize("window", [1024, 4096])
def test_a_window_no_shorter_than_the_sequence_changes_nothing(window):
    """Mistral 7B's 4096-token window at s <= 4096: every query's causal prefix fits, the ops are the full
    model's exactly."""
    shape = _shape(flash=True, b=2, s=1024)
    plain = gpt_model(hidden=512, heads=8, layers=4)
    assert ops.layer_forward_ops(_windowed(window=window, layers=4), shape) == ops.layer_forward_ops(plain, shape)


def test_windowed_attention_with_context_parallelism_splits_the_band_over_the_ranks():
    """cp 2: queries s/2 per rank, keys s; the window kernel does 1/cp of the band's pairs on each rank."""
    b, s, cp = 1, 4096, 2
    shape = ops.LayerShape(tokens=b * s // cp, kv_tokens=b * s, mbs=b, tp=1, sp=False, elem=2, flash=True,
                           fused=True)
    fwd = {op.name: op for op in ops.layer_forward_ops(_windowed(), shape)}
    assert fwd["flash_attention_window"].flops == pytest.approx(0.5 * 4 * 8 * 64 * 516_160 / cp)
    assert fwd["flash_attention"].flops == pytest.approx(0.5 * 2 * 8 * 64 * s * s / cp)


def test_unfused_attention_computes_every_score_of_a_windowed_layer():
    """Without flash attention the window is a mask over the full s x s scores: nothing changes."""
    shape = _shape(flash=False, b=2, s=1024)
    plain = gpt_model(hidden=512, heads=8, layers=4)
    assert ops.layer_forward_ops(_windowed(), shape) == ops.layer_forward_ops(plain, shape)


# Bytes per 16-bit logit, pass by pass, each a (read, write) of a full logits tensor from the implementations'
# source: megatron-core 0.16 tensor_parallel/cross_entropy.py unfused: .float(), max, -= max, exp, sum, div_;
# backward mul_ and autograd's cast (the one-hot update is one logit per token). fusions/fused_cross_entropy.py under
# torch.compile: 3 fused forward functions, 1 backward that writes back its mutated input. TE 2.8
# triton/cross_entropy.py: online_softmax_kernel, cross_entropy_kernel (gradient in place), element_mul_kernel.
PASSES = {
    "unfused": ([(2, 4), (4, 0), (4, 4), (4, 4), (4, 0), (4, 4)], [(4, 4), (4, 2)]),
    "native": ([(2, 4), (4, 4), (4, 4)], [(4, 4 + 2)]),
    "te": ([(2, 0), (2, 2)], [(2, 2)]),
}


@pytest.mark.parametrize("kernel", sorted(PASSES))
def test_cross_entropy_bytes_per_logit_by_hand(kernel):
    """The head's loss ops move, per logit, the sum of their source's passes (PASSES above)."""
    shape = ops.LayerShape(tokens=2048, kv_tokens=2048, mbs=1, tp=2, sp=False, elem=2, flash=True, fused=True,
                           cross_entropy=kernel)
    model = gpt_model(vocab=32000)
    fwd = {op.name: op for op in ops.head_forward_ops(model, shape)}["cross_entropy"]
    bwd = {op.name: op for op in ops.head_backward_ops(model, shape)}["cross_entropy_bwd"]
    logits = 2048 * 32000 / 2
    forward, backward = (sum(r + w for r, w in passes) for passes in PASSES[kernel])
    assert (fwd.bytes / logits, bwd.bytes / logits) == (forward, backward)


def test_the_fused_loss_kernels_exist_as_costed():
    """The kernels costed are the installed trainers' own (`make trainers`): megatron-core's jit-fused functions
    and its Transformer Engine switch."""
    fused = pytest.importorskip("megatron.core.fusions.fused_cross_entropy",
                                reason="megatron-core is installed by `make trainers`")
    for name in ("calculate_logits_max", "calculate_predicted_logits", "calculate_cross_entropy_loss",
                 "calculate_gradients"):
        assert hasattr(fused, name)
    from megatron.core.model_parallel_config import ModelParallelConfig
    fields = ModelParallelConfig.__dataclass_fields__
    assert fields["cross_entropy_loss_fusion"].default is False  # Megatron-LM runs it unfused unless asked
    assert fields["cross_entropy_fusion_impl"].default == "native"


def test_megatron_weight_gradients_read_and_write_the_fp32_main_gradient():
    """Gradient-accumulation fusion (TE's fuse_wgrad_accumulation under Megatron): each weight gradient adds into
    the fp32 main gradient, reading and writing 4 bytes per weight where a plain GEMM writes 2: 6 bytes more per
    weight, for each of a grouped GEMM's experts; the input-gradient GEMM and attention's score GEMMs (no weights)
    are unchanged, and a bf16 buffer (grad_reduce bf16) adds 2."""
    up = ops.Op("expert_up", "gemm", 2.0 * 16384 * 2880 * 5760, 1e6, "gemm", (1024.0, 5760.0, 2880.0), 16)
    scores = ops.Op("qk_scores", "attention", 1e9, 1e6, "gemm", (512.0, 512.0, 64.0))
    plain = ops.LayerShape(tokens=4096, kv_tokens=4096, mbs=1, tp=1, sp=False, elem=2, flash=True, fused=True)
    for main_grad, extra in ((4, 6), (2, 2)):
        shape = replace(plain, main_grad=main_grad)
        by_name = {op.name: op for op in ops.backward_ops((up, scores), gpt_model(), shape)}
        assert by_name["expert_up_wgrad"].bytes == 1e6 + extra * 16 * 2880 * 5760
        assert by_name["expert_up_dgrad"].bytes == by_name["qk_scores_wgrad"].bytes == 1e6
    assert {op.name: op.bytes for op in ops.backward_ops((up,), gpt_model(), plain)}["expert_up_wgrad"] == 1e6


def test_alibi_has_no_rope_op_and_partial_rope_costs_the_whole_heads():
    """ALiBi (BLOOM) adds its bias inside the attention kernel: the layer loses exactly the RoPE op and nothing
    else. RoPE on part of each head (Pythia's rotary_pct 0.25) is costed as whole-head RoPE: the fused kernel
    (Transformer Engine's, and megatron-core's apply_rotary_pos_emb) reads and writes every head whole, passing
    the unrotated dimensions through."""
    model = replace(gpt_model(), position_embedding="rope")
    rope = ops.layer_forward_ops(model, _shape())
    alibi = ops.layer_forward_ops(replace(model, position_embedding="alibi"), _shape())
    partial = ops.layer_forward_ops(replace(model, rotary_fraction=0.25), _shape())
    assert [op.name for op in rope if op.name not in {o.name for o in alibi}] == ["rope"]
    assert [op for op in rope if op.name != "rope"] == list(alibi)
    assert list(partial) == list(rope)
