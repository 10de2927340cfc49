"""Colossal-AI: the one trainer that implements 2-D, 2.5-D and 3-D tensor parallelism (paper 2).

Target: Colossal-AI's legacy configuration file (`colossalai.legacy.launch_from_torch(config=...)`, the
`parallel = dict(pipeline=..., tensor=dict(size=..., mode=..., depth=...))` schema of Colossal-AI <= 0.3),
where data parallelism is derived as world_size / (pipeline * tensor size). Not validated by Colossal-AI's own
code in the tests: its PyPI package needs CUDA to import; the tests check the schema's rules instead.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.emit import EmitInput, EmitResult
from autotune.emit.common import commented, header_lines
from autotune.emit.quote import python_str
from autotune.emit.runfiles import (launch_shape, nccl_env_block, nodes_block, required_env_block, sbatch_script,
                                     schedule)
from autotune.errors import SpecError
from autotune.specs.plan import Plan
from autotune.specs.tpgrid import tp_mode_degrees

TARGET = "legacy config schema of Colossal-AI <= 0.3 (colossalai.legacy)"


def emit_colossalai(inp: EmitInput) -> EmitResult:
    """`colossalai_config.py` and `launch_colossalai.sh` for the plan."""
    p = inp.plan
    warnings = []
    if p.tp_overlap:
        warnings.append("tp_overlap: Colossal-AI's legacy config has no tensor-parallel communication overlap; it "
                        "runs exposed (plan with --no-tp-overlap to cost it that way)")
    if p.cp > 1:
        warnings.append(f"Colossal-AI's legacy config has no context parallelism: cp {p.cp} is folded into data "
                        "parallelism (the predicted time does not hold)")
    if p.schedule == "interleaved":
        warnings.append("Colossal-AI's legacy pipeline is 1F1B with one chunk per rank here: vpp is set to 1")
    elif p.schedule in ("zb-h1", "v-half"):
        warnings.append(f"schedule {p.schedule}: Colossal-AI's legacy schedules have no zero-bubble or V "
                        "schedule; emitted 1F1B with one chunk per rank (a larger bubble than predicted"
                        + (", about twice V-Half's activation memory" if p.schedule == "v-half" else "")
                        + "). Its newer booster API has a V-shaped zero-bubble scheduler (HybridParallelPlugin("
                        "pp_style='zbv'), Colossal-AI 0.5.0), outside the legacy schema this emitter targets")
    if p.vocab == "parallel":
        warnings.append("vocab parallel: Colossal-AI cannot split the embedding and LM head over pipeline stages; "
                        "they stay on the first and last stage (more memory there, a slower step than predicted)")
    if p.recompute == "selective" or p.recompute_layers is not None:
        warnings.append("Colossal-AI's legacy checkpointing is per layer and all-or-nothing: full recompute emitted")
    if p.zero >= 1 and p.pp > 1:
        warnings.append(f"ZeRO-{p.zero} with pp {p.pp}: Colossal-AI's legacy zero config does not combine with "
                        "pipeline parallelism; emitted without ZeRO (every rank keeps its whole optimizer state: "
                        "more memory than predicted)")
    elif p.zero >= 2:
        warnings.append(f"ZeRO-{p.zero}: emitted as Colossal-AI's legacy zero config (sharded model, ZeRO-3 style); "
                        "check its sharding strategy matches")
    if inp.job.dtype != "fp16":
        warnings.append(f"dtype {inp.job.dtype}: Colossal-AI's legacy AMP is fp16 only (AMP_TYPE.TORCH/APEX/NAIVE use "
                        "a loss scaler); emitted no fp16 section and DTYPE = 'bfloat16' for the training script to "
                        "cast the model to" + (" (fp8 is not available: slower than predicted)"
                                              if inp.job.dtype == "fp8" else ""))
    nodes, per_node = launch_shape(p.num_gpus, inp.gpus_per_node)
    files = (("colossalai_config.py", _config(inp)), ("launch_colossalai.sh", _launch(inp, nodes, per_node)),
             ("sbatch_colossalai.sh", sbatch_script(inp, "colossalai", TARGET, "launch_colossalai.sh", nodes,
                                                    per_node, 29500)))
    return EmitResult(files, tuple(warnings))


def _tensor(inp: EmitInput) -> str:
    p = inp.plan
    if p.tp == 1:
        return "dict(size=1, mode=None)"
    grid = tp_mode_degrees(p.tp_mode, p.tp)
    depth = f", depth={grid.depth}" if p.tp_mode == "2.5d" else ""
    return f"dict(size={p.tp}, mode={python_str(p.tp_mode)}{depth})"


def _data_parallel_plan(inp: EmitInput) -> Plan:
    """The plan as its data-parallel ranks run it: without context parallelism, the cp ranks are data-parallel
    ones, each with 1/cp of the micro-batches (specs/trainers.py as_run folds it the same way), so the global batch
    stays the planned one; a micro-batch count cp does not divide cannot be folded so."""
    p = inp.plan
    if p.cp == 1:
        return p
    if p.num_microbatches % p.cp:
        raise SpecError(f"cp {p.cp}: Colossal-AI's legacy config has no context parallelism, and its "
                        f"{p.num_microbatches} micro-batches per rank do not split over {p.cp} more data-parallel "
                        "ranks; plan with --trainer colossalai (or a batch cp divides)")
    return replace(p, dp=p.dp * p.cp, num_microbatches=p.num_microbatches // p.cp, cp=1)


def _config(inp: EmitInput) -> str:
    p, job, m, s = _data_parallel_plan(inp), inp.job, inp.model, schedule(inp, "colossalai")
    lines = [
        commented(header_lines(inp, "colossalai", TARGET)).rstrip("\n"),
        "from colossalai.legacy.amp import AMP_TYPE",
        "",
        f"BATCH_SIZE = {p.mbs * p.num_microbatches}  # sequences per data-parallel rank per step",
        f"NUM_MICRO_BATCHES = {p.num_microbatches if p.pp > 1 else 1}",
        f"SEQ_LEN = {job.seq_len}",
        f"GLOBAL_BATCH_SIZE = {job.global_batch}",
        f"gradient_accumulation = {1 if p.pp > 1 else p.num_microbatches}",
        "",
        f"parallel = dict(pipeline={p.pp}, tensor={_tensor(inp)})",
        "fp16 = dict(mode=AMP_TYPE.TORCH)  # fp16 autocast with a loss scaler" if job.dtype == "fp16" else
        "DTYPE = 'bfloat16'  # no legacy bf16 AMP: the training script casts the model (model.to(torch.bfloat16))",
        "clip_grad_norm = 1.0",
        "",
        "# The run (read by the training script): AdamW, linear warm-up, cosine decay to a tenth of the peak LR over",
        "# the steps --train-tokens takes, checkpoints about hourly; DATA_PATH, TOKENIZER_MODEL and CHECKPOINT_DIR",
        "# come from the environment (launch_colossalai.sh requires them).",
        f"TRAIN_STEPS = {s.steps}",
        f"WARMUP_STEPS = {s.warmup}",
        f"LR = {s.lr!r}",
        f"MIN_LR = {s.min_lr!r}",
        "ADAM_BETAS = (0.9, 0.95)",
        "WEIGHT_DECAY = 0.1",
        f"SAVE_INTERVAL = {s.save_interval}",
        f"LOG_INTERVAL = {s.log_interval}",
        "",
        "# The model's hyperparameters (the model code must use them).",
        f"MODEL = dict(num_layers={m.num_layers}, hidden_size={m.hidden_size}, num_attention_heads={m.num_heads}, "
        f"num_key_value_heads={m.num_kv_heads}, head_dim={m.head_dim}, ffn_hidden_size={m.ffn_hidden_size}, "
        f"vocab_size={m.vocab_size}, activation={python_str(m.activation)}, norm={python_str(m.norm)}, "
        f"norm_eps={m.norm_eps!r}, position_embedding={python_str(m.position_embedding)}, "
        f"rope_theta={m.rope_theta!r}, rope_scaling={python_str(m.rope_scaling)}, "
        f"rope_scaling_factor={m.rope_scaling_factor!r}, tied_embeddings={m.tied_embeddings}, "
        f"bias={python_str(m.bias)}, init_std={m.init_std!r}"
        + (f", rotary_fraction={m.rotary_fraction!r}" if m.rotary_fraction < 1 else "")
        + (", parallel_block=True" if m.parallel_block else "") + ")",
    ]
    if p.recompute != "none":
        lines.append("model = dict(checkpoint=True)  # activation checkpointing on every layer")
    if p.zero >= 1 and p.pp == 1:
        lines.append(f"zero = dict(model_config=dict(tensor_placement_policy='cuda', shard_strategy=None), "
                     f"optimizer_config=dict(initial_scale=2**16))  # ZeRO-{p.zero}")
    return "\n".join(lines) + "\n"


def _launch(inp: EmitInput, nodes: int, per_node: int) -> str:
    return (
        "#!/usr/bin/env bash\n" + commented(header_lines(inp, "colossalai", TARGET))
        + "# Run on each node with NODE_RANK and MASTER_ADDR set (sbatch_colossalai.sh does); TRAIN_SCRIPT is your\n"
        "# Colossal-AI training script, which calls colossalai.legacy.launch_from_torch(config='colossalai_config.py').\n"
        "set -euo pipefail\n"
        + nodes_block(nodes, per_node, 29500)
        + 'TRAIN_SCRIPT="${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your Colossal-AI training script}"\n'
        + required_env_block(inp.mock_data)
        + ("" if inp.mock_data else "export DATA_PATH TOKENIZER_MODEL CHECKPOINT_DIR\n") + "\n" + nccl_env_block()
        + 'SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n\n'
        f'torchrun --nnodes "$NNODES" --nproc-per-node {per_node} --node-rank "$NODE_RANK" '
        '--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$TRAIN_SCRIPT" '
        '--config "$SCRIPT_DIR/colossalai_config.py" "$@"\n'
    )
