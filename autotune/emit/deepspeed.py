"""DeepSpeed 0.19.8: `ds_config.json` for `deepspeed.initialize` and `ds_pipeline.json` for the PipelineModule.

DeepSpeed splits a launch in two. The JSON config carries the batch (train_batch_size = micro batch x
gradient accumulation x data-parallel size; runtime/config.py `_batch_assertion`), ZeRO, precision and the
pipeline engine's activation checkpointing (`pipeline.activation_checkpoint_interval`, which the engine copies
onto the module; runtime/pipe/engine.py). The pipeline's stage count and partition are Python arguments of
`PipelineModule(layers, num_stages=, topology=, partition_method=, activation_checkpoint_interval=)`, and the
tensor-parallel degree comes from an `mpu` (Megatron-DeepSpeed); `ds_pipeline.json` holds those values.

JSON has no comments: the header goes under a top-level "_autotune" key. DeepSpeedConfig ignores unknown
top-level keys (it reads the keys it knows from the dict), while its pydantic sections such as
zero_optimization reject unknown keys, so nothing of ours goes inside a DeepSpeed section.
"""

from __future__ import annotations

from typing import Any

from autotune.emit import EmitInput, EmitResult
from autotune.emit.common import header_lines
from autotune.emit.quote import json_text
from autotune.errors import InvalidPlanError
from autotune.specs.plan import Plan

TARGET = "DeepSpeed 0.19.8"
CONFIG_FILE = "ds_config.json"
PIPELINE_FILE = "ds_pipeline.json"
#: Megatron-DeepSpeed's GPTModelPipe partitions with 'type:transformer': the regex (case-insensitive, searched
#: in each LayerSpec's class name) matches ParallelTransformerLayerPipe, so only transformer layers are counted
#: and the embedding lands on the first stage, the final norm and LM head on the last.
PARTITION_METHOD = "type:transformer"
#: DeepSpeed's default `steps_per_print`.
STEPS_PER_PRINT = 10
GRADIENT_CLIPPING = 1.0


class DeepSpeedPlanError(InvalidPlanError):
    """A plan DeepSpeed itself refuses to run."""


def emit_deepspeed(inp: EmitInput) -> EmitResult:
    """The plan as DeepSpeed's JSON config plus the PipelineModule arguments; warnings for what DeepSpeed
    cannot express (the closest configuration is emitted instead)."""
    plan = inp.plan
    refuse(plan)
    warnings: list[str] = []
    if plan.tp_overlap:
        warnings.append("tp_overlap: DeepSpeed has no tensor-parallel communication overlap; it runs exposed "
                        "(plan with --no-tp-overlap, or --trainer deepspeed, to cost it that way)")
    interval = _checkpoint_interval(plan, warnings)
    config = _ds_config(inp, interval, warnings)
    pipeline = _pipeline_args(inp, interval, warnings)
    return EmitResult(files=((CONFIG_FILE, dump(config)), (PIPELINE_FILE, dump(pipeline))),
                      warnings=tuple(warnings))


def refuse(plan: Plan) -> None:
    """Raise for what DeepSpeed rejects outright: ZeRO-2/3 with a pipeline (runtime/pipe/engine.py asserts
    "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism") and ZeRO stages beyond 3."""
    if plan.zero not in (0, 1, 2, 3):
        raise DeepSpeedPlanError(f"zero {plan.zero}: DeepSpeed's ZeRO stages are 0, 1, 2 and 3")
    if plan.zero >= 2 and plan.pp > 1:
        raise DeepSpeedPlanError(f"zero {plan.zero} with pp {plan.pp}: DeepSpeed's pipeline engine refuses ZeRO-2 "
                                 "and ZeRO-3 (incompatible with pipeline parallelism); use zero 0 or 1, or pp 1")


def dump(doc: dict[str, Any]) -> str:
    """Sorted keys, 2-space indent, trailing newline: byte-identical for the same inputs (emit/quote.py)."""
    return json_text(doc)


