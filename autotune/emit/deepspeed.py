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
from autotune.emit.common import commented, header_lines
from autotune.emit.quote import json_text
from autotune.emit.runfiles import (REQUIRED_ENV, launch_shape, nccl_env_block, nodes_block, required_env_block,
                                     sbatch_script, schedule)
from autotune.errors import InvalidPlanError, SpecError
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan
from autotune.specs.trainers import DEEPSPEED_MOE, TRAINER_CAPS, refusal

TARGET = "DeepSpeed 0.19.8"
CONFIG_FILE = "ds_config.json"
PIPELINE_FILE = "ds_pipeline.json"
#: Megatron-DeepSpeed's GPTModelPipe partitions with 'type:transformer': the regex (case-insensitive, searched
#: in each LayerSpec's class name) matches ParallelTransformerLayerPipe, so only transformer layers are counted
#: and the embedding lands on the first stage, the final norm and LM head on the last.
PARTITION_METHOD = "type:transformer"
#: Layer classes the pipeline engine may checkpoint (PipelineModule(checkpointable_layers=...), as
#: Megatron-DeepSpeed's GPTModelPipe passes it): without it the interval also wraps the embedding, whose integer
#: input needs no gradient, and backward fails ("element 0 of tensors does not require grad").
CHECKPOINTABLE_LAYERS = ["ParallelTransformerLayerPipe"]
#: DeepSpeed's default `steps_per_print`.
STEPS_PER_PRINT = 10
GRADIENT_CLIPPING = 1.0
LAUNCH_FILE = "launch_deepspeed.sh"
MASTER_PORT = 29500
#: Plans DeepSpeed 0.19.8 cannot run, for the search's trainer table: pipeline parallelism with context
#: (Ulysses) parallelism. With a pipeline DeepSpeed ignores a user mpu and takes the data-parallel size from its
#: topology, where the Ulysses ranks sit (dp x cp), so "train_batch_size is not equal to micro_batch_per_gpu *
#: gradient_acc_step * world_size"; counting the cp ranks as data-parallel would train a different batch.
REFUSES_PP_WITH_CP = True
PP_WITH_CP_REASON = ("DeepSpeed's pipeline engine takes its data-parallel size from the topology, where the "
                     "Ulysses (cp) ranks sit, and ignores the mpu, so deepspeed.initialize rejects the batch")
