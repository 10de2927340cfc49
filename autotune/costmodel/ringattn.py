"""Context parallelism's exchange of keys and values, and the part of it the attention does not hide, as each
trainer runs its ring attention.

Each of the cp ranks holds 1/cp of the sequence (two load-balanced chunks) and needs every other rank's keys
and values; the attention runs in cp steps, one block of the others' keys a step, each step 1/cp of the
rank's attention work (balanced causal chunks).

- Megatron (Transformer Engine's AttnFuncWithCPAndKVP2P, cp_comm_type p2p): a ring. Each step sends this
  rank's current K/V chunk on while it computes, so the cp - 1 sends hide behind the cp - 1 steps that follow
  them; the backward passes K/V and dK/dV, twice the bytes (Liu et al. 2023, Ring Attention).
- torch's context_parallel (torchtitan; torch 2.13 distributed/tensor/experimental/_context_parallel/
  _attention.py, the default rotate method ALL_GATHER): the forward all-gathers every rank's K/V once, posted
  before step 0 and waited for at step 1, so only step 0's attention hides it. The backward all-gathers K/V
  again the same way and passes the dK/dV accumulators around the ring in fp32 (convert_to_f32: twice the
  16-bit bytes) with the ALL_TO_ALL rotater: each step's send, posted after its attention, is waited for after
  the next step's attention, and the last one, after the loop, waits in full.
"""

from __future__ import annotations

from autotune.costmodel import comm
from autotune.costmodel.ops import LayerShape
from autotune.specs.hardware import HardwareSpec
from autotune.specs.model import ModelSpec
from autotune.units import FP32_BYTES


def kv_chunk_bytes(model: ModelSpec, shape: LayerShape) -> float:
    """This rank's keys and values (its 1/cp of the sequence, its 1/tp of the key/value heads), 16-bit."""
    return 2 * shape.elem * shape.tokens * model.kv_width / shape.tp


def cp_exposed(model: ModelSpec, hw: HardwareSpec, shape: LayerShape, cp: int, trainer: str, attn_fwd_s: float,
               attn_bwd_s: float) -> tuple[float, float]:
    """Seconds of the forward's and the backward's K/V exchange that wait beyond the attention (both 0 at cp 1)."""
    if cp == 1:
        return 0.0, 0.0
    kv = kv_chunk_bytes(model, shape)
    link = comm.p2p_link(hw, cp, shape.tp)
    if trainer == "torchtitan":
        grads = kv / shape.elem * FP32_BYTES  # dK and dV, accumulated and passed on in fp32
        return torch_ring_exposed(kv, grads, cp, comm.group_link(hw, cp, shape.tp), link, attn_fwd_s, attn_bwd_s)
    step = comm.p2p(kv, link)
    hidden = (cp - 1) / cp
    return max(0.0, (cp - 1) * step - hidden * attn_fwd_s), max(0.0, 2 * (cp - 1) * step - hidden * attn_bwd_s)


def torch_ring_exposed(kv: float, grad_bytes: float, cp: int, group: comm.Link, link: comm.Link, attn_fwd_s: float,
                       attn_bwd_s: float) -> tuple[float, float]:
    """torch's context_parallel: an all-gather of the cp chunks of `kv` bytes behind one step's attention in each
    pass, and in the backward cp sends of `grad_bytes` (dK/dV), each behind the next step's attention but the
    last."""
    gather = comm.all_gather(cp * kv, cp, group)
    grads = comm.p2p(grad_bytes, link)
    step_fwd, step_bwd = attn_fwd_s / cp, attn_bwd_s / cp
    forward = max(0.0, gather - step_fwd)
    backward = max(0.0, gather - step_bwd) + (cp - 1) * max(0.0, grads - step_bwd) + grads
    return forward, backward
