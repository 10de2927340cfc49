"""What a config reader hands on: the plan's choices as the config states them, before the GPU count is known.

Readers (megatron_args.py, torchtitan_toml.py, deepspeed_json.py) are pure: config text in, a `Reading` out.
understood.py turns a Reading plus --gpus, --gpu and --model into the Plan, ModelSpec and JobSpec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from autotune.specs.limits import MAX_GPUS, MAX_LAYERS, check_max


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """A config as read. None means "the config does not say" (a default or --model decides)."""

    trainer: str
    """megatron | torchtitan | deepspeed."""
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    """Expert-parallel degree (mixture-of-experts models)."""
    etp: int | None = None
    """Expert-tensor-parallel degree; None: the trainer's default (Megatron: tp)."""
    dp: int | None = None
    """Data-parallel degree where the config states it (torchtitan, DeepSpeed); Megatron derives it."""
    mbs: int = 1
    num_microbatches: int | None = None
    """Micro-batches per step where the config states them (DeepSpeed's gradient accumulation)."""
    global_batch: int | None = None
    seq_len: int | None = None
    vpp: int = 1
    schedule: str = "1f1b"
    recompute: str = "none"
    recompute_layers: int | None = None
    recompute_every: int | None = None
    """torchtitan 0.2.x layer AC: every N-th layer checkpointed (full recompute of floor(n/N) layers per chunk)."""
    zero: int = 0
    sequence_parallel: bool = False
    tp_overlap: bool = False
    ep_overlap: bool = False
    fp32: bool = False
    """The config trains in fp32 (no 16-bit flag or block), which check refuses: autotune costs 16-bit and fp8."""
    vocab_parallel: bool = False
    layers_per_stage: tuple[int, ...] | None = None
    """Explicit per-rank layers; None: the trainer's own split of the model's layers (`split` says how)."""
    split: str = "even"
    """How the trainer splits layers when layers_per_stage is None: 'even' (must divide), 'account' (Megatron's
    account-for-embedding/loss: (L+e+l)/pp with e and l in `split_extra`), 'torchtitan' or 'deepspeed'."""
    split_extra: tuple[int, ...] = ()
    bucket_size: int | None = None
    dtype: str = "bf16"
    flash_attention: bool = True
    fused_kernels: bool = True
    grad_reduce: str = "fp32"
    optimizer_states: str = "fp32"
    """Adam moments' dtype (JobSpec.optimizer_states)."""
    moe_dispatcher: str = "alltoall"
    """MoE token dispatcher (JobSpec.moe_dispatcher)."""
    cross_entropy: str | None = None
    """The loss kernel the config runs (JobSpec.cross_entropy); None: the trainer's own."""
    overlap_grad_reduce: bool = True
    """The config overlaps the data-parallel reduction with the backward where the trainer can (JobSpec's)."""
    overlap_param_gather: bool = True
    """The config gathers the distributed optimizer's weights behind the next forward (JobSpec's)."""
    overlap_p2p: bool = True
    """The config lets Megatron's interleaved schedule overlap its pipeline sends (JobSpec's)."""
    warmup_flush: bool = False
    """Megatron's --overlap-p2p-communication-warmup-flush (costed without it)."""
    microbatch_group: int | None = None
    """Megatron's --microbatch-group-size-per-virtual-pipeline-stage (costed as its default, pp)."""
    moe_capacity: tuple[float, bool] = (0.0, False)
    """MoE capacity factor (0: dropless) and whether experts are padded to it (JobSpec.moe_capacity_factor)."""
    vocab_divisor: int = 0
    """Megatron's --make-vocab-size-divisible-by (default 128): it pads the vocabulary to a multiple of this x tp;
    0 for trainers that do not pad."""
    moe_imbalance: float | None = None
    """Busiest expert's load over the mean where the config fixes it (1.0: forced balanced routing); None: the
    cost model's default for learned routing (JobSpec.moe_imbalance)."""
    header_imbalance: float | None = None
    """The routing imbalance autotune's header states the file was planned with (no flag of the config sets it)."""
    shard_replicas: int = 1
    """Replicas the data-parallel ranks form, each sharding the state over dp / replicas only (torchtitan's HSDP,
    Megatron's distributed-optimizer instances): the memory is costed for that shard group."""
    launch: tuple[int | None, int | None] = (None, None)
    """(GPUs per node, nodes) the script's launcher starts (torchrun --nproc_per_node, --nnodes); None: not given."""
    model_fields: dict[str, Any] | None = None
    """The model's shape where the config defines it (ModelSpec field names; vocab_size may be missing)."""
    model_soft: dict[str, Any] | None = None
    """Model settings the config states that do not change the cost (rope_theta, norm_eps, init_std, RoPE
    scaling): they pick between catalog models of the same shape and fill a model the catalog lacks."""
    model_name: str | None = None
    """A catalog model the config names (torchtitan's flavor), or None."""
    model_hint: str | None = None
    """A model name from autotune's header comment ("model NAME on ..."): breaks ties between catalog models
    of the same shape."""
    header_plan: str | None = None
    """The plan line of autotune's own header, when the file has one (a mismatch with the settings is noted)."""
    notes: tuple[str, ...] = field(default=())
    """What was read with a caveat: unknown flags, deprecated spellings, approximations."""


