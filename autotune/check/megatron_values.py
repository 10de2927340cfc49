"""Megatron-LM argument values read strictly, as its argparse types and the divisions behind them would take them."""

from __future__ import annotations

import re
from typing import Any

from autotune.check.megatron_moe_args import layer_pattern
from autotune.errors import SpecError

#: Whole-number flags where 0 means none (every other one is a size or count of at least 1).
ZERO_MEANS_NONE = {"--mtp-num-layers", "--q-lora-rank"}


def int_arg(args: dict[str, Any], flag: str, default: int | None = None) -> int | None:
    """A whole-number flag's value (default when absent); 0 only where it means none, since Megatron divides by the
    others (a tp of 0 would read as the default 1 and a head count of 0 divide by zero)."""
    if flag not in args:
        return default
    value = args[flag]
    if not isinstance(value, str) or not re.fullmatch(r"\d+", value):
        raise SpecError(f"{flag} {value!r}: expected a whole number")
    if int(value) == 0 and flag not in ZERO_MEANS_NONE:
        raise SpecError(f"{flag} 0: Megatron needs at least 1; give a positive number")
    return int(value)


def float_arg(args: dict[str, Any], flag: str, default: float) -> float:
    try:
        return float(args[flag]) if flag in args else default
    except ValueError:
        raise SpecError(f"{flag} {args[flag]!r}: expected a number") from None


def fraction_arg(args: dict[str, Any], flag: str) -> float:
    """A share in (0, 1] (--rotary-percent: Megatron-LM takes it as a fraction, 1.0 = every head dimension)."""
    value = float_arg(args, flag, 1.0)
    if not 0 < value <= 1:
        raise SpecError(f"{flag} {args[flag]!r}: expected a share of each head in (0, 1], e.g. 0.25")
    return value


def window_fields(args: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The sliding window of --window-size LEFT,RIGHT (TransformerConfig.window_size; '(128, 0)' alike), read as
    ModelSpec's window of LEFT keys (Transformer Engine's sees LEFT + 1, itself included; Megatron-Bridge maps
    Hugging Face's sliding_window 128 to (128, 0), so LEFT matches the catalog's windows), on the
    layers --window-attn-skip-freq leaves windowed: an int N windows layer n (1-based) unless n % N == 0, a list
    has 1 for each windowed layer (megatron-core 0.16 transformer/utils.py is_layer_window_attention); without
    it, every layer. {} without a window (or LEFT -1, Megatron's infinite window)."""
    if "--window-size" not in args:
        return {}
    sizes = re.findall(r"-?\d+", str(args["--window-size"]))
    if len(sizes) != 2 or not re.fullmatch(r"[\s(),\d-]*", str(args["--window-size"])):
        raise SpecError(f"--window-size {args['--window-size']!r}: expected two whole numbers, left and right "
                        "(128,0 for a causal 128-token window)")
    left = int(sizes[0])
    if left < 0:
        return {}
    freq = str(args.get("--window-attn-skip-freq", "")).replace(" ", "")
    if not freq:
        layers = num_layers
    elif freq.isdigit() and int(freq) >= 1:
        layers = num_layers - num_layers // int(freq)
    else:
        layers = sum(layer_pattern(freq, num_layers, "--window-attn-skip-freq"))
    return {"sliding_window": left, "sliding_window_layers": layers} if left and layers else {}
