"""Colossal-AI: the one trainer that implements 2-D, 2.5-D and 3-D tensor parallelism (paper 2).

Target: Colossal-AI's legacy configuration file (`colossalai.legacy.launch_from_torch(config=...)`, the
`parallel = dict(pipeline=..., tensor=dict(size=..., mode=..., depth=...))` schema of Colossal-AI <= 0.3),
where data parallelism is derived as world_size / (pipeline * tensor size). Not validated by Colossal-AI's own
code in the tests: its PyPI package needs CUDA to import; the tests check the schema's rules instead.
"""

from __future__ import annotations

from autotune.emit import EmitInput, EmitResult
from autotune.emit.common import commented, header_lines
from autotune.emit.quote import python_str
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
    if p.zero >= 2:
        warnings.append(f"ZeRO-{p.zero} is emitted as Colossal-AI's zero config only with pp 1; check its "
                        "sharding strategy matches")
    return EmitResult((("colossalai_config.py", _config(inp)), ("launch_colossalai.sh", _launch(inp))),
                      tuple(warnings))


def _tensor(inp: EmitInput) -> str:
    p = inp.plan
    if p.tp == 1:
        return "dict(size=1, mode=None)"
    grid = tp_mode_degrees(p.tp_mode, p.tp)
    depth = f", depth={grid.depth}" if p.tp_mode == "2.5d" else ""
    return f"dict(size={p.tp}, mode={python_str(p.tp_mode)}{depth})"


def _config(inp: EmitInput) -> str:
    p, job = inp.plan, inp.job
    precision = "AMP_TYPE.TORCH" if job.dtype in ("fp16", "bf16") else "AMP_TYPE.TORCH"
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
        f"fp16 = dict(mode={precision})",
        "clip_grad_norm = 1.0",
    ]
    if p.recompute != "none":
        lines.append("model = dict(checkpoint=True)  # activation checkpointing on every layer")
    if p.zero >= 1 and p.pp == 1:
        lines.append(f"zero = dict(model_config=dict(tensor_placement_policy='cuda', shard_strategy=None), "
                     f"optimizer_config=dict(initial_scale=2**16))  # ZeRO-{p.zero}")
    return "\n".join(lines) + "\n"


def _launch(inp: EmitInput) -> str:
    p = inp.plan
    nodes = max(1, p.num_gpus // inp.gpus_per_node)
    per_node = p.num_gpus // nodes
    return (
        "#!/usr/bin/env bash\n" + commented(header_lines(inp, "colossalai", TARGET))
        + "# Run on each node with NODE_RANK and MASTER_ADDR set; TRAIN_SCRIPT is your Colossal-AI training script,\n"
        "# which calls colossalai.legacy.launch_from_torch(config='colossalai_config.py').\n"
        "set -euo pipefail\n"
        f'NNODES="${{NNODES:-{nodes}}}"\nNODE_RANK="${{NODE_RANK:-0}}"\n'
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"\nMASTER_PORT="${MASTER_PORT:-29500}"\n'
        'TRAIN_SCRIPT="${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your Colossal-AI training script}"\n'
        f'torchrun --nnodes "$NNODES" --nproc-per-node {per_node} --node-rank "$NODE_RANK" '
        '--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$TRAIN_SCRIPT" --config colossalai_config.py "$@"\n'
    )
