"""Megatron's expert-parallel communication overlap (--overlap-moe-expert-parallel-comm, megatron-core 0.14+):
the forward of micro-batch i+1 runs beside the backward of micro-batch i, split into attention, dispatch, experts
and combine, so each one's all-to-all travels on a communication stream while the other computes (the batch-level
overlap DeepSeek-V3's DualPipe introduced). A layer's exchange then hides behind its partner pass's compute as far
as that compute lasts; what remains is exposed, and the hidden part is not free: the all-to-all's kernels hold
SMs the GEMMs beside it would use (comm.comm_interference)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from autotune.costmodel.comm import comm_interference
from autotune.specs.hardware import HardwareSpec

if TYPE_CHECKING:
    from autotune.costmodel.layer import LayerCost


def hideable_exchange(ep_fwd_s: float, ep_bwd_s: float, compute_s: float) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's all-to-all that hide when paired: a forward and a backward of the
    layer run side by side, their exchanges (ep_fwd_s + ep_bwd_s) on one stream and their compute (`compute_s`,
    the collectives on the compute stream included) on the other, so min(exchange, compute) hides, shared
    between the two passes as their exchanges are."""
    exchange = ep_fwd_s + ep_bwd_s
    if exchange <= 0:
        return 0.0, 0.0
    hidden = min(exchange, compute_s)
    return hidden * ep_fwd_s / exchange, hidden * ep_bwd_s / exchange


def paired_share(pp: int, vpp: int, micro_batches: int) -> float:
    """Share of a rank's passes that run beside a partner: megatron-core's combined schedule pairs the forward of
    one micro-batch with the backward of another in its steady phase only. Without a pipeline the first forward and
    the last backward run alone; in the interleaved schedule the first rank's warm-up forwards (2(pp - 1) + (vpp -
    1) pp, and one more for the overlap) and as many cool-down backwards do (the first rank's, the most: the share
    is a lower bound for the others)."""
    passes = vpp * micro_batches
    alone = 1 + (2 * (pp - 1) + (vpp - 1) * pp if pp > 1 else 0)
    return max(0, passes - alone) / passes


def pairing(x) -> float:
    """paired_share of a plan or a search candidate (both carry pp, vpp, num_microbatches, ep_overlap); 0.0
    without the overlap."""
    return paired_share(x.pp, x.vpp, x.num_microbatches) if x.ep_overlap else 0.0


def ep_overlapped(layer: LayerCost, hw: HardwareSpec, share: float = 1.0) -> LayerCost:
    """The layer under the overlap, `share` of its passes paired (pairing): that share of its hideable exchange
    leaves the passes' exposed communication, less the SMs it holds while hidden; one more micro-batch's forward
    activations of a layer live at the peak (the forward of i+1 allocates before the backward of i frees,
    megatron-core's ep_overlap_early_attn_memory_release note)."""
    if not (layer.ep_hidden_fwd_s or layer.ep_hidden_bwd_s):
        return layer
    kept = share * (1.0 - comm_interference(hw))
    return replace(layer, tp_fwd_s=layer.tp_fwd_s - kept * layer.ep_hidden_fwd_s,
                   tp_bwd_s=layer.tp_bwd_s - kept * layer.ep_hidden_bwd_s, buffers=layer.buffers + layer.act.none)
