"""Tensor-parallel modes (paper 2): 1-D, 2-D, 2.5-D and 3-D, each with its degrees, communication and memory.

Sources, one per mode:
- 1-D: Shoeybi et al., "Megatron-LM" (2019, arXiv 1909.08053), Section 3: column- then row-parallel GEMMs, two
  all-reduces of the b*s*h activation per block per pass (g in the forward, f in the backward).
- 2-D: Xu et al., "An Efficient 2D Method for Training Super-Large Deep Learning Models" (Optimus, 2021,
  arXiv 2104.05343): SUMMA (van de Geijn & Watts 1997) on a q x q grid. C_ij = sum_k A_ik B_kj in q steps; step k
  broadcasts A_ik along row i and B_kj along column j. Backward: dA_ik = sum_j dC_ij B_kj^T (broadcast B along
  columns, reduce the partial dA along rows) and dB_kj = sum_i A_ik^T dC_ij (broadcast A along rows, reduce dB
  along columns), so twice the forward traffic. Activations, weights and attention heads are all split q^2 ways.
- 2.5-D: Wang et al., "Tesseract: Parallelize the Tensor Parallelism Efficiently" (2021, arXiv 2105.14500):
  d stacked q x q SUMMA grids; the activation rows are split over d*q, each weight over q^2 and replicated over
  the depth d (its gradient is all-reduced over d once per step, like data parallelism).
- 3-D: Bian et al., "Maximizing Parallelism in Distributed Training for Huge Neural Networks" (2021,
  arXiv 2105.14450), after Agarwal et al.'s 3-D matmul (1995): a q x q x q cube (i, j, l). Forward of C = AB:
  all-gather A_il along j, all-gather B_lj along i, C_ij^(l) = A_il B_lj, reduce-scatter along l. Backward:
  all-gather dC along l, reduce-scatter dA = dC B^T along j and dB = A^T dC along i. Every collective moves a
  1/q^2 block of its matrix within a group of q. Consecutive linears swap the roles of j and l.

Ranks are numbered with the innermost grid axis fastest (j, then l or the row index, then i or depth), so a
group's `stride` decides through `comm.group_link` whether it stays inside a node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.costmodel import comm
from autotune.costmodel.memory import layer_activations, layer_params
from autotune.costmodel.ops import LayerShape
from autotune.errors import InvalidPlanError
from autotune.specs.hardware import HardwareSpec
from autotune.specs.model import ModelSpec
from autotune.units import FP32_BYTES
from autotune.specs.tpgrid import MODES, Mode, TPGrid, check_tp_shapes, tp_mode_degrees  # noqa: F401 (re-exported)

Kind = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]


# ---------------------------------------------------------------------------------------------- communication
@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """`count` identical collectives of one pass of one layer and micro-batch."""

    kind: Kind
    count: int
    group: int
    """Ranks taking part."""
    stride: int
    """Rank distance between group members (decides the link tier)."""
    nbytes: float
    """Buffer as comm.py takes it: the full (reduced / gathered / broadcast) buffer on each rank."""
    what: str

    @property
    def volume(self) -> float:
        """Bytes one device receives, averaged over the group, for all `count`: 2(n-1)/n*B for an all-reduce,
        (n-1)/n*B for all-gather, reduce-scatter, broadcast and reduce (Thakur et al. 2005)."""
        factor = 2 if self.kind == "all_reduce" else 1
        return self.count * factor * (self.group - 1) / self.group * self.nbytes

    def seconds(self, hw: HardwareSpec) -> float:
        link = comm.group_link(hw, self.group, self.stride)
        if self.kind in ("broadcast", "reduce"):
            one = _pipelined_ring(self.nbytes, self.group, link)
        else:
            one = getattr(comm, self.kind)(self.nbytes, self.group, link)
        return self.count * one


def _pipelined_ring(nbytes: float, n: int, link: comm.Link) -> float:
    """NCCL's broadcast and reduce: a pipelined ring, n-1 latency steps and the buffer once on each link."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return comm.ring_latency(n, link) + nbytes / link.bandwidth


@dataclass(frozen=True, slots=True, kw_only=True)
class TPLayerComm:
    """Tensor-parallel collectives of one Transformer layer, one micro-batch."""

    grid: TPGrid
    fwd: tuple[Collective, ...]
    bwd: tuple[Collective, ...]
    per_step: tuple[Collective, ...] = ()
    """Once per optimizer step, not per micro-batch (2.5-D weight-gradient all-reduce over the depth)."""

    @property
    def fwd_bytes(self) -> float:
        return sum(c.volume for c in self.fwd)

    @property
    def bwd_bytes(self) -> float:
        return sum(c.volume for c in self.bwd)


