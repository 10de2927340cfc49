"""Model FLOPs pinned to Narayanan et al. 2021's closed form and to a hand count for a GQA/SwiGLU model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import load_model
from autotune.costmodel import flops
from autotune.specs.job import JobSpec

from ._helpers import gpt_model


@pytest.mark.parametrize(("hidden", "heads", "layers", "vocab", "batch", "seq"), [
    (12288, 96, 96, 51200, 1536, 2048),   # GPT-3 175B shape, as in Narayanan 2021
    (2304, 24, 24, 51200, 512, 2048),     # gpt-1.7b of Table 1
    (1024, 16, 4, 50257, 8, 1024),
])
def test_gpt_model_flops_match_narayanan_closed_form(hidden, heads, layers, vocab, batch, seq):
    """Narayanan et al., SC'21 (arXiv 2104.04473), appendix, without recomputation (3 passes instead of 4):
    72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)); the same form ../shared/CLI.md gives for model_tflops_per_gpu."""
    model = gpt_model(hidden=hidden, heads=heads, layers=layers, vocab=vocab)
    job = JobSpec(global_batch=batch, seq_len=seq)
    b, s, L, h, V = batch, seq, layers, hidden, vocab
    want = 72 * b * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert flops.model_flops_per_step(model, job) == pytest.approx(want, rel=1e-12)


def test_llama3_8b_model_flops_by_hand():
    """Llama-3-8B, counted by hand: every weight matrix costs 2 FLOPs per parameter per token forward and the
    step is 3x the forward (Kaplan et al. 2020, Sec. 2.1: C = 6N per token); the input embedding is a lookup,
    not a matmul; attention scores and values add 2 * 2*s*q_width per token per layer forward, in full
    (Narayanan 2021 counting, no causal halving)."""
    h, q, kv, f, v, L, s, batch = 4096, 4096, 1024, 14336, 128256, 32, 8192, 64
    matmul_params = L * (h * q + 2 * h * kv + q * h + 3 * h * f) + v * h  # layers + LM head
    assert matmul_params == 6_979_321_856 + 525_336_576
    tokens = batch * s
    attention = 3 * L * 2 * 2 * s * q * tokens   # = 12*L*s*q_width per token
    want = 6 * matmul_params * tokens + attention
    model = load_model("llama3-8b")
    got = flops.model_flops_per_step(model, JobSpec(global_batch=batch, seq_len=s))
    assert got == pytest.approx(want, rel=1e-12)
    # Against the usual 6*N*D with the published N = 8.03B (which also counts the 525M-parameter input
    # embedding and the norms, neither a matmul): within 7% once the attention term is added.
    approx = 6 * 8.03e9 * tokens + attention
    assert got == pytest.approx(approx, rel=0.07)
    assert got < approx


def test_sliding_window_layers_count_their_window_by_hand():
    """GPT-OSS-120B at s 4096: 18 of 36 layers see w = 128 keys per query, the others s (both un-halved, the
    convention above), so the mean is (4096 + 128)/2 = 2112 keys; against a model without the window each
    token's forward loses 36 layers x 2*2*(4096 - 2112) x q_width 4096 FLOPs, and the step 3x that per token."""
    from dataclasses import replace

    model = load_model("gpt-oss-120b")
    assert flops.attended_keys(model, 4096) == 2112
    assert flops.attended_keys(model, 100) == 100  # the window is longer than the sequence
    plain = replace(model, sliding_window=0, sliding_window_layers=0)
    assert flops.attended_keys(plain, 4096) == 4096
    job = JobSpec(global_batch=8, seq_len=4096)
    saved = flops.model_flops_per_step(plain, job) - flops.model_flops_per_step(model, job)
    assert saved == pytest.approx(3 * 36 * 2 * 2 * (4096 - 2112) * 4096 * 8 * 4096, rel=1e-12)


def test_dropped_tokens_expert_work_is_not_counted():
    """At a capacity factor c < 1 each expert runs c of its mean load: model FLOPs count c of the routed-expert
    passes (by hand: Mixtral's 3 x (w1, w3, w2) of 4096 x 14336, top-2, 32 layers, 2 FLOPs a weight, 3x for the
    backward), so MFU stays a fraction of the peak (user-tester: 153% at c = 0.01); c >= 1 pads, which is not
    the model's work, and dropless counts all."""
    from autotune.catalog import load_hardware
    from autotune.costmodel.estimate import CostModel
    from autotune.specs.plan import Plan

    model = load_model("mixtral-8x7b")
    job = JobSpec(global_batch=512, seq_len=4096)
    routed = 3 * 2 * 32 * 2 * 3 * 4096 * 14336 * job.tokens_per_step
    for c in (0.5, 0.01):
        dropped = flops.model_flops_per_step(model, replace(job, moe_capacity_factor=c))
        assert flops.model_flops_per_step(model, job) - dropped == pytest.approx((1 - c) * routed, rel=1e-9)
    assert flops.model_flops_per_step(model, replace(job, moe_capacity_factor=1.5, moe_pad_to_capacity=True)) == \
        flops.model_flops_per_step(model, job)
    plan = Plan(tp=1, pp=1, dp=64, cp=1, mbs=1, num_microbatches=8, ep=8, zero=3, layers_per_stage=(32,))
    est = CostModel(model, load_hardware("h100-sxm"), replace(job, moe_capacity_factor=0.01)).estimate(plan)
    assert 0 < est.mfu < 1
