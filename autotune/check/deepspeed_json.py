"""A DeepSpeed config read back into a Reading: `ds_config.json` plus, where it sits beside it, autotune's
`ds_pipeline.json` (the PipelineModule arguments and the mpu degrees, which DeepSpeed takes from Python).

The inverse of autotune/emit/deepspeed.py. DeepSpeed's JSON alone gives the batch (train_batch_size =
micro-batch x gradient accumulation x dp), ZeRO, precision and the pipeline's activation checkpointing; without
ds_pipeline.json the model-parallel degrees are unknown: pp 1 and tp = --gpus / dp are assumed (noted), and a
config with a "pipeline" section needs the file. The model is never in DeepSpeed's JSON: it comes from --model.
"""

from __future__ import annotations

import json
import math
from typing import Any

from autotune.check.reading import Reading, check_sizes, misspelling_of, ordinal
from autotune.errors import SpecError
from autotune.emit.deepspeed import PARTITION_METHOD
from autotune.specs._strict import shown
from autotune.specs.model import ACTIVATIONS, BIASES, NORMS, POSITIONS
from autotune.specs.plan import DEEPSPEED_BUCKET

#: zero_optimization keys the reader uses, and those whose DeepSpeed default the cost model already is or that
#: change no step time (autotune's own configs write the first two); any other is named in one note
ZERO_READ = {"stage", "reduce_bucket_size", "overlap_comm", "offload_optimizer", "offload_param",
             "allgather_bucket_size", "contiguous_gradients", "reduce_scatter", "allgather_partitions",
             "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save", "elastic_checkpoint",
             "ignore_unused_parameters", "load_from_fp32_weights",
             "stage3_prefetch_bucket_size"}  # autotune's ZeRO-3 files write the plan's bucket there (not costed apart)
KNOWN = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
         "bf16", "fp16", "pipeline", "_autotune", "data_types", "communication_data_type",
         "sequence_parallel_size", "data_parallel_size", "tensor_parallel"}
NEUTRAL = {"gradient_clipping", "steps_per_print", "wall_clock_breakdown", "optimizer", "scheduler",
           "activation_checkpointing", "prescale_gradients", "tensorboard", "wandb",
           "csv_monitor", "flops_profiler", "comms_logger", "zero_allow_untested_optimizer", "amp",
           "gradient_predivide_factor", "checkpoint", "aio", "elasticity", "dump_state",
           "seq_parallel_communication_data_type", "memory_breakdown", "sparse_gradients", "bfloat16"}