def layer_gemms(model: ModelSpec) -> tuple[tuple[str, int, int], ...]:
    """(name, K, N) of the four linear layers of a block, in order; M is the token count."""
    h, up = model.hidden_size, (2 if model.gated else 1) * model.ffn_hidden_size
    return (("qkv", h, model.q_width + 2 * model.kv_width), ("out", model.q_width, h),
            ("up", h, up), ("down", model.ffn_hidden_size, h))


def layer_tp_comm(mode: str, model: ModelSpec, *, tp: int, tokens: int, elem: int = 2,
                  depth: int | None = None) -> TPLayerComm:
    """Which collectives, how many, over which group, how many bytes, forward and backward."""
    grid = tp_mode_degrees(mode, tp, depth=depth)
    if tp == 1:
        return TPLayerComm(grid=grid, fwd=(), bwd=())
    m, e, h = tokens, elem, model.hidden_size
    if grid.mode == "1d":  # Megatron: g after attention and after the MLP; f in the backward
        ar = Collective(kind="all_reduce", count=2, group=tp, stride=1, nbytes=e * m * h, what="block output")
        return TPLayerComm(grid=grid, fwd=(ar,), bwd=(ar,))
    if grid.mode == "3d":
        return _comm_3d(grid, model, m, e)
    return _comm_summa(grid, model, m, e)


def _comm_summa(grid: TPGrid, model: ModelSpec, m: int, e: int) -> TPLayerComm:
    """2-D / 2.5-D: per GEMM, q row broadcasts of A blocks and q column broadcasts of B blocks (forward);
    q of each broadcast plus q row and q column reduces (backward). Rows stride 1, columns stride q."""
    q, d = grid.q, grid.depth
    fwd, bwd, step = [], [], []
    for name, k, n in layer_gemms(model):
        a, b = e * m * k / (d * q * q), e * k * n / (q * q)
        fwd += [Collective(kind="broadcast", count=q, group=q, stride=1, nbytes=a, what=f"{name} A"),
                Collective(kind="broadcast", count=q, group=q, stride=q, nbytes=b, what=f"{name} W")]
        bwd += [Collective(kind="broadcast", count=q, group=q, stride=q, nbytes=b, what=f"{name} W (for dA)"),
                Collective(kind="reduce", count=q, group=q, stride=1, nbytes=a, what=f"{name} dA"),
                Collective(kind="broadcast", count=q, group=q, stride=1, nbytes=a, what=f"{name} A (for dW)"),
                Collective(kind="reduce", count=q, group=q, stride=q, nbytes=b, what=f"{name} dW")]
        if d > 1:
            step.append(Collective(kind="all_reduce", count=1, group=d, stride=q * q, nbytes=FP32_BYTES * k * n / (q * q),
                                   what=f"{name} dW over depth"))
    ln = _norm_stats(model, m / (d * q), group=q, stride=1)
    return TPLayerComm(grid=grid, fwd=tuple(fwd) + ln, bwd=tuple(bwd) + ln, per_step=tuple(step))


def _comm_3d(grid: TPGrid, model: ModelSpec, m: int, e: int) -> TPLayerComm:
    """Bian et al.: per GEMM 3 collectives each way over groups of q, each a 1/q^2 block. Axis j has stride 1,
    l stride q, i stride q^2; the input/output axes (j, l) swap from one linear to the next."""
    q = grid.q
    fwd, bwd = [], []
    for idx, (name, k, n) in enumerate(layer_gemms(model)):
        s_in, s_out = (1, q) if idx % 2 == 0 else (q, 1)
        a, w, c = e * m * k / q**2, e * k * n / q**2, e * m * n / q**2
        fwd += [Collective(kind="all_gather", count=1, group=q, stride=s_in, nbytes=a, what=f"{name} A"),
                Collective(kind="all_gather", count=1, group=q, stride=q * q, nbytes=w, what=f"{name} W"),
                Collective(kind="reduce_scatter", count=1, group=q, stride=s_out, nbytes=c, what=f"{name} C")]
        bwd += [Collective(kind="all_gather", count=1, group=q, stride=s_out, nbytes=c, what=f"{name} dC"),
                Collective(kind="reduce_scatter", count=1, group=q, stride=s_in, nbytes=a, what=f"{name} dA"),
                Collective(kind="reduce_scatter", count=1, group=q, stride=q * q, nbytes=w, what=f"{name} dW")]
    ln = _norm_stats(model, m / q**2, group=q, stride=1)
    return TPLayerComm(grid=grid, fwd=tuple(fwd) + ln, bwd=tuple(bwd) + ln)


