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


def ep_overlapped(layer: LayerCost, hw: HardwareSpec) -> LayerCost:
    """The layer under the overlap: its hideable exchange leaves the passes' exposed communication, less the SMs it
    holds while hidden; one more micro-batch's forward activations of a layer live at the peak (the forward of
    i+1 allocates before the backward of i frees, megatron-core's ep_overlap_early_attn_memory_release note).
    Every forward is taken as paired: the warm-up and cool-down passes of a pipeline, which run alone, are not
    told apart (an optimistic bound by their share, (pp - 1) / (vpp x micro-batches) of a rank's passes)."""
    if not (layer.ep_hidden_fwd_s or layer.ep_hidden_bwd_s):
        return layer
    kept = 1.0 - comm_interference(hw)
    return replace(layer, tp_fwd_s=layer.tp_fwd_s - kept * layer.ep_hidden_fwd_s,
                   tp_bwd_s=layer.tp_bwd_s - kept * layer.ep_hidden_bwd_s, buffers=layer.buffers + layer.act.none)
