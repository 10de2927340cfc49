"""The operators of one Transformer layer and of the vocabulary layers, each with FLOPs AND bytes moved.

Paper 5 (Ivanov et al., "Data movement is all you need") shows that norms and element-wise operators take a
large share of training time although they have few FLOPs, so every operator carries both, and the roofline in
compute.py charges it the slower of the two. Fusion is a property of the list: a fused kernel is one op that
reads its inputs once; the unfused variant is several ops that each round-trip through HBM.

Shapes are per GPU: T = mbs * seq/cp tokens, heads and MLP width divided by tp; with sequence parallelism
the norms and dropouts see T/tp tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.specs.model import ModelSpec

Category = Literal["gemm", "attention", "norm", "elementwise", "vocab"]
CATEGORIES: tuple[Category, ...] = ("gemm", "attention", "norm", "elementwise", "vocab")


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel launch (or one fused kernel) of a forward or backward pass."""

    name: str
    category: Category
    flops: float
    bytes: float
    """Bytes read plus bytes written in HBM."""
    kernel: Literal["gemm", "attention", "memory"]
    """Which efficiency applies: tensor-core GEMM, fused attention, or memory-bound."""
    dims: tuple[float, ...] = ()
    """The shape the kernel's efficiency depends on: a GEMM's output rows, columns and inner size (m, n, k);
    fused attention's query length per sequence and whether it is a backward pass (s_q, 1.0 = backward)."""
    groups: int = 1
    """A grouped GEMM (the experts of an MoE layer): `groups` GEMMs of shape dims launched as one kernel; its
    tiles fill the SMs' waves together."""


@dataclass(frozen=True, slots=True)
class LayerShape:
    """The per-GPU sizes one layer's operators work on."""

    tokens: int
    """Tokens of one micro-batch on this GPU: mbs * seq / cp."""
    kv_tokens: int
    """Keys each query attends over: the full sequence times mbs (context parallelism splits only queries)."""
    mbs: int
    tp: int
    sp: bool
    elem: int
    """Bytes per activation element (2 for bf16/fp16)."""
    flash: bool
    fused: bool
    fp8: bool = False
    """FP8 linear layers (Transformer Engine, torchao float8): GEMM inputs are cast to 1-byte copies."""
    ep: int = 1
    """Expert-parallel degree (MoE layers only)."""
    etp: int = 1
    """Expert-tensor-parallel degree (MoE layers only)."""
    imbalance: float = 1.0
    """Tokens of the busiest expert over the mean (MoE layers only; costmodel/moe.py)."""
    dispatcher: str = "alltoall"
    """MoE token dispatcher (JobSpec.moe_dispatcher): 'alltoall' (NCCL) or 'deepep' (DeepEP's fused kernels)."""
    cross_entropy: str = "unfused"
    """The loss kernel over the logits (JobSpec.runs_cross_entropy): 'unfused', 'native' or 'te'."""
    main_grad: int = 0
    """Bytes per weight a weight-gradient GEMM reads and writes into the main gradient (_wgrad_bytes); 0: none."""

    @property
    def norm_tokens(self) -> float:
        """Tokens seen by norms, dropouts and residual adds (split over tp under sequence parallelism)."""
        return self.tokens / self.tp if self.sp else self.tokens


def _gemm(name: str, m: float, k: float, n: float, elem: int, category: Category = "gemm") -> Op:
    """C[m,n] = A[m,k] @ B[k,n]: 2mkn FLOPs; reads A and B, writes C."""
    return Op(name, category, 2.0 * m * k * n, elem * (m * k + k * n + m * n), "gemm", (m, n, k))


def _memory_op(name: str, category: Category, flops: float, nbytes: float) -> Op:
    return Op(name, category, flops, nbytes, "memory")


