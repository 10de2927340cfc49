"""Operator FLOPs and bytes of one layer, pinned to Megatron's counting and to the fusion argument of paper 5."""

from __future__ import annotations

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
