"""Torch implementations of the cost model's operators at their per-GPU shapes (costmodel/ops.py).

`kernel(name, dims)` returns a zero-argument callable that runs the op once, its inputs already allocated. A
GEMM's `_dgrad` and `_wgrad` are the two matmuls of its backward (dY W^T and X^T dY); every other `_bwd` is
the autograd backward of the forward implementation (the graph is kept, so it can be replayed). Kernels are
torch's eager ones: on a GPU the "fused" element-wise ops are a few eager kernels, not a hand-fused one, which
is what a trainer without a fusion compiler runs; the file records what was timed, not what could be.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from autotune.errors import SpecError

DROPOUT = 0.1


@dataclass(frozen=True, slots=True)
class Dims:
    """Per-GPU sizes of one micro-batch (costmodel/ops.py's LayerShape, made whole)."""

    mbs: int
    seq: int
    tokens: int
    norm_tokens: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    """MLP width per GPU (per branch when gated)."""
    vocab: int
    """Vocabulary shard per GPU."""
    gated: bool
    act: str
    """gelu, swiglu or geglu."""
    norm: str
    causal: bool
    bias: bool
    dropout: bool
    dtype: Any
    device: str
    cp: int = 1
    """Context-parallel degree: `seq` is the whole sequence, `tokens` mbs * seq / cp (ring attention's shapes)."""

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim


def _t(d: Dims, *shape: int, grad: bool = False, dtype: Any = None) -> torch.Tensor:
    x = torch.randn(*shape, dtype=dtype or d.dtype, device=d.device)
    return x.requires_grad_(grad)


# ------------------------------------------------------------------------------------------------------ GEMMs
def _gemm_shapes(d: Dims) -> dict[str, tuple[int, int, int]]:
    """(m, k, n) of every GEMM ops.py names: C[m,n] = A[m,k] @ B[k,n]."""
    up = 2 * d.ffn if d.gated else d.ffn
    return {"qkv_proj": (d.tokens, d.hidden, d.q + 2 * d.kv), "out_proj": (d.tokens, d.q, d.hidden),
            "mlp_up": (d.tokens, d.hidden, up), "mlp_down": (d.tokens, d.ffn, d.hidden),
            "lm_head": (d.tokens, d.hidden, d.vocab)}


def _gemm(d: Dims, base: str, part: str) -> Callable[[], Any]:
    m, k, n = _gemm_shapes(d)[base]
    x, w, dy = _t(d, m, k), _t(d, k, n), _t(d, m, n)
    if part == "fwd":
        return lambda: x @ w
    if part == "dgrad":  # dX = dY W^T
        return lambda: dy @ w.t()
    return lambda: x.t() @ dy  # dW = X^T dY


def _score_bmm(d: Dims, base: str, part: str) -> Callable[[], Any]:
    """Unfused attention's two batched GEMMs (QK^T and PV) and their gradients, all of the same size."""
    bh, s, hd = d.mbs * d.heads, d.seq, d.head_dim
    small, scores = _t(d, bh, s, hd), _t(d, bh, s, s)
    if (base, part) in (("qk_scores", "fwd"),):
        other = _t(d, bh, hd, s)
        return lambda: torch.bmm(small, other)
    if part == "wgrad" or (base, part) == ("pv", "fwd") or (base, part) == ("qk_scores", "dgrad"):
        return lambda: torch.bmm(scores, small)  # [s,s] @ [s,d]: P V, dS K, dS^T Q
    return lambda: torch.bmm(small, small.transpose(1, 2))  # pv dgrad: dO V^T


# ------------------------------------------------------------------------------------ forwards (with autograd)
def _forwards(d: Dims) -> dict[str, Callable[[bool], tuple[Callable[[], Any], list[torch.Tensor]]]]:
    """name -> builder(grad) giving (run once, inputs that take a gradient)."""
    t, tn, h, f = d.tokens, d.norm_tokens, d.hidden, d.ffn
    drop = DROPOUT if d.dropout else 0.0

    def norm(grad):
        x, w = _t(d, tn, h, grad=grad), _t(d, h, grad=grad)
        if d.norm == "rmsnorm":
            return (lambda: F.rms_norm(x, (h,), w)), [x, w]
        b = _t(d, h, grad=grad)
        return (lambda: F.layer_norm(x, (h,), w, b)), [x, w, b]

    def flash(grad):
        if d.cp > 1:
            return _ring_attention(d, grad)
        q = _t(d, d.mbs, d.heads, d.seq, d.head_dim, grad=grad)
        k, v = (_t(d, d.mbs, d.kv_heads, d.seq, d.head_dim, grad=grad) for _ in range(2))
        gqa = d.kv_heads != d.heads
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=d.causal, enable_gqa=gqa)), [q, k, v]

    def rope(grad):
        q, k = _t(d, t, d.heads, d.head_dim, grad=grad), _t(d, t, d.kv_heads, d.head_dim, grad=grad)
        cos, sin = _t(d, t, 1, d.head_dim), _t(d, t, 1, d.head_dim)

        def rotate(x):
            x1, x2 = x.chunk(2, dim=-1)
            return x * cos + torch.cat((-x2, x1), dim=-1) * sin
        return (lambda: (rotate(q), rotate(k))), [q, k]

    def residual(grad):
        x, r, b = _t(d, tn, h, grad=grad), _t(d, tn, h, grad=grad), _t(d, h, grad=grad)
        if d.bias:
            return (lambda: F.dropout(x + b, drop) + r), [x, r, b]
        return (lambda: F.dropout(x, drop) + r), [x, r]

    def unary(rows, cols, fn):
        def build(grad):
            x = _t(d, rows, cols, grad=grad)
            return (lambda: fn(x)), [x]
        return build

    def binary(rows, cols, fn):
        def build(grad):
            x, y = _t(d, rows, cols, grad=grad), _t(d, rows, cols, grad=grad)
            return (lambda: fn(x, y)), [x, y]
        return build

    def bias_gelu(grad):
        x, b = _t(d, t, f, grad=grad), _t(d, f, grad=grad)
        return (lambda: F.gelu(x + b)), [x, b]

    act = F.silu if d.act == "swiglu" else F.gelu
    s2 = (d.mbs * d.heads * d.seq, d.seq)
    scale = 1 / math.sqrt(d.head_dim)

    def masked(softmax: bool):
        def build(grad):  # the seq x seq mask only where an unfused kernel is timed: at 256k tokens it is 64 GiB
            x = _t(d, *s2, grad=grad)
            mask = torch.ones(d.seq, d.seq, dtype=torch.bool, device=d.device).triu(1)

            def run():
                y = (x * scale).view(-1, d.seq, d.seq).masked_fill(mask, -math.inf)
                return torch.softmax(y, dim=-1) if softmax else y
            return run, [x]
        return build

    def cross_entropy(grad):
        logits = _t(d, t, d.vocab, grad=grad)
        target = torch.randint(0, d.vocab, (t,), device=d.device)
        return (lambda: F.cross_entropy(logits.float(), target)), [logits]

    def pos_add(grad):
        x, pos = _t(d, d.mbs, d.seq // d.cp, h, grad=grad), _t(d, d.seq // d.cp, h, grad=grad)
        return (lambda: x + pos), [x, pos]

    def lookup(grad):
        table = _t(d, d.vocab, h)
        ids = torch.randint(0, d.vocab, (t,), device=d.device)
        return (lambda: F.embedding(ids, table)), []

    out = {"input_norm": norm, "post_attn_norm": norm, "final_norm": norm, "flash_attention": flash,
           "rope": rope, "bias_gelu": bias_gelu, "gelu": unary(t, f, F.gelu), "mlp_bias": unary(t, f, lambda x: x + 1.0),
           "gated_act": binary(t, f, lambda a, b: act(a) * b), "act": unary(t, f, act),
           "gate_mul": binary(t, f, torch.mul), "cross_entropy": cross_entropy, "position_add": pos_add,
           "embedding_lookup": lookup,
           "scale_mask_softmax": masked(True), "scale_mask": masked(False),
           "softmax": unary(*s2, lambda x: torch.softmax(x, dim=-1)),
           "attn_dropout": unary(*s2, lambda x: F.dropout(x, DROPOUT))}
    for block in ("attn_residual", "mlp_residual"):
        out[f"{block}_add"] = residual
        out[f"{block}_bias"] = unary(tn, h, lambda x: x + 1.0)
        out[f"{block}_dropout"] = unary(tn, h, lambda x: F.dropout(x, DROPOUT))
    return out


def _ring_attention(d: Dims, grad: bool) -> tuple[Callable[[], Any], list[torch.Tensor]]:
    """One rank's attention kernels of a load-balanced ring (Transformer Engine's context_parallel.py): the rank
    holds 2 of the 2*cp chunks (c = seq / (2cp) tokens each). Step 0 is causal attention of its 2c queries over
    its own 2c keys; each of the other cp - 1 steps is unmasked attention of 2c queries over the first c keys
    received (a rank before this one) or of the last c queries over all 2c keys (a rank after it), the same
    FLOPs; the steps alternate between the two, as a middle rank's do. Every step has its own inputs (what the
    ring passed), so the backward is the steps' kernels without gradient accumulation (cp_grad_accumulation
    times that)."""
    c, gqa = d.seq // (2 * d.cp), d.kv_heads != d.heads
    lengths = [(2 * c, 2 * c, d.causal)] + [((c, 2 * c) if i % 2 else (2 * c, c)) + (False,) for i in range(1, d.cp)]
    steps, inputs = [], []
    for s_q, s_kv, causal in lengths:
        q = _t(d, d.mbs, d.heads, s_q, d.head_dim, grad=grad)
        k, v = (_t(d, d.mbs, d.kv_heads, s_kv, d.head_dim, grad=grad) for _ in range(2))
        steps.append((q, k, v, causal))
        inputs += [q, k, v]

    def run():
        return tuple(F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                     for q, k, v, causal in steps)
    return run, inputs


def _cp_correction(d: Dims, name: str) -> Callable[[], Any]:
    """Ring attention's per-step bookkeeping (costmodel/ops.py's _cp_corrections), cp steps each. Forward: the
    step's output scaled by exp(lse_step - lse) added into the fp32 output (TE's flash_attn_fwd_out_correction;
    the log-sum-exp update of the small [b, h, s] statistics is not timed). Backward: the step's dQ added into
    an fp32 dQ, its dK and dV into fp32 dK, dV."""
    t, cp = d.tokens, d.cp
    if name == "cp_out_correction":
        s = t // d.mbs
        acc = torch.zeros(d.mbs, d.heads, s, d.head_dim, dtype=torch.float32, device=d.device)
        outs = [_t(d, d.mbs, d.heads, s, d.head_dim) for _ in range(cp)]
        lses = [_t(d, d.mbs, d.heads, s, dtype=torch.float32) for _ in range(cp)]
        lse = torch.logsumexp(torch.stack(lses), dim=0)  # the statistics' update, done as the steps arrive

        def merge():
            for out, step_lse in zip(outs, lses):
                acc.add_(out * torch.exp(step_lse - lse).unsqueeze(-1))
            return acc
        return merge
    dq, dkv = (torch.zeros(t, w, dtype=torch.float32, device=d.device) for w in (d.q, 2 * d.kv))
    steps = [(_t(d, t, d.q), _t(d, t, 2 * d.kv)) for _ in range(cp)]

    def accumulate():
        for step_dq, step_dkv in steps:
            dq.add_(step_dq)
            dkv.add_(step_dkv)
        return dq, dkv
    return accumulate


def _unfused_add(d: Dims) -> Callable[[bool], tuple[Callable[[], Any], list[torch.Tensor]]]:
    """The plain residual add of the unfused variant (bias and dropout are their own ops there)."""
    def build(grad):
        x, r = _t(d, d.norm_tokens, d.hidden, grad=grad), _t(d, d.norm_tokens, d.hidden, grad=grad)
        return (lambda: x + r), [x, r]
    return build


def _backward(build) -> Callable[[], Any]:
    run, inputs = build(True)
    out = run()
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn_like(o) for o in outs]
    return lambda: torch.autograd.grad(outs, inputs, grads, retain_graph=True)


