"""Megatron-LM's gradient and optimizer-state precision flags, and its loss fusion, read back (the inverse of
emit/megatron.py's precision group), kept apart from megatron_args.py.

The names are megatron-core 0.16's OptimizerConfig fields as Megatron-LM spells its flags
(use_precision_aware_optimizer, main_grads_dtype, main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype); its
__post_init__ refuses a dtype other than fp32 without the precision-aware optimizer, and the precision-aware
optimizer without the distributed one or with another optimizer than adam. Which master weights it keeps follows
--fp8-recipe (optimizer_config.py: the delayed recipe, Megatron-LM's default, keeps 16-bit remainders).
Megatron-LM reduces gradients in bf16 with --grad-reduce-in-bf16, and keeps its gradient buffers in bf16 too when
the precision-aware optimizer's main gradients are bf16. With --fp16 its buffers are fp16 (validate_args forces
accumulate_allreduce_grads_in_fp32 for bf16 only) unless --accumulate-allreduce-grads-in-fp32 is given.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import SpecError

#: Flags that take one value and that this reader uses.
PRECISION_VALUE = frozenset("--exp-avg-dtype --exp-avg-sq-dtype --main-grads-dtype --main-params-dtype "
                            "--cross-entropy-fusion-impl".split())
#: Switches this reader uses.
PRECISION_SWITCH = frozenset("--use-precision-aware-optimizer --grad-reduce-in-bf16 "
                             "--accumulate-allreduce-grads-in-fp32 --cross-entropy-loss-fusion".split())
#: --cross-entropy-fusion-impl's choices (megatron-core ModelParallelConfig.cross_entropy_fusion_impl)
CROSS_ENTROPY_IMPLS = ("native", "te")
#: Each dtype flag's choices (Megatron-LM's argparse) and default.
DTYPE_CHOICES = {"--exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"),
                 "--exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8"),
                 "--main-grads-dtype": ("fp32", "bf16"), "--main-params-dtype": ("fp32", "fp16")}


def _dtype(args: dict[str, Any], flag: str) -> str:
    value = str(args.get(flag, "fp32"))
    if value not in DTYPE_CHOICES[flag]:
        raise SpecError(f"{flag} {value}: Megatron takes one of {', '.join(DTYPE_CHOICES[flag])}")
    return value


#: Bytes of one Adam moment element by --exp-avg(-sq)-dtype.
MOMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def optimizer_states(args: dict[str, Any], notes: list[str]) -> str:
    """JobSpec.optimizer_states of the flags. megatron-core (OptimizerConfig.use_precision_aware_optimizer_no_fp8_
    or_ds_fp8) keeps 16-bit master remainders and no gradient copy when the fp8 recipe is delayed (Megatron-LM's
    default) or --main-params-dtype is not fp32: 'bf16'; under another recipe whole fp32 master weights and an fp32
    gradient copy: 'bf16-moments'. Moment dtypes other than bf16 pairs are costed at the nearest, with a note."""
    dtypes = {flag: _dtype(args, flag) for flag in DTYPE_CHOICES}
    aware = bool(args.get("--use-precision-aware-optimizer"))
    if not aware:
        changed = [flag for flag, value in dtypes.items() if value != "fp32"]
        if changed:
            raise SpecError(f"{changed[0]} {dtypes[changed[0]]} without --use-precision-aware-optimizer: "
                            "megatron-core refuses it (OptimizerConfig keeps fp32 then); add the switch or drop the "
                            "flag")
        return "fp32"
    if str(args.get("--optimizer", "adam")) != "adam":
        raise SpecError(f"--use-precision-aware-optimizer with --optimizer {args['--optimizer']}: megatron-core takes "
                        "it with adam only (OptimizerConfig); drop one")
    if not (args.get("--use-distributed-optimizer") or args.get("--use-megatron-fsdp")):
        raise SpecError("--use-precision-aware-optimizer without --use-distributed-optimizer: megatron-core refuses "
                        "it (OptimizerConfig); add --use-distributed-optimizer")
    if args.get("--use-megatron-fsdp"):
        notes.append("--use-precision-aware-optimizer with Megatron FSDP: costed as fp32 Adam states (its FSDP keeps "
                     "fp32 main weights; the 16-bit states are costed in the distributed optimizer only)")
        return "fp32"
    moments = [MOMENT_BYTES[dtypes[flag]] for flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype")]
    remainders = str(args.get("--fp8-recipe", "delayed")) == "delayed" or dtypes["--main-params-dtype"] != "fp32"
    if moments == [4, 4]:
        notes.append("--use-precision-aware-optimizer with fp32 moments: costed as fp32 Adam states"
                     + (" (its 16-bit master remainders and no gradient copy, up to 6 bytes per parameter over the "
                        "ZeRO shards, are not modelled)" if remainders else ""))
        return "fp32"
    if moments != [2, 2]:
        notes.append(f"Adam moments of {moments[0]} and {moments[1]} bytes: costed as 2 bytes each (bf16)")
    if dtypes["--main-params-dtype"] != "fp32":
        notes.append("--main-params-dtype fp16: costed with the master weights Megatron keeps beside bf16 weights "
                     "(16-bit remainders)")
    return "bf16" if remainders else "bf16-moments"


def grad_reduce(args: dict[str, Any]) -> str:
    """JobSpec.grad_reduce of the flags: the gradient buffers' dtype."""
    if args.get("--fp16"):  # --grad-reduce-in-bf16 acts in validate_args' bf16 branch only
        return "fp32" if args.get("--accumulate-allreduce-grads-in-fp32") else "fp16"
    bf16_main = args.get("--use-precision-aware-optimizer") and args.get("--main-grads-dtype") == "bf16"
    return "bf16" if args.get("--grad-reduce-in-bf16") or bf16_main else "fp32"