def _norm_stats(model: ModelSpec, local_tokens: float, *, group: int, stride: int) -> tuple[Collective, ...]:
    """The hidden dimension is split, so each of the two norms all-reduces fp32 statistics per local token
    (sum and sum of squares for LayerNorm, Optimus Section 3; one sum of squares for RMSNorm)."""
    stats = 2 if model.norm == "layernorm" else 1
    return (Collective(kind="all_reduce", count=2, group=group, stride=stride,
                       nbytes=FP32_BYTES * stats * local_tokens, what="norm statistics"),)


@dataclass(frozen=True, slots=True)
class TPCommTime:
    fwd_s: float
    bwd_s: float


def layer_tp_comm_s(mode: str, model: ModelSpec, hw: HardwareSpec, *, tp: int, tokens: int, elem: int = 2,
                    depth: int | None = None) -> TPCommTime:
    """Forward and backward seconds of a layer's tensor-parallel collectives (alpha-beta, comm.py), not
    overlapped with compute."""
    c = layer_tp_comm(mode, model, tp=tp, tokens=tokens, elem=elem, depth=depth)
    return TPCommTime(sum(x.seconds(hw) for x in c.fwd), sum(x.seconds(hw) for x in c.bwd))


# ---------------------------------------------------------------------------------------------- memory
@dataclass(frozen=True, slots=True)
class TPMemory:
    """One layer on one device of the tp group."""

    params: int
    """Parameters held (weights split p ways in 1-D/2-D/3-D, q^2 ways in 2.5-D)."""
    act_bytes: int
    """Activations kept for the backward, one micro-batch (no recomputation)."""
    saved_weight_bytes: int = 0
    """3-D only: the all-gathered weight blocks the backward reuses (Bian et al. Alg. 1; K*N/q^2 per GEMM)."""
    gathered_act_bytes: int = 0
    """3-D only: the all-gathered GEMM inputs kept for the weight gradients (included in act_bytes)."""


def layer_tp_memory(mode: str, model: ModelSpec, *, tp: int, tokens: int, elem: int = 2, seq_len: int | None = None,
                    flash: bool = True, depth: int | None = None) -> TPMemory:
    """Per-device parameters and activation bytes. Activations are Korthikanti et al.'s per-tensor list
    (memory.layer_activations): 1-D as Megatron keeps it; 2-D, 2.5-D and 3-D keep every tensor split p ways,
    3-D also keeps each GEMM's all-gathered input (a 1/q^2 block) for the weight gradient."""
    grid = tp_mode_degrees(mode, tp, depth=depth)
    seq = seq_len or tokens
    if tokens % seq:
        raise InvalidPlanError(f"tokens {tokens} must be a whole number of sequences of {seq}")
    mbs, split = tokens // seq, grid.act_split
    check_tp_shapes(grid, model, mbs)
    if grid.mode == "1d":
        shape = LayerShape(tokens=tokens, kv_tokens=tokens, mbs=mbs, tp=tp, sp=False, elem=elem, flash=flash,
                           fused=True)
        return TPMemory(layer_params(model, tp), layer_activations(model, shape).none)
    local = LayerShape(tokens=tokens // split, kv_tokens=tokens // split, mbs=mbs // split, tp=grid.q, sp=True,
                       elem=elem, flash=flash, fused=True)
    act = layer_activations(model, local).none
    linear = sum(k * n for _, k, n in layer_gemms(model))
    vectors = layer_params(model, 1) - linear
    weight_split = grid.q ** 2 if grid.mode == "2.5d" else tp
    params = -(-linear // weight_split) + -(-vectors // grid.q)
    saved_w = gathered = 0
    if grid.mode == "3d":
        q = grid.q
        gathered = sum(elem * tokens * k for _, k, _ in layer_gemms(model)) * (q - 1) // q**3
        saved_w = sum(elem * k * n for _, k, n in layer_gemms(model)) // q**2
    return TPMemory(params, act + gathered, saved_w, gathered)
