"""Megatron-LM's pipeline flags for a plan's partition (emit/megatron.py writes them into the launch script).

The pipeline partition (layers per rank, each rank's layers split evenly into vpp chunks) becomes, in order of
preference: nothing (an even split); `--decoder-first/last-pipeline-num-layers` (the ends differ from equal middle
ranks); otherwise `--pipeline-model-parallel-layout` listing the virtual stages in virtual order.
"""

from __future__ import annotations

from autotune.specs.plan import Plan
from autotune.specs.plan import chunk_layers as specs_chunk_layers

#: A flag and its value (None: a switch).
Flag = tuple[str, str | None]


def chunk_layers(plan: Plan) -> list[list[int]]:
    """Transformer layers of each (rank, chunk): a rank's layers split as evenly as possible into vpp chunks."""
    return [list(specs_chunk_layers(n, plan.vpp)) for n in plan.layers_per_stage]


def layout_string(plan: Plan, mtp_layers: int = 0) -> str:
    """--pipeline-model-parallel-layout: virtual stage j holds chunk j // pp of rank j % pp; E opens the first
    stage, the multi-token prediction modules (m, one each) and L close the last one; empty stages are
    allowed."""
    chunks = chunk_layers(plan)
    stages = []
    for j in range(plan.pp * plan.vpp):
        n = chunks[j % plan.pp][j // plan.pp]
        body = "" if n == 0 else ("t" if n == 1 else f"t*{n}")
        stages.append(("E" if j == 0 else "") + body + ("m" * mtp_layers + "L" if j == plan.pp * plan.vpp - 1 else ""))
    return "|".join(stages)


def _first_last(plan: Plan) -> list[Flag] | None:
    """The uneven-first/last flags for this partition, or None when they cannot express it (TransformerConfig's
    "Uneven PP" rules: first/last > 0 and divisible by vpp; equal middle ranks, divisible by vpp; a middle
    stage iff middle layers remain)."""
    layers, v = plan.layers_per_stage, plan.vpp
    if len(layers) == 2:  # no middle stage: both ends are given
        first, last = layers[0], layers[1]
    else:
        if len(set(layers[1:-1])) != 1 or layers[1] == 0 or layers[1] % v:
            return None
        first = layers[0] if layers[0] != layers[1] else None
        last = layers[-1] if layers[-1] != layers[1] else None
    flags: list[Flag] = []
    for flag, n in (("--decoder-first-pipeline-num-layers", first), ("--decoder-last-pipeline-num-layers", last)):
        if n is not None:
            if n == 0 or n % v:
                return None
            flags.append((flag, str(n)))
    return flags


def partition_flags(plan: Plan, mtp_layers: int = 0) -> tuple[list[Flag], str]:
    """The pipeline flags for the plan's partition and a one-line description of the form chosen (without a
    layout Megatron puts the `mtp_layers` MTP modules on the last stage itself)."""
    if plan.pp == 1:
        return [], "one pipeline stage"
    vpp: list[Flag] = [("--num-virtual-stages-per-pipeline-rank", str(plan.vpp))] if plan.vpp > 1 else []
    even = len(set(plan.layers_per_stage)) == 1 and all(len(set(c)) == 1 for c in chunk_layers(plan))
    if even:
        return vpp, "even split"
    first_last = _first_last(plan)
    if first_last is not None and not any(n % plan.vpp for n in plan.layers_per_stage):
        return first_last + vpp, "uneven first/last stage, equal middle stages"
    return ([("--pipeline-model-parallel-layout", layout_string(plan, mtp_layers))],
            "explicit layout (virtual stages in order)")
