"""Weights, gradients and optimizer state a pipeline stage is charged, per layer and once: the routed experts of
an MoE layer sharded over the expert-data-parallel group (Megatron's distributed optimizer does), the rest over
data parallelism, by ZeRO stage (memory.split_state_bytes gives the bytes per parameter)."""

from __future__ import annotations

import math

from autotune.costmodel.layer import LayerCost, VocabCost
from autotune.costmodel.memory import split_state_bytes
from autotune.specs.job import StateBytes


def layer_state_bytes(layer: LayerCost, zero: int, shards: int, expert_shards: int,
                      state: StateBytes = StateBytes()) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes of one layer as a stage is charged: its routed experts (MoE) sharded
    over the expert-data-parallel group (Megatron's distributed optimizer does), the rest over data parallel."""
    return split_state_bytes(layer.stage_params, layer.stage_expert_params, zero, shards, expert_shards, state)


def dense_first_credit(layer: LayerCost, zero: int, shards: int, expert_shards: int,
                       state: StateBytes = StateBytes()) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes a stage is charged per layer (layer_state_bytes: an MoE model's mean
    layer is charged as an MoE layer) beyond what one of the model's dense-first layers holds: what each
    dense-first layer a stage is known to hold takes off (the model's first layers open rank 0's first chunk),
    or adds where the dense layer is the larger on this GPU (a signed credit: the stage is exact either way).
    (0, 0, 0) for a layer without dense layers."""
    if not layer.dense_params:
        return 0, 0, 0
    dense = split_state_bytes(layer.dense_params, 0, zero, shards, expert_shards, state)
    charged = layer_state_bytes(layer, zero, shards, expert_shards, state)
    return tuple(a - b for a, b in zip(charged, dense))  # type: ignore[return-value]


def fixed_state_bytes(layer: LayerCost, vocab: VocabCost, vparams: int, head: float, chunks: int, zero: int,
                      shards: int, expert_shards: int, state: StateBytes = StateBytes()) -> tuple[int, int, int]:
    """A rank's (weights, gradients, optimizer) bytes besides n x its layer's: `vparams` vocabulary parameters
    (the `head` share of the MTP experts over the expert-data-parallel group), and per model chunk (each its own
    window of layers) the pattern's surplus (LayerCost.surplus_params)."""
    experts = math.ceil(head * vocab.head_expert_params)
    own = split_state_bytes(vparams, experts, zero, shards, expert_shards, state)
    surplus = split_state_bytes(chunks * layer.surplus_params, chunks * layer.surplus_expert_params, zero, shards,
                                expert_shards, state)
    return own[0] + surplus[0], own[1] + surplus[1], own[2] + surplus[2]