def layer_forward_ops(model: ModelSpec, shape: LayerShape, moe: bool | None = None) -> tuple[Op, ...]:
    """Forward operators of one Transformer block on one GPU, in execution order. `moe`: an MoE block (router,
    permutation, grouped expert GEMMs; costmodel/moe.py) or a dense one; None = MoE for an MoE model."""
    t, e, tp = shape.tokens, shape.elem, shape.tp
    tn = shape.norm_tokens
    h = model.hidden_size
    q, kv = model.q_width / tp, model.kv_width / tp
    f = model.ffn_hidden_size / tp
    mlp_up = 2 * f if model.gated else f
    ops = [_norm("input_norm", model, tn, h, e, shape.fused)]
    if model.mla:
        ops.extend(mla_projections(model, shape))
    else:
        ops.append(_gemm("qkv_proj", t, h, q + 2 * kv, e))
    if model.qk_norm:  # an RMSNorm over each query and key head (head_dim wide), before RoPE
        ops.append(_norm("qk_norm", model, t, q + kv, e, shape.fused))
    if model.position_embedding == "rope":
        # fused: read and write q and k once; eager (torchtitan's complex-number form): upcast to fp32, complex
        # multiply with the frequencies, cast back: e + 4, 4 + 4, 4 + e bytes per element
        per = 2.0 * e if shape.fused else 2.0 * e + 16.0
        ops.append(_memory_op("rope", "elementwise", 3.0 * t * (q + kv), per * t * (q + kv)))
    ops.extend(_attention_forward(model, shape, q, kv))
    ops.extend(_cp_corrections(shape, q, kv, "fwd"))
    ops.append(_gemm("out_proj", t, model.num_heads * model.v_head_dim / tp if model.mla else q, h, e))
    ops.extend(_dropout_residual("attn_residual", model, shape, tn, h))
    ops.append(_norm("post_attn_norm", model, tn, h, e, shape.fused))
    if model.is_moe if moe is None else moe:
        from autotune.costmodel.moe import moe_forward_ops  # moe.py builds on this module's helpers
        ops.extend(moe_forward_ops(model, shape))
    else:
        ops.append(_gemm("mlp_up", t, h, mlp_up, e))
        ops.extend(_activation(model, shape, t, f))
        ops.append(_gemm("mlp_down", t, f, h, e))
    ops.extend(_dropout_residual("mlp_residual", model, shape, tn, h))
    if shape.fp8:
        ops.extend(fp8_casts(ops, "x", shape.fused))
    return tuple(ops)


#: Linear layers whose FP8 input comes out of a fused kernel: Transformer Engine's LayerNormLinear and
#: LayerNormMLP write the normalized input, and the MLP's activation writes its output, directly in FP8
#: (torch.compile fuses torchao's casts the same way), so only the FP8 copies are extra traffic.
FP8_FUSED_INPUTS = ("qkv_proj", "mlp_up", "mlp_down")


def fp8_casts(ops: list[Op] | tuple[Op, ...], side: str, fused: bool = True) -> list[Op]:
    """Transformer Engine's cast-transpose kernels of FP8 training: before each linear layer's forward GEMM its
    16-bit input is read once and written as an FP8 copy and an FP8 transpose (for the weight gradient); in
    the backward the output gradient likewise (TE's `cast_transpose`, memory-bound, 2 + 1 + 1 bytes per
    element). Where the producer of the input is fused with the cast (FP8_FUSED_INPUTS) only the two FP8
    writes remain. Weights are cast once per step (TE caches them across micro-batches), which is left out."""
    out = []
    for op in ops:
        if op.kernel != "gemm" or not op.dims or op.category != "gemm":
            continue
        m, n, k = op.dims
        elems = (m * k if side == "x" else m * n) * op.groups
        per = 2.0 if side == "x" and fused and op.name in FP8_FUSED_INPUTS else 4.0
        out.append(_memory_op(f"{op.name}_fp8_cast", "elementwise", 2.0 * elems, per * elems))
    return out