def check_sizes(where: str, *, degrees: tuple[int, ...] = (), layers: int | None = None) -> None:
    """The documented maxima (specs/limits.py) before a reader sizes anything from a config's numbers."""
    product = 1
    for degree in degrees:
        product *= max(1, check_max(degree, MAX_GPUS, "a parallel degree", where))
    check_max(product, MAX_GPUS, "the product of the parallel degrees", where)
    if layers is not None:
        check_max(layers, MAX_LAYERS, "the number of layers", where)


def ordinal(n: int) -> str:
    """2 -> '2nd', 3 -> '3rd', 11 -> '11th': for notes that say 'every Nth layer'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def misspelling_of(name: str, known: frozenset[str] | set[str]) -> str | None:
    """The known name `name` is a slip of (one letter added, dropped or changed, or `_` written for `-`), so a
    reader can refuse it as the trainer's own strict parser would, instead of ignoring a setting that matters;
    None when it is no such slip: an unknown setting that may be real (autotune does not know every one, and real
    ones sit close to known ones: --fp4-recipe beside --fp8-recipe, so a changed digit is no slip)."""
    dashed = name.replace("_", "-")
    if dashed != name and dashed in known:
        return dashed
    if len(name) < 8:
        return None
    near = sorted(k for k in known if abs(len(k) - len(name)) <= 1 and _one_letter_apart(name, k))
    return near[0] if near else None


def _one_letter_apart(a: str, b: str) -> bool:
    """a and b differ by one letter inserted, deleted or replaced (not a digit)."""
    if len(a) < len(b):
        a, b = b, a
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
    if len(a) == len(b):
        return i < len(a) and a[i + 1:] == b[i + 1:] and a[i].isalpha() and b[i].isalpha()
    return a[i + 1:] == b[i:] and a[i].isalpha()


#: Per trainer, the config's names for the plan and model words a rule's message uses (specs/plan.check_plan
#: speaks autotune's plan; a user of `check` reads their config).
CONFIG_TERMS = {
    "megatron": {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
                 "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size",
                 "etp": "--expert-tensor-parallel-size", "vpp": "--num-virtual-stages-per-pipeline-rank",
                 "mbs": "--micro-batch-size", "micro-batch": "--micro-batch-size",
                 "global batch": "--global-batch-size", "sequence_parallel": "--sequence-parallel",
                 "tp_overlap": "--tp-comm-overlap", "ep_overlap": "--overlap-moe-expert-parallel-comm",
                 "zero 3": "--use-torch-fsdp2/--use-megatron-fsdp",
                 "zero": "--use-distributed-optimizer", "seq_len": "--seq-length", "num_experts": "--num-experts",
                 "num_layers": "--num-layers", "num_heads": "--num-attention-heads",
                 "num_kv_heads": "--num-query-groups",
                 "num_microbatches": "--global-batch-size / (--micro-batch-size x data-parallel size)"},
    "torchtitan": {"tp": "parallelism.tensor_parallel_degree", "pp": "parallelism.pipeline_parallel_degree",
                   "cp": "parallelism.context_parallel_degree", "ep": "parallelism.expert_parallel_degree",
                   "etp": "parallelism.expert_tensor_parallel_degree", "mbs": "training.local_batch_size",
                   "micro-batch": "training.local_batch_size", "global batch": "training.global_batch_size",
                   "tp_overlap": "compile.enable_async_tensor_parallel", "seq_len": "training.seq_len",
                   "zero": "parallelism.data_parallel_shard_degree"},
    "deepspeed": {"mbs": "train_micro_batch_size_per_gpu", "micro-batch": "train_micro_batch_size_per_gpu",
                  "global batch": "train_batch_size", "zero": "zero_optimization.stage",
                  "tp": "mpu.tensor_model_parallel_size", "pp": "num_stages"},
}


def in_config_terms(message: str, trainer: str) -> str:
    """`message` with the config's names of the plan words it uses appended, e.g. "... [in the megatron config:
    ep is --expert-model-parallel-size]"; unchanged when it uses none."""
    terms = CONFIG_TERMS.get(trainer, {})
    seen = [word for word in sorted(terms, key=len, reverse=True)
            if re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", message)]
    named = [w for w in seen if not any(w != o and w in o.split() for o in seen)]  # "zero 3" over "zero"
    if not named:
        return message
    return message + f" [in the {trainer} config: " + ", ".join(f"{w} is {terms[w]}" for w in sorted(named)) + "]"