def parse(text: str, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: expected a JSON object (a DeepSpeed config)")
    return doc


#: ds_pipeline.json's "model" keys (emit/deepspeed.py) that fix the shape, with their ModelSpec field names
_SHAPE_KEYS = {"num_layers": "num_layers", "hidden_size": "hidden_size", "num_attention_heads": "num_heads",
               "num_key_value_heads": "num_kv_heads", "head_dim": "head_dim", "ffn_hidden_size": "ffn_hidden_size",
               "vocab_size": "vocab_size"}


#: Its choices, each from the ModelSpec values a model file may hold
_CHOICE_KEYS = {"activation": ACTIVATIONS, "norm": NORMS, "bias": BIASES, "position_embedding": POSITIONS}
#: And what does not change the cost (Reading.model_soft: it picks between catalog models of the same shape)
_SOFT_KEYS = ("norm_eps", "rope_theta", "rope_scaling_factor", "init_std", "rotary_fraction")
#: Its true/false keys
_FLAG_KEYS = ("tied_embeddings", "parallel_block")
#: Every key of the block (emit/deepspeed.py _model)
_MODEL_KEYS = {*_SHAPE_KEYS, *_CHOICE_KEYS, *_SOFT_KEYS, *_FLAG_KEYS, "rope_scaling", "seq_len"}


def _model_fields(shape: Any) -> dict[str, Any] | None:
    """The model's shape from ds_pipeline.json's "model" block (None without one, or one that lacks a size or the
    activation and norm): its sizes, each >= 1, and its choices, each checked."""
    where = "ds_pipeline.json: model"
    if isinstance(shape, dict):  # the block emit/deepspeed.py writes: a key it never writes is a slip, not a setting
        for key in sorted(set(shape) - _MODEL_KEYS):
            meant = misspelling_of(key, _MODEL_KEYS) or next((k for k, f in _SHAPE_KEYS.items() if f == key), None)
            raise SpecError(f"{where}: {key} is not a key of the model block"
                            + (f"; did you mean {meant}?" if meant else f" ({', '.join(sorted(_MODEL_KEYS))})"))
    if not isinstance(shape, dict) or not {*_SHAPE_KEYS, "activation", "norm"} <= set(shape):
        return None
    out: dict[str, Any] = {field: _size(shape, key, where) for key, field in _SHAPE_KEYS.items()}
    out["num_experts"] = 0  # the block describes a dense model (emit/deepspeed.py writes no experts)
    for key, values in _CHOICE_KEYS.items():
        if key in shape:
            if shape[key] not in values:
                raise SpecError(f"{where}: {key} must be one of {', '.join(values)}, got {shape[key]!r}")
            out[key] = shape[key]
    for key in _FLAG_KEYS:
        if key in shape:
            if not isinstance(shape[key], bool):
                raise SpecError(f"{where}: {key} must be true or false, got {shape[key]!r}")
            out[key] = shape[key]
    return out


def _model_soft(shape: Any) -> dict[str, Any] | None:
    """ds_pipeline.json's model settings that do not change the cost (finite numbers > 0 only)."""
    if not isinstance(shape, dict):
        return None
    rotary = shape.get("rotary_fraction", 1.0)
    if isinstance(rotary, bool) or not isinstance(rotary, (int, float)) or not 0 < rotary <= 1:
        raise SpecError(f"ds_pipeline.json: model: rotary_fraction must be a share of each head in (0, 1], got "
                        f"{rotary!r}")
    return {k: float(shape[k]) for k in _SOFT_KEYS if isinstance(shape.get(k), (int, float))
            and not isinstance(shape[k], bool) and 0 < shape[k] < math.inf} or None


def _overlap_comm(zero_cfg: dict[str, Any], zero: int, where: str, notes: list[str]) -> bool:
    """zero_optimization.overlap_comm, whose default is true only for ZeRO-3 (deepspeed 0.19 runtime/zero/config.py
    overlap_comm_valid). Without it ZeRO-1 registers no backward hooks and reduces after the backward, and ZeRO-2's
    hooks reduce-scatter each bucket on the compute stream, stalling the backward (stages.zero3_exposed)."""
    value = zero_cfg.get("overlap_comm", zero == 3)
    if not isinstance(value, bool):
        raise SpecError(f"{where}: zero_optimization.overlap_comm must be true or false, got {value!r}")
    if not value and zero == 3:
        notes.append("zero_optimization.overlap_comm false: ZeRO-3 reduce-scatters on the compute stream (stage3.py); "
                     "costed as overlapped, faster than the run")
    return value or zero not in (1, 2)


def _checkpoint_interval(configured: Any, pipeline: dict[str, Any], where: str, notes: list[str]) -> Any:
    """The interval the pipeline engine runs: the JSON's pipeline.activation_checkpoint_interval where it is
    above 0, which replaces the PipelineModule's (deepspeed 0.19 runtime/pipe/engine.py PipelineEngine.__init__),
    else the module's (ds_pipeline.json's)."""
    module = pipeline.get("activation_checkpoint_interval", 0)
    if isinstance(configured, bool) or not isinstance(configured, int):  # DeepSpeed's config refuses it too
        raise SpecError(f"{where}: pipeline.activation_checkpoint_interval must be a whole number, got {configured!r}")
    if configured > 0:
        if module != configured:
            notes.append(f"{where}: pipeline.activation_checkpoint_interval {configured} replaces ds_pipeline.json's "
                         f"{module!r}, as DeepSpeed's pipeline engine does")
        return configured
    return module


def _size(doc: dict[str, Any], key: str, where: str) -> int | None:
    """A batch size or step count the config gives (None where it leaves it to DeepSpeed): at least 1."""
    if key not in doc:
        return None
    return _int(doc, key, where, minimum=1)


def _int(doc: dict[str, Any], key: str, where: str, minimum: int = 0) -> int:
    """A whole number of at least `minimum`; a float of whole value too (DeepSpeed's docs write sizes as 5e8, and
    its pydantic config takes them)."""
    value = doc[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value == "auto":  # the Hugging Face Trainer's placeholder, filled in from its own arguments at run time
        raise SpecError(f"{where}: {key} 'auto' is filled in by the Hugging Face Trainer when it runs; write the "
                        "number it runs (its TrainingArguments say which) to check the config")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}: {key} must be a whole number, got {shown(value)}")
    if value < minimum:
        raise SpecError(f"{where}: {key} must be >= {minimum}, got {value}")
    return value


#: DeepSpeed's dtype spellings for data_types.grad_accum_dtype (runtime/config.py DtypeEnum), by autotune's name
DTYPE_ALIASES = {**dict.fromkeys(("torch.float16", "fp16", "float16", "half"), "fp16"),
                 **dict.fromkeys(("torch.float32", "fp32", "float32", "float"), "fp32"),
                 **dict.fromkeys(("torch.bfloat16", "bf16", "bfloat16"), "bf16")}
#: communication_data_type's (runtime/config.py get_communication_data_type)
WIRE_DTYPES = ("fp16", "bf16", "fp32")


def grad_reduce(config: dict[str, Any], dtype: str, zero: int, notes: list[str], where: str = "") -> str:
    """JobSpec.grad_reduce of the config: DeepSpeed accumulates gradients in data_types.grad_accum_dtype, the model's
    dtype by default, and reduces them in communication_data_type, that dtype by default (deepspeed 0.19 engine.py
    get_data_types, communication_data_type). What DeepSpeed refuses is refused: other spellings, and 16-bit
    training accumulating in fp32 without ZeRO (_do_optimizer_sanity_check: "unsupported mix"). A reduction dtype
    other than the buffers' is noted and costed as theirs."""
    types = config.get("data_types") if isinstance(config.get("data_types"), dict) else {}
    given, at = types.get("grad_accum_dtype"), f"{where}: " if where else ""
    accum = dtype if given is None else DTYPE_ALIASES.get(str(given))
    if accum is None or accum not in (dtype, "fp32"):
        raise SpecError(at + f"data_types.grad_accum_dtype {given!r}: DeepSpeed accumulates {dtype} training's "
                        f"gradients in {dtype} or fp32 (spelt as its DtypeEnum: {dtype}, fp32, torch.float32...); "
                        "fix it")
    if accum == "fp32" and zero == 0:
        raise SpecError(at + f"data_types.grad_accum_dtype fp32 without ZeRO: DeepSpeed refuses {dtype} parameters "
                        "with fp32 gradient accumulation there (unsupported mix); set zero_optimization.stage >= 1")
    wire = config.get("communication_data_type")
    if wire is not None and wire not in WIRE_DTYPES:
        raise SpecError(at + f"communication_data_type {wire!r}: DeepSpeed takes one of {', '.join(WIRE_DTYPES)}; "
                        "fix it")
    if (wire or dtype) != accum:
        notes.append(f"gradients reduced in {wire or dtype} (communication_data_type) from {accum} buffers: costed "
                     f"as {accum} (the reduction's dtype is not modelled apart from the buffers')")
    if accum == "fp32" and zero == 1 and dtype == "bf16":
        raise SpecError(at + "data_types.grad_accum_dtype fp32 with bf16 at ZeRO 1: DeepSpeed runs its BF16_Optimizer "
                        "there (bf16 and fp32 gradients both kept, bf16 master-weight keys ignored), which autotune "
                        "does not cost; use ZeRO 2 or drop data_types")
    return accum


#: The bf16 section's keys (deepspeed 0.19 runtime/precision_config.py DeepSpeedBF16Config)
BF16_KEYS = frozenset(("enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                       "bf16_optimizer_states"))


def _truthy(value: Any) -> bool:
    """A bool as DeepSpeed's pydantic config reads it: true/false, 1/0 and the words pydantic takes for them."""
    return value is True or value == 1 or str(value).lower() in ("true", "1", "yes", "on", "t", "y")


def optimizer_states(config: dict[str, Any], zero: int, notes: list[str]) -> str:
    """JobSpec.optimizer_states of a bf16 config: bf16.bf16_master_weights_and_grads with bf16_optimizer_states keeps
    bf16 master weights and Adam moments ('bf16': the same bytes as Megatron's remainders, 2 + 2 + (2 + 4)/d); what
    DeepSpeed's config check refuses is refused (runtime/config.py: either needs ZeRO 1-3, the states need the
    master weights); bf16 master weights beside fp32 moments are costed as fp32 states, with a note."""
    section = config.get("bf16") if isinstance(config.get("bf16"), dict) else {}
    unknown = sorted(set(section) - BF16_KEYS)
    if unknown:  # DeepSpeed's config models forbid extra keys (runtime/config_utils.py)
        raise SpecError(f"bf16.{unknown[0]}: not a key of DeepSpeed's bf16 section ({', '.join(sorted(BF16_KEYS))}); "
                        "fix or drop it")
    master = _truthy(section.get("bf16_master_weights_and_grads"))
    states = _truthy(section.get("bf16_optimizer_states"))
    if (master or states) and zero == 0:
        raise SpecError("bf16.bf16_master_weights_and_grads / bf16_optimizer_states need ZeRO stage 1, 2 or 3 "
                        "(DeepSpeed's config check); set zero_optimization.stage or drop them")
    if states and not master:
        raise SpecError("bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads (DeepSpeed's config "
                        "check); add it or drop bf16_optimizer_states")
    if master and not states:
        notes.append("bf16 master weights beside fp32 Adam moments: costed as fp32 states (2 bytes per parameter "
                     "over the ZeRO shards more than it keeps)")
    return "bf16" if states else "fp32"


def is_pipeline_file(doc: dict[str, Any]) -> bool:
    return "num_stages" in doc and "train_batch_size" not in doc


def read_deepspeed(config: dict[str, Any], pipeline: dict[str, Any] | None, gpus: int, where: str) -> Reading:
    """The Reading of a ds_config (and ds_pipeline, or None); `gpus` fills the model-parallel degree that only
    Python code would give when ds_pipeline.json is missing."""
    notes = [f"{where}: {key} ignored (not a setting autotune reads)" for key in sorted(set(config) - KNOWN - NEUTRAL)]
    batch_keys = [k for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
                  if k in config]
    if not {"train_batch_size", "train_micro_batch_size_per_gpu"} & set(batch_keys):
        raise SpecError(f"{where}: neither train_batch_size nor train_micro_batch_size_per_gpu; DeepSpeed needs one "
                        "of them (and takes gradient_accumulation_steps 1 when only one of the three is given)")
    zero_cfg = config.get("zero_optimization", {})
    if not isinstance(zero_cfg, dict):
        raise SpecError(f"{where}: zero_optimization must be an object")
    zero = _int(zero_cfg, "stage", f"{where}: zero_optimization") if "stage" in zero_cfg else 0
    if zero not in (0, 1, 2, 3):
        raise SpecError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {zero}")
    bucket = (_int(zero_cfg, "reduce_bucket_size", f"{where}: zero_optimization") if "reduce_bucket_size" in zero_cfg
              else DEEPSPEED_BUCKET)
    overlap = _overlap_comm(zero_cfg, zero, where, notes)
    if unread := sorted(set(zero_cfg) - ZERO_READ):  # (MiCS, hpZ, qwZ/qgZ change memory or traffic: user-tester)
        notes.append(f"zero_optimization {', '.join(unread)}: not read by autotune; costed as DeepSpeed runs without "
                     "them")
    fp16 = config.get("fp16", {}).get("enabled", False) if isinstance(config.get("fp16"), dict) else False
    bf16 = config.get("bf16", {}).get("enabled", False) if isinstance(config.get("bf16"), dict) else False
    if fp16 is True and bf16 is True:
        raise SpecError(f"{where}: bf16.enabled and fp16.enabled are both true; DeepSpeed refuses both "
                        "(runtime/config.py: 'bfloat16 and fp16 modes cannot be simultaneously enabled'); drop one")
    if "auto" in (fp16, bf16):
        notes.append("fp16/bf16 enabled 'auto': the Hugging Face Trainer decides from its own arguments; costed as "
                     f"{'fp16' if fp16 is True else 'bf16'}")
    full_precision = "auto" not in (fp16, bf16) and fp16 is not True and bf16 is not True  # check refuses it
    for offload in ("offload_optimizer", "offload_param"):
        device = zero_cfg.get(offload, {}).get("device", "none") if isinstance(zero_cfg.get(offload), dict) else "none"
        if device not in ("none", None):
            notes.append(f"zero_optimization.{offload}.device {device}: ZeRO-Offload/Infinity is not modelled; "
                         "costed with the state on the GPU (faster and with more GPU memory than the run: an out-of-"
                         "memory verdict on its optimizer states or weights is the model's, not the run's)")
    pipe_cfg = config.get("pipeline", {}) if isinstance(config.get("pipeline"), dict) else {}
    interval = pipe_cfg.get("activation_checkpoint_interval", 0)
    tp, pp, cp, sp, layers = 1, 1, 1, False, None
    autotp = config.get("tensor_parallel") if isinstance(config.get("tensor_parallel"), dict) else {}
    if autotp.get("autotp_size"):  # DeepSpeed's AutoTP training (TPTrainingConfig.autotp_size)
        tp = _int(autotp, "autotp_size", f"{where}: tensor_parallel")
    if pipeline is not None:
        pwhere = "ds_pipeline.json"
        for key in ("num_stages", "mpu"):
            if key not in pipeline:
                raise SpecError(f"{pwhere}: missing {key}; it gives the PipelineModule stages and the mpu degrees")
        pp = _int(pipeline, "num_stages", pwhere)
        mpu = pipeline["mpu"]
        if not isinstance(mpu, dict) or "tensor_model_parallel_size" not in mpu:
            raise SpecError(f"{pwhere}: missing mpu.tensor_model_parallel_size")
        if autotp.get("autotp_size") and tp != _int(mpu, "tensor_model_parallel_size", f"{pwhere}: mpu"):
            raise SpecError(f"{where}: tensor_parallel.autotp_size {tp} but {pwhere}'s mpu.tensor_model_parallel_size "
                            f"{mpu['tensor_model_parallel_size']}; make them agree")
        tp = _int(mpu, "tensor_model_parallel_size", f"{pwhere}: mpu")
        cp = _int(mpu, "sequence_parallel_world_size", f"{pwhere}: mpu") if "sequence_parallel_world_size" in mpu else 1
        sp = bool(mpu.get("sequence_parallel", False)) and tp > 1
        interval = _checkpoint_interval(interval, pipeline, where, notes)
        method = pipeline.get("partition_method", PARTITION_METHOD)
        if method != PARTITION_METHOD and "layers_per_stage" not in pipeline:
            raise SpecError(f"{pwhere}: partition_method {method!r} is not read (autotune reads DeepSpeed's "
                            f"{PARTITION_METHOD!r} split); give the split it makes as layers_per_stage")
        if "layers_per_stage" in pipeline:
            raw = pipeline["layers_per_stage"]
            if not isinstance(raw, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in raw):
                raise SpecError(f"{pwhere}: layers_per_stage must be a list of whole numbers")
            layers = tuple(raw)
        if "sequence_parallel_size" in config and _int(config, "sequence_parallel_size", where) != cp:
            raise SpecError(f"{where}: sequence_parallel_size {config['sequence_parallel_size']} but {pwhere}'s "
                            f"mpu.sequence_parallel_world_size {cp}; make them agree")
        if cp > 1:
            notes.append(f"mpu.sequence_parallel_world_size {cp}: DeepSpeed-Ulysses, costed as context parallelism")
    elif "sequence_parallel_size" in config:  # Ulysses without an mpu: the mesh deepspeed.initialize builds
        cp = _int(config, "sequence_parallel_size", where)
        if cp > 1:
            notes.append(f"sequence_parallel_size {cp}: DeepSpeed-Ulysses, costed as context parallelism")
    if pipeline is None and "pipeline" in config:
        raise SpecError(f"{where} has a pipeline section, but the stage count and tensor-parallel degree are "
                        "PipelineModule/mpu arguments, not JSON: write them beside it as ds_pipeline.json, "
                        '{"num_stages": P, "mpu": {"tensor_model_parallel_size": T}}')
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 0:
        raise SpecError(f"activation_checkpoint_interval must be a whole number, got {interval!r}")
    if interval > 1:
        notes.append(f"activation_checkpoint_interval {interval}: checkpoints every {ordinal(interval)} layer "
                     "boundary; costed as full recompute of every layer")
    check_sizes(where, degrees=(tp, pp, cp))
    mbs, gas, tbs = (_size(config, key, where) for key in ("train_micro_batch_size_per_gpu",
                                                           "gradient_accumulation_steps", "train_batch_size"))
    if len(batch_keys) == 1:  # DeepSpeed's _set_batch_related_parameters: no accumulation
        gas = 1
    if mbs is not None and gas is not None:
        per_dp = mbs * gas
        dp = tbs // per_dp if tbs is not None and per_dp and tbs % per_dp == 0 else None
        if tbs is not None and dp is None:
            raise SpecError(f"{where}: train_batch_size {tbs} is not micro-batch {mbs} x gradient accumulation "
                            f"{gas} x a data-parallel size; fix one of them")
    else:
        dp = None
    if dp is None:
        if gpus % (tp * pp * cp):
            raise SpecError(f"tp x pp x cp = {tp * pp * cp} does not divide --gpus {gpus}")
        dp = gpus // (tp * pp * cp)
        mbs = mbs if mbs is not None else tbs // (dp * gas) if tbs and gas and tbs % (dp * gas) == 0 else None
        gas = gas if gas is not None else tbs // (dp * mbs) if tbs and mbs and tbs % (dp * mbs) == 0 else None
        if mbs is None or gas is None:
            raise SpecError(f"{where}: train_batch_size {tbs} does not split over dp {dp}; fix the batch keys")
        tbs = mbs * gas * dp
    if pipeline is None and tp * pp * cp * dp != gpus and autotp.get("autotp_size"):
        raise SpecError(f"{where}: tensor_parallel.autotp_size {tp} x data-parallel {dp} x sequence-parallel {cp} "
                        f"= {tp * dp * cp} GPUs, but --gpus is {gpus}; fix the batch keys or the degree")
    if pipeline is not None and tp * pp * cp * dp != gpus and gpus % (tp * pp * cp) == 0:
        raise SpecError(f"{where}: train_batch_size {tbs} != train_micro_batch_size_per_gpu {mbs} x "
                        f"gradient_accumulation_steps {gas} x data-parallel size {gpus // (tp * pp * cp)} (--gpus "
                        f"{gpus} / tp {tp} x pp {pp} x cp {cp}), which DeepSpeed asserts; fix the batch keys, or "
                        f"check on {tp * pp * cp * dp} GPUs")
    if pipeline is None and gpus % (pp * cp * dp):
        raise SpecError(f"{where}: train_batch_size {tbs} / (train_micro_batch_size_per_gpu {mbs} x "
                        f"gradient_accumulation_steps {gas}) = data-parallel size {dp}, which does not divide --gpus "
                        f"{gpus}; fix the batch keys, or check on a multiple of {dp} GPUs")
    if pipeline is None and tp * pp * cp * dp != gpus:
        tp = gpus // (pp * cp * dp)
        notes.append(f"no ds_pipeline.json: pp 1 assumed and tp {tp} (--gpus / dp) from the mpu, which DeepSpeed's "
                     "JSON does not hold")
    dtype = "fp16" if fp16 is True else "bf16"
    states = optimizer_states(config, zero, notes) if bf16 is True else "fp32"
    # autotune's ds_pipeline.json records the model its model code builds and the sequence it trains ("model")
    shape = pipeline.get("model") if pipeline is not None else None
    seq_len = _size(shape, "seq_len", "ds_pipeline.json: model") if isinstance(shape, dict) else None
    return Reading(trainer="deepspeed", tp=tp, pp=pp, cp=cp, dp=dp, mbs=mbs or 1, num_microbatches=gas,
                   global_batch=tbs, seq_len=seq_len, model_fields=_model_fields(shape), model_soft=_model_soft(shape),
                   recompute="full" if interval else "none", zero=zero, overlap_grad_reduce=overlap,
                   sequence_parallel=sp, layers_per_stage=layers, split="deepspeed", bucket_size=bucket,
                   dtype=dtype, grad_reduce=grad_reduce(config, dtype, zero, notes, where), optimizer_states=states,
                   fp32=full_precision, notes=tuple(notes))
