"""Megatron-LM's gradient and optimizer-state precision flags read back (the inverse of emit/megatron.py's
precision group), kept apart from megatron_args.py.

The names are megatron-core 0.16's OptimizerConfig fields as Megatron-LM spells its flags
(use_precision_aware_optimizer, main_grads_dtype, main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype); its
__post_init__ refuses a dtype other than fp32 without the precision-aware optimizer, and the precision-aware
optimizer without the distributed one. Megatron-LM reduces gradients in bf16 with --grad-reduce-in-bf16, and keeps
its gradient buffers in bf16 too when the precision-aware optimizer's main gradients are bf16.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import SpecError

#: Flags that take one value and that this reader uses.
PRECISION_VALUE = frozenset("--exp-avg-dtype --exp-avg-sq-dtype --main-grads-dtype --main-params-dtype".split())
#: Switches this reader uses.
PRECISION_SWITCH = frozenset("--use-precision-aware-optimizer --grad-reduce-in-bf16".split())
#: Each dtype flag's choices (Megatron-LM's argparse) and default.
DTYPE_CHOICES = {"--exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"),
                 "--exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8"),
                 "--main-grads-dtype": ("fp32", "bf16"), "--main-params-dtype": ("fp32", "fp16")}


def _dtype(args: dict[str, Any], flag: str) -> str:
    value = str(args.get(flag, "fp32"))
    if value not in DTYPE_CHOICES[flag]:
        raise SpecError(f"{flag} {value}: Megatron takes one of {', '.join(DTYPE_CHOICES[flag])}")
    return value


def optimizer_states(args: dict[str, Any], notes: list[str]) -> str:
    """JobSpec.optimizer_states of the flags: 'bf16' for 16-bit Adam moments, else 'fp32'."""
    dtypes = {flag: _dtype(args, flag) for flag in DTYPE_CHOICES}
    aware = bool(args.get("--use-precision-aware-optimizer"))
    if not aware:
        changed = [flag for flag, value in dtypes.items() if value != "fp32"]
        if changed:
            raise SpecError(f"{changed[0]} {dtypes[changed[0]]} without --use-precision-aware-optimizer: "
                            "megatron-core refuses it (OptimizerConfig keeps fp32 then); add the switch or drop the "
                            "flag")
        return "fp32"
    if not (args.get("--use-distributed-optimizer") or args.get("--use-megatron-fsdp")):
        raise SpecError("--use-precision-aware-optimizer without --use-distributed-optimizer: megatron-core refuses "
                        "it (OptimizerConfig); add --use-distributed-optimizer")
    moments = {dtypes["--exp-avg-dtype"], dtypes["--exp-avg-sq-dtype"]}
    if moments == {"fp32"}:
        return "fp32"
    if moments != {"bf16"}:
        notes.append(f"Adam moments in {' and '.join(sorted(moments))}: costed as bf16 (2 bytes each), the only "
                     "16-bit or smaller moment dtype autotune models")
    return "bf16"


def grad_reduce(args: dict[str, Any]) -> str:
    """JobSpec.grad_reduce of the flags: the gradient buffers' dtype."""
    bf16_main = args.get("--use-precision-aware-optimizer") and args.get("--main-grads-dtype") == "bf16"
    return "bf16" if args.get("--grad-reduce-in-bf16") or bf16_main else "fp32"