def cross_entropy(args: dict[str, Any], notes: list[str]) -> str:
    """JobSpec.cross_entropy of the flags: Megatron-LM runs the loss unfused unless --cross-entropy-loss-fusion
    (megatron-core's cross_entropy_loss_fusion defaults to False), then with --cross-entropy-fusion-impl's kernel
    (default native)."""
    impl = args.get("--cross-entropy-fusion-impl", "native")
    if impl not in CROSS_ENTROPY_IMPLS:
        raise SpecError(f"--cross-entropy-fusion-impl {impl}: Megatron-LM takes {' or '.join(CROSS_ENTROPY_IMPLS)}")
    if not args.get("--cross-entropy-loss-fusion"):
        notes.append("no --cross-entropy-loss-fusion: the loss runs as separate fp32 passes over the logits "
                     "(Megatron-LM's default; the best plan turns the fusion on)")
        return "unfused"
    return impl


def flash_attention(args: dict[str, Any], notes: list[str]) -> bool:
    """Whether the config runs a fused (flash) attention kernel: not under --attention-backend unfused, nor under
    megatron-core's own DotProductAttention (--attention-backend local, or --transformer-impl local, whose layer
    spec always takes it), which keep the s x s scores in memory (user-tester: costed as fused, a config 95 GiB
    over an 80 GB GPU read as fitting)."""
    backend = args.get("--attention-backend", "flash" if args.get("--use-flash-attn") else "auto")
    if backend == "flash":
        notes.append("--attention-backend flash: Transformer Engine runs the flash-attn package's kernel; costed as "
                     "its cuDNN fused attention (--attention-backend fused), the kernel autotune prices for Megatron")
    if backend == "local" or args.get("--transformer-impl") == "local":
        notes.append(f"{'--attention-backend' if backend == 'local' else '--transformer-impl'} local: megatron-core's "
                     "own DotProductAttention (the s x s scores in memory), costed as unfused attention")
        return False
    return backend != "unfused"