def mla_projections(model: ModelSpec, shape: LayerShape) -> list[Op]:
    """Multi-head latent attention's projections (DeepSeek-V2, Sec. 2.1): the query and key/value down-projections
    (replicated over tp, as Megatron builds them), their latents' norms and the up-projections (split over tp)."""
    t, e, tp, h, heads = shape.tokens, shape.elem, shape.tp, model.hidden_size, model.num_heads
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    # each latent is normalized before its up-projection (q_a_layernorm, kv_a_layernorm)
    ops = [_gemm("q_down_proj", t, h, model.q_lora_rank, e),
           _norm("q_latent_norm", model, t, model.q_lora_rank, e, shape.fused),
           _gemm("q_up_proj", t, model.q_lora_rank, heads * qk / tp, e)] if model.q_lora_rank else [
        _gemm("q_proj", t, h, heads * qk / tp, e)]
    ops += [_gemm("kv_down_proj", t, h, model.kv_lora_rank + model.qk_rope_head_dim, e),
            _norm("kv_latent_norm", model, t, model.kv_lora_rank, e, shape.fused),
            _gemm("kv_up_proj", t, model.kv_lora_rank, heads * (model.qk_nope_head_dim + model.v_head_dim) / tp, e)]
    return ops


def _norm(name: str, model: ModelSpec, tokens: float, h: int, e: int, fused: bool = True) -> Op:
    """LayerNorm/RMSNorm. Fused: read x and the weight, write y (statistics in registers). Unfused (PyTorch's
    composite rms_norm/layer_norm in eager mode): upcast to fp32, square, mean, scale by the reciprocal root,
    cast back, multiply by the weight, each a pass over the activations: (e + 4) + (4 + 4) + 4 + (4 + 4) +
    (4 + e) + (e + e) bytes per element."""
    flops_per = 8 if model.norm == "layernorm" else 5
    per = 2 * e if fused else 28 + 4 * e
    return _memory_op(name, "norm", flops_per * tokens * h, per * tokens * h + e * h)


def _attention_forward(model: ModelSpec, shape: LayerShape, q: float, kv: float) -> list[Op]:
    """Core attention. Flash: one kernel reading Q, K, V and writing O; causal masking skips half the tiles.
    Unfused: two batched GEMMs around a softmax that round-trips the s x s score matrix through HBM (a
    sliding window is only a mask there: every score is still computed and stored).

    Sliding-window layers (model.sliding_window shorter than the sequence) run flash attention over the band
    of windowed_key_pairs instead of the causal triangle. All layers are costed as one mean layer, so the
    attention is split by the windowed share of the layers: (1 - share) of a full causal kernel's work and
    traffic plus share of a windowed kernel's (window_attention_op); a full-attention model gets the one op."""
    t, e, b = shape.tokens, shape.elem, shape.mbs
    heads = q / model.head_dim
    s_q, s_kv = t / b, shape.kv_tokens / b
    score_flops = 2.0 * b * heads * s_q * s_kv * model.head_dim  # one of QK^T or PV
    if shape.flash:
        causal = 0.5 if model.causal else 1.0
        io = e * (t * (q + 2 * kv) + t * q)
        # context parallelism (Transformer Engine's load-balanced ring): the first step is a causal kernel over the
        # local seq/cp queries and keys, 1/cp of the work; every later step an unmasked block whose shorter side is
        # one of the 2*cp chunks, seq/(2cp)
        cp = cp_degree(shape)
        full = Op("flash_attention", "attention", 2 * score_flops * causal, io, "attention",
                  (s_q, 0.0, model.head_dim, 1.0 / cp, s_q / 2) if cp > 1 else (s_q, 0.0, model.head_dim))
        share = windowed_share(model, s_kv)
        if not share:
            return [full]
        window = window_attention_op(model, b * heads, s_kv, cp, io)
        ops = [] if share == 1.0 else [Op(full.name, full.category, (1.0 - share) * full.flops,
                                          (1.0 - share) * full.bytes, full.kernel, full.dims)]
        return ops + [Op(window.name, window.category, share * window.flops, share * window.bytes, window.kernel,
                         window.dims)]
    scores = b * heads * s_q * s_kv
    ops = [Op("qk_scores", "attention", score_flops, e * (t * q + shape.kv_tokens * kv + scores), "gemm")]
    if shape.fused:
        ops.append(_memory_op("scale_mask_softmax", "attention", 5.0 * scores, 2.0 * e * scores))
    else:
        ops += [_memory_op("scale_mask", "attention", 2.0 * scores, 2.0 * e * scores),
                _memory_op("softmax", "attention", 3.0 * scores, 2.0 * e * scores)]
    if model.dropout:
        ops.append(_memory_op("attn_dropout", "attention", scores, 2.0 * e * scores + scores))
    ops.append(Op("pv", "attention", score_flops, e * (scores + shape.kv_tokens * kv + t * q), "gemm"))
    return ops