def deepspeed_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Transformer layers per stage under partition_method 'type:...': DeepSpeed's `partition_balanced` over
    0/1 weights gives every stage floor(L/pp) layers and the first L mod pp stages one more (checked against
    deepspeed.runtime.utils.partition_balanced in tests/emit/test_deepspeed.py)."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (i < extra) for i in range(pp))


# ------------------------------------------------------------------------------------------------ ds_config.json
def _ds_config(inp: EmitInput, interval: int, warnings: list[str]) -> dict[str, Any]:
    plan, job = inp.plan, inp.job
    config: dict[str, Any] = {
        "_autotune": {"header": header_lines(inp, "deepspeed", TARGET),
                      "see_also": f"{PIPELINE_FILE}: PipelineModule arguments and the tensor-parallel mpu"},
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": plan.num_microbatches,
        "gradient_clipping": GRADIENT_CLIPPING,
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
        "zero_optimization": _zero(plan),
        **_precision(job.dtype, warnings),
    }
    if plan.pp > 1:
        config["pipeline"] = {"activation_checkpoint_interval": interval}
    if plan.cp > 1:
        warnings.append(f"cp {plan.cp}: DeepSpeed has no ring-attention context parallelism; the closest is "
                        f"DeepSpeed-Ulysses of degree {plan.cp} (mpu.sequence_parallel_world_size in "
                        f"{PIPELINE_FILE}, which the mpu's get_sequence_parallel_world_size must return; all-to-all "
                        f"over heads, so the {inp.model.num_heads} heads must be divisible by tp x cp = "
                        f"{plan.tp * plan.cp}), whose communication differs from the prediction")
    return config


def _zero(plan: Plan) -> dict[str, Any]:
    """ZeRO stage and buckets; DeepSpeed counts bucket sizes in elements, as plan.bucket_size does."""
    zero: dict[str, Any] = {"stage": plan.zero, "reduce_bucket_size": plan.bucket_size,
                            "overlap_comm": True, "contiguous_gradients": True}
    if plan.zero == 3:
        zero["stage3_prefetch_bucket_size"] = plan.bucket_size
    else:
        zero["allgather_bucket_size"] = plan.bucket_size
    return zero


def _precision(dtype: str, warnings: list[str]) -> dict[str, Any]:
    if dtype == "fp8":
        warnings.append("dtype fp8: DeepSpeed's config has no fp8 training mode (that comes from Transformer "
                        "Engine in the model code); emitted bf16, which is slower than predicted")
    return {"bf16": {"enabled": dtype != "fp16"}, "fp16": {"enabled": dtype == "fp16"}}


# ------------------------------------------------------------------------------------------------ ds_pipeline.json
def _checkpoint_interval(plan: Plan, warnings: list[str]) -> int:
    """PipelineModule's activation_checkpoint_interval: 0 = none, 1 = every layer recomputed on its own.
    DeepSpeed checkpoints whole layers only, so partial and selective recomputation become full."""
    if plan.recompute == "none":
        return 0
    if plan.recompute == "selective":
        warnings.append("recompute selective: DeepSpeed's PipelineModule checkpoints whole layers only; emitted "
                        "activation_checkpoint_interval 1 (full recompute: less memory, slower than predicted) "
                        "unless the model code recomputes attention itself")
    elif plan.recompute_layers is not None and plan.recompute_layers < max(plan.layers_per_stage):
        warnings.append(f"recompute full of {plan.recompute_layers} layers per stage: DeepSpeed's "
                        "activation_checkpoint_interval checkpoints every layer; emitted 1 (all layers "
                        "recomputed: less memory, slower than predicted)")
    return 1