def _embedding_grad(d: Dims) -> Callable[[], Any]:
    """Scatter-add of T gradient rows into the fp32 gradient of the vocabulary shard."""
    grad = torch.zeros(d.vocab, d.hidden, dtype=torch.float32, device=d.device)
    ids = torch.randint(0, d.vocab, (d.tokens,), device=d.device)
    dy = _t(d, d.tokens, d.hidden)
    return lambda: grad.index_add_(0, ids, dy.float())


def kernel(name: str, d: Dims, *, unfused: bool = False) -> Callable[[], Any]:
    """The op `name` (as ops.py names it) at sizes `d`, ready to run; SpecError if autotune has no kernel."""
    base, _, part = name.rpartition("_")
    if part in ("dgrad", "wgrad"):
        if base in ("qk_scores", "pv"):
            return _score_bmm(d, base, part)
        if base in _gemm_shapes(d):
            return _gemm(d, base, part)
    if name in _gemm_shapes(d):
        return _gemm(d, name, "fwd")
    if name in ("qk_scores", "pv"):
        return _score_bmm(d, name, "fwd")
    if name == "embedding_grad":
        return _embedding_grad(d)
    if name in ("cp_out_correction", "cp_grad_accumulation"):
        return _cp_correction(d, name)
    forwards = _forwards(d)
    if unfused:
        forwards.update({"attn_residual_add": _unfused_add(d), "mlp_residual_add": _unfused_add(d)})
    if part == "bwd" and base in forwards:
        return _backward(forwards[base])
    if name in forwards:
        run, _ = forwards[name](False)
        return run
    raise SpecError(f"no torch kernel for op {name!r}; autotune profile cannot time it")