#: AdamW of the Llama recipes; torch_adam: DeepSpeed builds torch.optim.AdamW (foreach), which needs no compiled
#: DeepSpeed op (FusedAdam's CUDA build); drop it to get FusedAdam.
ADAM = {"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True}


class DeepSpeedPlanError(InvalidPlanError):
    """A plan DeepSpeed itself refuses to run."""


def emit_deepspeed(inp: EmitInput) -> EmitResult:
    """The plan as DeepSpeed's JSON config plus the PipelineModule arguments; warnings for what DeepSpeed
    cannot express (the closest configuration is emitted instead)."""
    plan = inp.plan
    refuse_moe(inp.model)
    refuse(plan)
    warnings: list[str] = []
    if plan.tp_overlap:
        warnings.append("tp_overlap: DeepSpeed has no tensor-parallel communication overlap; it runs exposed "
                        "(plan with --no-tp-overlap, or --trainer deepspeed, to cost it that way)")
    interval = _checkpoint_interval(plan, warnings)
    config = _ds_config(inp, interval, warnings)
    pipeline = _pipeline_args(inp, interval, warnings)
    nodes, per_node = launch_shape(plan.num_gpus, inp.gpus_per_node)
    files = ((CONFIG_FILE, dump(config)), (PIPELINE_FILE, dump(pipeline)), (LAUNCH_FILE, _launch(inp, nodes, per_node)),
             ("sbatch_deepspeed.sh", sbatch_script(inp, "deepspeed", TARGET, LAUNCH_FILE, nodes, per_node,
                                                   MASTER_PORT)))
    return EmitResult(files=tuple(sorted(files)), warnings=tuple(warnings))


def refuse_moe(model: ModelSpec) -> None:
    """A mixture of experts is refused: no ds_config key makes the launch's model use DeepSpeed-MoE (and a dense
    config would train something else). DeepSpeed 0.19.8's AutoEP (`expert_parallel` in ds_config) rewrites the
    MoE blocks of a Hugging Face model in deepspeed.initialize, but rejects tensor parallelism from an mpu
    (engine.py _configure_expert_parallel) and expert_tensor_parallel_size > 1 (auto_ep_folding.py), and the
    launch here is a PipelineModule + mpu script, not a Hugging Face model."""
    if model.is_moe:
        raise SpecError(f"--trainer deepspeed: {model.name} is a mixture of experts; {DEEPSPEED_MOE} (AutoEP's "
                        "ds_config 'expert_parallel' rewrites only Hugging Face models, without mpu TP or etp > 1); "
                        "use --trainer megatron")


def refuse(plan: Plan) -> None:
    """Raise for what DeepSpeed rejects outright: ZeRO-2/3 with a pipeline (runtime/pipe/engine.py asserts
    "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism") and ZeRO stages beyond 3."""
    if plan.zero not in (0, 1, 2, 3):
        raise DeepSpeedPlanError(f"zero {plan.zero}: DeepSpeed's ZeRO stages are 0, 1, 2 and 3")
    if plan.zero >= 2 and plan.pp > 1:
        raise DeepSpeedPlanError(f"zero {plan.zero} with pp {plan.pp}: DeepSpeed's pipeline engine refuses ZeRO-2 "
                                 "and ZeRO-3 (incompatible with pipeline parallelism); use zero 0 or 1, or pp 1")
    if REFUSES_PP_WITH_CP and plan.pp > 1 and plan.cp > 1:
        raise DeepSpeedPlanError(f"cp {plan.cp} with pp {plan.pp}: {PP_WITH_CP_REASON}; plan with --cp 1 or --pp 1 "
                                 "(or --trainer deepspeed)")
    refused = refusal(TRAINER_CAPS["deepspeed"], plan)  # the capability table's row (specs/trainers.py)
    if refused is not None:
        raise DeepSpeedPlanError(refused)


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
        **_precision(job, warnings),
        **_optimizer(inp),
    }
    if plan.pp > 1:
        config["pipeline"] = {"activation_checkpoint_interval": interval}
    elif interval:
        # Without a pipeline nothing reads activation_checkpoint_interval: DeepSpeed recomputes only what the
        # model wraps in deepspeed.checkpointing.checkpoint, configured from this section.
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
        warnings.append("recompute with pp 1: DeepSpeed recomputes only the layers the model code wraps in "
                        "deepspeed.checkpointing.checkpoint (call deepspeed.checkpointing.configure(mpu, "
                        f"deepspeed_config='{CONFIG_FILE}') first; its activation_checkpointing section is emitted): "
                        "wrap every transformer layer")
    if plan.cp > 1 and plan.tp == 1:
        # No mpu needed: given both sizes (and the config as a dict), deepspeed.initialize builds a
        # (data_parallel, sequence_parallel) device mesh itself and DeepSpeedConfig divides the world by sp.
        config["data_parallel_size"], config["sequence_parallel_size"] = plan.dp, plan.cp
    if plan.cp > 1:
        where = ("sequence_parallel_size in ds_config.json; pass deepspeed.initialize the config as a dict, "
                 "since it looks for these keys only there" if plan.tp == 1 else
                 f"mpu.sequence_parallel_world_size in {PIPELINE_FILE}, which the mpu's "
                 "get_sequence_parallel_world_size must return")
        warnings.append(f"cp {plan.cp}: DeepSpeed has no ring-attention context parallelism; the closest is "
                        f"DeepSpeed-Ulysses of degree {plan.cp} ({where}; all-to-all over heads, so the "
                        f"{inp.model.num_heads} heads must be divisible by tp x cp = {plan.tp * plan.cp}), whose "
                        "communication differs from the prediction")
    return config


def _optimizer(inp: EmitInput) -> dict[str, Any]:
    """AdamW and DeepSpeed's WarmupCosineLR: linear warm-up, cosine decay to a tenth of the peak over the
    steps that --train-tokens takes (runfiles.schedule)."""
    s = schedule(inp, "deepspeed")
    return {"optimizer": {"type": "AdamW", "params": {"lr": s.lr, **ADAM}},
            "scheduler": {"type": "WarmupCosineLR", "params": {
                "total_num_steps": s.steps, "warmup_num_steps": s.warmup, "warmup_min_ratio": 0.0,
                "cos_min_ratio": float(f"{s.min_lr / s.lr:.6g}"), "warmup_type": "linear"}}}


def _zero(plan: Plan) -> dict[str, Any]:
    """ZeRO stage and buckets; DeepSpeed counts bucket sizes in elements, as plan.bucket_size does."""
    zero: dict[str, Any] = {"stage": plan.zero, "reduce_bucket_size": plan.bucket_size,
                            "overlap_comm": True, "contiguous_gradients": True}
    if plan.zero == 3:
        zero["stage3_prefetch_bucket_size"] = plan.bucket_size
    else:
        zero["allgather_bucket_size"] = plan.bucket_size
    return zero


