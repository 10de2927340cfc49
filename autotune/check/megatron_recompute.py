"""Megatron's activation-recomputation flags read back (TRAINERS.md 1.2): granularity, method and layer count,
refused where megatron-core's TransformerConfig or its MTP block would refuse them at start-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.errors import SpecError


def recompute_setting(granularity: str | None, args: dict[str, Any], notes: list[str], as_int: Callable[..., Any]
                      ) -> tuple[str, int | None]:
    """(recompute, layers per chunk or None for every layer) from Megatron's recompute flags, refusing what
    megatron-core refuses at start-up (`as_int`: the reader's whole-number flag parser)."""
    if granularity in (None, "none"):
        return "none", None
    if granularity == "selective":
        for flag, why in (("--recompute-method", "validate_args: recompute method is not yet supported for selective"),
                          ("--recompute-num-layers", "TransformerConfig: selective recomputes no layer count"),
                          ("--distribute-saved-activations", "validate_args: it applies to full granularity")):
            if args.get(flag) not in (None, False):
                raise SpecError(f"--recompute-granularity selective with {flag}: Megatron refuses it ({why}); drop "
                                f"{flag}, or use --recompute-granularity full")
        modules = args.get("--recompute-modules")
        if isinstance(modules, str) and modules != "core_attn":
            notes.append(f"--recompute-modules {modules}: costed as Megatron's default selective recompute "
                         "(core attention only)")
        return "selective", None
    if granularity != "full":
        raise SpecError(f"--recompute-granularity {granularity!r}: use full or selective")
    legacy = args.get("--checkpoint-activations")  # which sets uniform over single layers
    for flag in ("--recompute-method", "--recompute-num-layers"):
        if flag not in args and not legacy:
            raise SpecError(f"--recompute-granularity full needs {flag} (megatron-core's TransformerConfig refuses "
                            "it without); add --recompute-method uniform|block and --recompute-num-layers N")
    method, n = args.get("--recompute-method", "uniform"), as_int(args, "--recompute-num-layers", 1)
    if method == "uniform" and n and n > 1 and as_int(args, "--mtp-num-layers", 0):
        raise SpecError(f"--recompute-method uniform --recompute-num-layers {n} with --mtp-num-layers: Megatron's "
                        "MTP block asserts recompute_num_layers 1 under uniform; use 1, or block")
    if args.get("--distribute-saved-activations"):
        notes.append("--distribute-saved-activations: the checkpointed inputs are split over tp; costed unsplit")
    if method == "block":
        return "full", n
    if method != "uniform":
        raise SpecError(f"--recompute-method {method!r}: use uniform or block")
    if n and n > 1:
        notes.append(f"--recompute-method uniform --recompute-num-layers {n}: every layer is recomputed (in groups "
                     f"of {n}); costed as full recompute of each layer")
    if as_int(args, "--mtp-num-layers", 0):
        notes.append("--recompute-method uniform also recomputes the MTP module(s) (multi_token_prediction.py); "
                     "costed with their activations stored, as block recompute over every layer runs them")
    return "full", None