def windowed_key_pairs(seq: float, window: int, chunked: bool = False) -> float:
    """Query-key pairs of one sequence's causal windowed attention: query i (1-based) sees min(i, w) keys, s*w -
    w(w-1)/2 (s(s+1)/2 when s <= w); chunked (Llama 4), a triangle w(w+1)/2 per whole chunk, r(r+1)/2 for the rest."""
    if seq <= window:
        return seq * (seq + 1) / 2
    if chunked:
        return (seq // window) * window * (window + 1) / 2 + (seq % window) * (seq % window + 1) / 2
    return seq * window - window * (window - 1) / 2


def windowed_share(model: ModelSpec, seq: float) -> float:
    """Share of the layers whose attention the window shortens: the windowed layers' share when the window is
    shorter than the sequence, else 0 (every query's causal prefix fits in the window: nothing changes)."""
    return model.sliding_share if 0 < model.sliding_window < seq else 0.0


def window_attention_op(model: ModelSpec, heads: float, seq: float, cp: int, io: float) -> Op:
    """One windowed layer's flash attention: QK^T and PV over windowed_key_pairs (2 matmuls x 2 FLOPs x d per
    pair and head; `heads` = micro-batch sequences x this GPU's heads), split evenly over the cp ranks, and the
    same Q, K, V, O traffic as the full kernel. Its speed is the causal kernel's at query length w: with tiles
    of B keys, each query tile computes the w/B + 1 key tiles its window spans, so w/(w + B) of the computed
    scores are unmasked, the same share as in a causal kernel over w queries (n/(n+1) with n = w/B): the
    measured short-sequence speed carries the same masking waste. With cp > 1 the op is this rank's even share
    of the work; the ring's exchange and corrections stay charged as for full attention (not modelled: a
    windowed layer needs only its neighbour's keys)."""
    flops = 4.0 * heads * model.head_dim * windowed_key_pairs(seq, model.sliding_window, model.chunked_attention) / cp
    return Op("flash_attention_window", "attention", flops, io, "attention",
              (float(model.sliding_window), 0.0, model.head_dim))


def cp_degree(shape: LayerShape) -> int:
    """Context-parallel degree implied by the shape (keys span the whole sequence, queries 1/cp of it)."""
    return max(1, round(shape.kv_tokens / shape.tokens)) if shape.tokens else 1


def _cp_corrections(shape: LayerShape, q: float, kv: float, direction: str) -> list[Op]:
    """Ring attention's per-step bookkeeping, memory-bound (Transformer Engine's context_parallel.py): every
    one of the cp steps merges its partial output into fp32 accumulators with the log-sum-exp correction
    (read the step's 16-bit output, read and write the fp32 output); the backward accumulates dQ in fp32 on
    the query side and dK, dV in fp32 on the key/value side at every step."""
    cp = cp_degree(shape)
    if cp == 1 or not shape.flash:
        return []
    t, e = shape.tokens, shape.elem
    if direction == "fwd":
        return [_memory_op("cp_out_correction", "attention", 4.0 * cp * t * q, cp * t * q * (e + 8))]
    return [_memory_op("cp_grad_accumulation", "attention", 2.0 * cp * t * (q + 2 * kv),
                       cp * t * (q + 2 * kv) * (e + 8))]


def _dropout_residual(name: str, model: ModelSpec, shape: LayerShape, tokens: float, h: int) -> list[Op]:
    """Bias + dropout + residual add: fused it reads x and the residual once and writes once."""
    e, n = shape.elem, tokens * h
    mask = n if model.dropout else 0.0
    if shape.fused or not (model.dropout or model.bias == "all"):
        return [_memory_op(f"{name}_add", "elementwise", 3.0 * n, 3.0 * e * n + mask)]
    ops = []
    if model.bias == "all":
        ops.append(_memory_op(f"{name}_bias", "elementwise", n, 2.0 * e * n))
    if model.dropout:
        ops.append(_memory_op(f"{name}_dropout", "elementwise", n, 2.0 * e * n + mask))
    ops.append(_memory_op(f"{name}_add", "elementwise", n, 3.0 * e * n))
    return ops


def _activation(model: ModelSpec, shape: LayerShape, t: float, f: float) -> list[Op]:
    """GeLU (with bias) or a gated unit (act(x1) * x2)."""
    e, n = shape.elem, t * f
    if model.gated:
        if shape.fused:
            return [_memory_op("gated_act", "elementwise", 6.0 * n, 3.0 * e * n)]
        return [_memory_op("act", "elementwise", 4.0 * n, 2.0 * e * n),
                _memory_op("gate_mul", "elementwise", n, 3.0 * e * n)]
    if shape.fused or model.bias != "all":
        return [_memory_op("bias_gelu", "elementwise", 9.0 * n, 2.0 * e * n)]
    return [_memory_op("mlp_bias", "elementwise", n, 2.0 * e * n), _memory_op("gelu", "elementwise", 8.0 * n, 2.0 * e * n)]


#: Memory-bound ops whose backward moves another multiple of their forward traffic (and FLOPs) than the
#: generic two (costmodel/moe.py): a pure permutation (the MoE token permute and the re-sorts by expert) has
#: no saved input to read, its backward is the inverse permutation of the gradient, 1x; a clamp's backward
#: reads the gradient and its saved input and writes one gradient, 3 planes against the forward's 2, 1.5x;
#: the cat after the clamps is a chunk's backward (one copy of the gradient halves into one tensor), 1x.
BACKWARD_TRAFFIC = {"permute": 1.0, "sort_by_expert": 1.0, "unsort_by_expert": 1.0, "permute_by_experts": 1.0,
                    "expert_clamp_glu": 1.5, "expert_clamp_linear": 1.5, "expert_clamp_cat": 1.0}


def backward_ops(forward: tuple[Op, ...], model: ModelSpec, shape: LayerShape) -> tuple[Op, ...]:
    """Backward of a list of forward ops.

    A GEMM's backward is two GEMMs (input gradient and weight gradient) of the same size. Flash attention's
    backward recomputes the scores: 5 score-sized matmuls instead of 2 (Dao 2023), 2.5x the forward FLOPs, and
    reads Q, K, V, O, dO and writes dQ, dK, dV. A memory-bound op's backward reads the saved input and the
    incoming gradient and writes one gradient: about twice its forward traffic, except the ops
    BACKWARD_TRAFFIC names (permutations, clamps).
    """
    out = []
    for op in forward:
        if op.kernel == "gemm":
            m, n, k = op.dims or (0.0, 0.0, 0.0)
            # dX[m,k] = dY[m,n] @ W^T and dW[k,n] = X^T @ dY: the same FLOPs, other output shapes
            out.append(Op(op.name + "_dgrad", op.category, op.flops, op.bytes, "gemm", (m, k, n) if op.dims else (),
                          op.groups))
            out.append(Op(op.name + "_wgrad", op.category, op.flops, _wgrad_bytes(op, shape), "gemm",
                          (k, n, m) if op.dims else (), op.groups))
        elif op.kernel == "attention":
            dims = (op.dims[0], 1.0, *op.dims[2:]) if op.dims else ()  # the same kernels' backward
            out.append(Op(op.name + "_bwd", op.category, 2.5 * op.flops, 2.0 * op.bytes, "attention", dims))
        elif op.name == "cp_out_correction":
            out.extend(_cp_corrections(shape, model.q_width / shape.tp, model.kv_width / shape.tp, "bwd"))
        elif not op.name.endswith("_fp8_cast"):
            share = BACKWARD_TRAFFIC.get(op.name, 2.0)
            out.append(Op(op.name + "_bwd", op.category, share * op.flops, share * op.bytes, "memory"))
    if shape.fp8:
        out.extend(fp8_casts(forward, "dy"))
    return tuple(out)


def _wgrad_bytes(op: Op, shape: LayerShape) -> float:
    """A weight gradient's traffic. Megatron's gradient-accumulation fusion (config.gradient_accumulation_fusion,
    on in Megatron-LM and NeMo, is TE's fuse_wgrad_accumulation: accumulate=True into main_grad) reads and writes
    the output at the buffer's precision: an expert's over a thousand tokens is memory-bound."""
    if not shape.main_grad or not op.dims or op.category == "attention":
        return op.bytes
    _, n, k = op.dims
    return op.bytes + (2 * shape.main_grad - shape.elem) * op.groups * k * n


def embedding_forward_ops(model: ModelSpec, shape: LayerShape) -> tuple[Op, ...]:
    """Input embedding: a gather of T rows of the (vocab-parallel) table, written out as activations."""
    t, e, h = shape.tokens, shape.elem, model.hidden_size
    ops = [_memory_op("embedding_lookup", "vocab", 0.0, 2.0 * e * t * h)]
    if model.position_embedding == "learned":
        ops.append(_memory_op("position_add", "vocab", t * h, 3.0 * e * t * h))
    return tuple(ops)


def embedding_backward_ops(model: ModelSpec, shape: LayerShape) -> tuple[Op, ...]:
    """Embedding gradient: scatter-add T rows into the fp32 gradient of the table."""
    t, e, h = shape.tokens, shape.elem, model.hidden_size
    return (_memory_op("embedding_grad", "vocab", t * h, e * t * h + 2 * 4 * t * h),)


def head_forward_ops(model: ModelSpec, shape: LayerShape) -> tuple[Op, ...]:
    """Final norm, LM head (vocab-parallel over tp) and the cross-entropy in fp32 over V/tp logits."""
    t, e, h = shape.tokens, shape.elem, model.hidden_size
    v = model.vocab_size / shape.tp
    logits = t * v
    return (
        _norm("final_norm", model, shape.norm_tokens, h, e, shape.fused),
        _gemm("lm_head", t, h, v, e, category="vocab"),
        _memory_op("cross_entropy", "vocab", 5.0 * logits, logits * cross_entropy_bytes(shape)[0]),
    )


def cross_entropy_bytes(shape: LayerShape) -> tuple[int, int]:
    """Bytes moved per logit by the loss's forward and backward, as each implementation runs them (e = 16-bit).
    'unfused', megatron-core's vocab_parallel_cross_entropy (tensor_parallel/cross_entropy.py) as separate fp32
    passes: cast (read e, write 4), max (read 4), subtract the max (read, write), exp (read, write), sum (read),
    divide (read, write the softmax kept for the backward) = e + 36; backward: the one-hot update touches one logit
    per token, then the gradient is scaled in place (read 4, write 4) and cast by autograd to the 16-bit logits'
    dtype (read 4, write e) = 12 + e. PyTorch's F.cross_entropy on upcast logits (torchtitan, DeepSpeed) moves about
    as much over both passes. 'native', megatron-core's fused_cross_entropy.py under torch.compile (core/jit.py), one
    kernel per fused function: the fp32 copy and its max (read e, write 4), subtract, exp and sum (read 4, write 4),
    divide (read 4, write 4) = e + 20; backward: update, scale and cast in one kernel that also writes back the
    softmax it mutates, a graph input (read 4, write 4 + e). 'te', Transformer Engine 2.8's triton/cross_entropy.py:
    online_softmax_kernel reads the logits (e), cross_entropy_kernel reads them again and writes the gradient over
    them (2e); backward: element_mul_kernel scales it by the per-token loss gradient (read e, write e), which
    Megatron's masked loss always passes (not the scalar 1.0 it skips for)."""
    e = shape.elem
    if shape.cross_entropy == "native":
        return e + 20, 8 + e
    if shape.cross_entropy == "te":
        return 3 * e, 2 * e
    return e + 36, 12 + e


def head_backward_ops(model: ModelSpec, shape: LayerShape) -> tuple[Op, ...]:
    """Cross-entropy gradient (cross_entropy_bytes), LM head GEMMs, final norm."""
    logits = shape.tokens * model.vocab_size / shape.tp
    forward = head_forward_ops(model, shape)
    ce_grad = _memory_op("cross_entropy_bwd", "vocab", 2.0 * logits, logits * cross_entropy_bytes(shape)[1])
    return (ce_grad,) + backward_ops((forward[1], forward[0]), model, shape)