def _precision(job: JobSpec, warnings: list[str]) -> dict[str, Any]:
    dtype = job.dtype
    if dtype == "fp8":
        warnings.append("dtype fp8: DeepSpeed's config has no fp8 training mode (that comes from Transformer "
                        "Engine in the model code); emitted bf16, which is slower than predicted")
    bf16: dict[str, Any] = {"enabled": dtype != "fp16"}
    if job.optimizer_states == "bf16" and dtype != "fp16":
        # bf16 master weights and gradients, bf16 Adam moments: 2 + 2 + (2 + 4)/d bytes, what --optimizer-states
        # bf16 costs (the master weights are whole bf16, where Megatron keeps the fp32 ones' lost bits)
        bf16 |= {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    return {"bf16": bf16, "fp16": {"enabled": dtype == "fp16"}}


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
                   "1F1B); emitted 1F1B with the same layers per rank: no more activation memory (ZB-H1 keeps weight-"
                   "gradient inputs longer), but a larger bubble (weight gradients are not deferred into it)")
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
        "partition_method=partition_method, activation_checkpoint_interval=activation_checkpoint_interval, "
        "checkpointable_layers=checkpointable_layers)",
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
        "checkpointable_layers": CHECKPOINTABLE_LAYERS,
        # PipeModelDataParallelTopology must cover the world: context-parallel (Ulysses) ranks sit in the dp axis
        "topology": {"num_pp": plan.pp, "num_mp": plan.tp, "num_dp": plan.dp * plan.cp},
        "mpu": {"tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
                "data_parallel_size": plan.dp, "sequence_parallel": plan.sequence_parallel,
                "sequence_parallel_world_size": plan.cp},
        "world_size": plan.num_gpus,
        "model": _model(inp),
        "run": _run(inp),
    }


def _model(inp: EmitInput) -> dict[str, Any]:
    """The hyperparameters the model code must use (DeepSpeed has no model config of its own)."""
    m = inp.model
    return {"num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_attention_heads": m.num_heads,
            "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim, "ffn_hidden_size": m.ffn_hidden_size,
            "vocab_size": m.vocab_size, "activation": m.activation, "norm": m.norm, "norm_eps": m.norm_eps,
            "position_embedding": m.position_embedding, "rope_theta": m.rope_theta, "rope_scaling": m.rope_scaling,
            "rope_scaling_factor": m.rope_scaling_factor, "tied_embeddings": m.tied_embeddings, "bias": m.bias,
            "init_std": m.init_std, "seq_len": inp.job.seq_len,
            **({"rotary_fraction": m.rotary_fraction} if m.rotary_fraction < 1 else {}),
            **({"parallel_block": True} if m.parallel_block else {})}


def _run(inp: EmitInput) -> dict[str, Any]:
    """What the training script does outside deepspeed.initialize: steps, checkpoint and log intervals, and the
    environment variables holding the paths (launch_deepspeed.sh requires them)."""
    s = schedule(inp, "deepspeed")
    return {"train_steps": s.steps, "save_interval": s.save_interval, "log_interval": s.log_interval,
            "mock_data": inp.mock_data,
            "paths_from_env": [] if inp.mock_data else [name for name, _ in REQUIRED_ENV]}


def _launch(inp: EmitInput, nodes: int, per_node: int) -> str:
    notes = [
        "DeepSpeed launch: TRAIN_SCRIPT is your DeepSpeed training script (e.g. Megatron-DeepSpeed's pretrain_gpt.py",
        f"adapted to read {PIPELINE_FILE}); it gets --deepspeed_config {CONFIG_FILE} and --pipeline_config "
        f"{PIPELINE_FILE}, and reads",
        "DATA_PATH, TOKENIZER_MODEL and CHECKPOINT_DIR from the environment (the paths of this run).",
        "Run it on each node with NODE_RANK and MASTER_ADDR set (sbatch_deepspeed.sh does).",
    ]
    return (
        "#!/usr/bin/env bash\n" + commented(header_lines(inp, "deepspeed", TARGET)) + "#\n" + commented(notes)
        + "set -euo pipefail\n\n"
        + nodes_block(nodes, per_node, MASTER_PORT)
        + ': "${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your DeepSpeed training script}"\n'
        + required_env_block(inp.mock_data)
        + ("" if inp.mock_data else "export DATA_PATH TOKENIZER_MODEL CHECKPOINT_DIR\n")
        + "\n" + nccl_env_block() + 'SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n\n'
        f'torchrun --nnodes "$NNODES" --nproc-per-node {per_node} --node-rank "$NODE_RANK" \\\n'
        '    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$TRAIN_SCRIPT" \\\n'
        f'    --deepspeed_config "$SCRIPT_DIR/{CONFIG_FILE}" --pipeline_config "$SCRIPT_DIR/{PIPELINE_FILE}" "$@"\n')