def _schedule_warnings(plan: Plan) -> list[str]:
    """ZB-H1, V-Half and vocabulary parallelism: DeepSpeed's PipelineModule runs its 1F1B TrainSchedule."""
    out = []
    if plan.schedule == "zb-h1":
        out.append("schedule zb-h1: DeepSpeed's pipeline engine has no zero-bubble schedule (TrainSchedule is "
                   "1F1B); emitted 1F1B with the same layers per rank: the same peak memory, but a larger bubble "
                   "than predicted (weight gradients are not deferred into it)")
    elif plan.schedule == "v-half":
        out.append("schedule v-half: DeepSpeed has no V-Half; emitted PipelineModule's 1F1B with the same layers per "
                   f"rank, one chunk each: the LM head moves from rank 0 to stage {plan.pp - 1}, the bubble is larger "
                   "and the activation memory about twice the V-Half prediction (DeepSpeed 0.19.8's "
                   "deepspeed.pipe.DualPipeVModule has the V placement, but not V-Half's memory; not emitted)")
    if plan.vocab == "parallel":
        out.append("vocab parallel: DeepSpeed cannot split the embedding and LM head over pipeline stages; emitted "
                   "the embedding on the first stage and the norm and LM head on the last (more memory there and a "
                   "slower step than predicted)")
    return out


def _pipeline_args(inp: EmitInput, interval: int, warnings: list[str]) -> dict[str, Any]:
    plan = inp.plan
    layers, ds_layers = list(plan.layers_per_stage), list(deepspeed_split(inp.model.num_layers, plan.pp))
    notes = [
        "PipelineModule(layers=specs, num_stages=num_stages, topology=PipeModelDataParallelTopology(**topology), "
        "partition_method=partition_method, activation_checkpoint_interval=activation_checkpoint_interval)",
        "layer specs in order: embedding, the transformer layers, final norm, LM head (TiedLayerSpec when the "
        "embedding is tied); only layers whose class name matches the partition regex are counted",
        "tensor, sequence and Ulysses parallelism live in the model code: pass deepspeed.initialize an mpu "
        "(Megatron-DeepSpeed's) whose get_*_world_size methods return the mpu degrees here; DeepSpeed takes the "
        "data-parallel size for the batch from mpu.get_data_parallel_world_size()",
    ]
    if plan.schedule == "interleaved":
        warnings.append(f"schedule interleaved (vpp {plan.vpp}): DeepSpeed's pipeline engine has no interleaved "
                        "schedule; emitted plain 1F1B (vpp 1) with the same layers per rank, whose bubble is "
                        f"{plan.vpp}x larger than predicted")
    warnings += _schedule_warnings(plan)
    if layers != ds_layers:
        warnings.append(f"layers_per_stage {','.join(map(str, layers))}: DeepSpeed's partition_method "
                        f"'{PARTITION_METHOD}' gives {','.join(map(str, ds_layers))}; to get the planned split, "
                        f"override PipelineModule._partition_layers with the counts in {PIPELINE_FILE}")
        notes.append("custom split: override PipelineModule._partition_layers to set self.parts (layer-spec "
                     "boundaries, length num_stages + 1) so that stage i holds layers_per_stage[i] transformer "
                     "layers, then call self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])")
    return {
        "_autotune": {"header": header_lines(inp, "deepspeed", TARGET), "notes": notes},
        "num_stages": plan.pp,
        "partition_method": PARTITION_METHOD,
        "partition_method_layers_per_stage": ds_layers,
        "layers_per_stage": layers,
        "activation_checkpoint_interval": interval,
        # PipeModelDataParallelTopology must cover the world: context-parallel (Ulysses) ranks sit in the dp axis
        "topology": {"num_pp": plan.pp, "num_mp": plan.tp, "num_dp": plan.dp * plan.cp},
        "mpu": {"tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
                "data_parallel_size": plan.dp, "sequence_parallel": plan.sequence_parallel,
                "sequence_parallel_world_size": plan.cp},
        "world_size": plan.num_gpus,
    }
