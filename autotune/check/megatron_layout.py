"""Megatron's --pipeline-model-parallel-layout read back (TRAINERS.md 1.1): unrolled, held to the rules
megatron-core's PipelineParallelLayerLayout.validate_layer_layout asserts at start-up (so a script it would
refuse is refused here, not costed), and turned into decoder layers per virtual stage."""

from __future__ import annotations

import re

from autotune.errors import SpecError
from autotune.specs.limits import MAX_LAYERS


#: megatron-core's parse_str_to_list: each pattern substituted once over the whole string, in this order (so a
#: nested group or a space is not unrolled, and is then refused as an invalid layer character)
_REPEATS = (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)")


def unroll(layout: str) -> str:
    """The layout as megatron-core's PipelineParallelLayerLayout.parse_str_to_list reads it: cosmetic commas
    dropped, `(...)*n` then `x*n` repeats unrolled, each once: stages of E, t, L and m separated by |."""
    text = layout.replace(",", "")
    for pattern in _REPEATS:
        size = len(text) + sum(int(m.group(2)) * len(m.group(1)) - len(m.group(0))
                               for m in re.finditer(pattern, text))
        if size > 64 * MAX_LAYERS:
            raise SpecError(f"--pipeline-model-parallel-layout {layout[:40]!r}...: unrolls to more than "
                            f"{MAX_LAYERS} layers")
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    bad = re.search(r"[^EtLm|]", text)
    if bad:
        raise SpecError(f"--pipeline-model-parallel-layout {layout!r}: {bad.group(0)!r} is not a layer "
                        "(megatron-core reads E, t, L and m in stages separated by |, with one level of (...)*n "
                        "and x*n repeats, no spaces)")
    return text


def parse_layout(layout: str) -> list[int]:
    """Decoder (t) layers per virtual stage, in virtual order."""
    return [stage.count("t") for stage in unroll(layout).split("|")]


def layout_issue(layout: str, pp: int, mtp_layers: int) -> str:
    """The first of megatron-core's layout rules the layout breaks ('' when none): one E, first; one L, last;
    as many m as --mtp-num-layers, after every t, all in one virtual stage that is the last of its rank."""
    return _stage_issue(unroll(layout).split("|"), pp, mtp_layers)


def _stage_issue(stages: list[str], pp: int, mtp_layers: int) -> str:
    flat = "".join(stages)
    if not flat.startswith("E") or flat.count("E") != 1:
        return "the embedding E must appear once, as the first layer"
    if not flat.endswith("L") or flat.count("L") != 1:
        return "the loss L must appear once, as the last layer"
    if flat.count("m") != mtp_layers:
        return (f"it holds {flat.count('m')} MTP layer(s) m, but --mtp-num-layers is {mtp_layers}; they must "
                "be equal")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        return "decoder layers t come after an MTP layer m; every m comes after the last t"
    vpp = len(stages) // pp
    holding = [j for j, stage in enumerate(stages) if "m" in stage]
    if any(j // pp != vpp - 1 for j in holding):
        return "an MTP layer m sits in a virtual stage that is not the last of its pipeline rank"
    if len(holding) > 1:
        return "the MTP layers m are split over virtual stages; put them all in one"
    return ""


def check_layout(layout: str, pp: int, mtp_layers: int, notes: list[str]) -> None:
    """SpecError where megatron-core refuses the layout; a note where the MTP layers sit on a stage of their own
    (Megatron's standalone MTP), which autotune costs on the loss's stage."""
    stages = unroll(layout).split("|")
    issue = _stage_issue(stages, pp, mtp_layers)
    if issue:
        raise SpecError(f"--pipeline-model-parallel-layout {layout!r}: {issue} (megatron-core's "
                        "validate_layer_layout refuses it at start-up)")
    if mtp_layers and not any("m" in stage and "L" in stage for stage in stages):
        notes.append("the layout runs the MTP layer(s) on a stage apart from the loss (Megatron's standalone MTP); "
                     "costed on the loss's stage")
