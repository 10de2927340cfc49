"""What every trainer's launch files share for a real run: the training schedule derived from `--train-tokens`,
the required environment variables, the NCCL/network block and the Slurm script.

A launch file must not train on made-up data by accident: the data, tokenizer and checkpoint locations are
environment variables the script refuses to start without (`: "${DATA_PATH:?...}"`); `--mock-data` (EmitInput
.mock_data) opts out for smoke runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.emit import EmitInput
from autotune.emit.asrun import run_figures, what_runs
from autotune.emit.common import commented, header_lines

#: The variables a real run needs, with what each must hold (the message bash prints when one is unset).
REQUIRED_ENV: tuple[tuple[str, str], ...] = (
    ("DATA_PATH", "the training data (Megatron: an indexed-dataset prefix such as /data/corpus_text_document; "
                  "torchtitan: a dataset directory; DeepSpeed/Colossal-AI: what your training script reads)"),
    ("TOKENIZER_MODEL", "the tokenizer of the model (a Hugging Face tokenizer directory or hub name)"),
    ("CHECKPOINT_DIR", "the directory checkpoints are saved to and resumed from"),
)
#: Linear warm-up length of the Llama 2 and Llama 3 8B/70B recipes (Touvron et al. 2023, Dubey et al. 2024).
WARMUP_STEPS = 2000
#: Checkpoint about once an hour of predicted training: losing at most an hour to a failure costs little next to
#: the seconds a (sharded) save takes.
SAVE_EVERY_S = 3600.0
LOG_INTERVAL = 10


@dataclass(frozen=True, slots=True)
class Schedule:
    """The optimizer schedule of a run: steps, warm-up, cosine decay to min_lr, save/eval/log intervals."""

    steps: int
    warmup: int
    lr: float
    min_lr: float
    save_interval: int
    log_interval: int


def peak_lr(params: int) -> float:
    """Peak learning rate by model size, from the Llama 3 paper's recipes (Dubey et al. 2024, section 3.4):
    8B 3e-4, 70B 1.5e-4, 405B 8e-5; larger models need a smaller rate to stay stable."""
    if params <= 20e9:
        return 3.0e-4
    if params <= 150e9:
        return 1.5e-4
    return 8.0e-5


def schedule(inp: EmitInput, trainer: str | None = None, fmt: str | None = None) -> Schedule:
    """Steps = ceil(train tokens / tokens per step); warm-up WARMUP_STEPS, at most a tenth of the run; cosine
    decay over the whole run to a tenth of the peak; a checkpoint about every SAVE_EVERY_S predicted seconds of
    what `trainer`'s config (in format `fmt`) runs: the step time the header states (emit/asrun.py), re-estimated
    where the trainer runs another plan than planned (DeepSpeed's full recompute for a selective one, 1F1B for
    an interleaved schedule, ...), else the planned one (also with no `trainer`)."""
    from autotune.costmodel.memory import total_params

    steps = max(1, math.ceil(inp.train_tokens / (inp.job.global_batch * inp.job.seq_len)))
    lr = peak_lr(total_params(inp.model))
    figures = None if trainer is None else run_figures(inp, what_runs(inp, trainer, fmt))
    step_s = inp.step_time_s if figures is None else figures[0]
    save = max(1, min(steps, round(SAVE_EVERY_S / step_s)))
    # Megatron asserts warm-up < decay steps (optimizer_param_scheduler.py): a one-step run warms up for none
    return Schedule(steps=steps, warmup=min(max(1, min(WARMUP_STEPS, steps // 10)), steps - 1), lr=lr,
                    min_lr=float(f"{lr / 10:.6g}"), save_interval=save, log_interval=min(LOG_INTERVAL, steps))


def launch_shape(num_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, processes per node) for torchrun, which needs the same count on every node."""
    per_node = math.gcd(num_gpus, gpus_per_node)
    return num_gpus // per_node, per_node


def float_text(x: float) -> str:
    """A short decimal for a flag value, 6 significant digits (3e-4 -> 0.0003, 1.5e-5 -> 1.5e-05, 8.0 -> 8)."""
    return format(x, ".6g")


def nodes_block(nodes: int, per_node: int, master_port: int | None = None) -> str:
    """The launch script's node count (NNODES, overridable but checked against the plan) and, for launchers that
    rendezvous themselves, NODE_RANK, MASTER_ADDR and MASTER_PORT defaults."""
    out = f'NNODES="${{NNODES:-{nodes}}}"\n'
    if master_port is not None:
        out += ('NODE_RANK="${NODE_RANK:-0}"\nMASTER_ADDR="${MASTER_ADDR:-localhost}"\n'
                f'MASTER_PORT="${{MASTER_PORT:-{master_port}}}"\n')
    return out + (f'if (( NNODES != {nodes} )); then\n    echo "this plan needs {nodes} node(s) of {per_node} GPUs: '
                  f'set NNODES={nodes}" >&2\n    exit 1\nfi\n')


def required_env_block(mock_data: bool, *, skip: tuple[str, ...] = ()) -> str:
    """Bash lines that stop the script at once when a required variable is unset; with mock data only the
    checkpoint directory stays (optional, defaulted) since nothing is read."""
    if mock_data:
        return ("# --mock-data: synthetic tokens and no tokenizer (a smoke run; the loss means nothing).\n"
                'CHECKPOINT_DIR="${CHECKPOINT_DIR:-./checkpoints}"\n')
    lines = ["# Required: the script stops here when one of these is unset."]
    for name, what in REQUIRED_ENV:
        if name not in skip:
            lines.append(f': "${{{name}:?set {name} to {what}}}"')
    return "\n".join(lines) + "\n"


def nccl_env_block() -> str:
    """The NCCL/network settings, each with why; `${X:-default}` so a site's own setting wins."""
    return (
        "# ---- NCCL / network (a value already set in the environment wins) ----\n"
        "# Warnings only; NCCL_DEBUG=INFO prints the transports and rings NCCL chose (check it uses IB/RoCE).\n"
        'export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"\n'
        "# A failed or timed-out collective aborts the process, so the job ends instead of hanging until the\n"
        "# scheduler's time limit.\n"
        'export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"\n'
        "# Dump the collective trace of every rank on a timeout, to find the rank that stalled.\n"
        'export TORCH_NCCL_DUMP_ON_TIMEOUT="${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}"\n'
        "# Expandable segments cut allocator fragmentation; the predicted peak memory assumes little of it.\n"
        'export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"\n'
        "# Site-specific: set these where NCCL's automatic choice is wrong (multi-homed nodes):\n"
        "#   NCCL_SOCKET_IFNAME=<bootstrap/TCP interface, e.g. eth0>  NCCL_IB_HCA=<InfiniBand HCAs, e.g. mlx5>\n"
    )


def sbatch_script(inp: EmitInput, trainer: str, target: str, launch_file: str, nodes: int, per_node: int,
                  master_port: int) -> str:
    """One Slurm task per node; each runs the launch script with NODE_RANK=$SLURM_NODEID and the first node as
    the rendezvous host. Time, partition and account come from sbatch's own input variables."""
    notes = [
        f"Slurm: sbatch sbatch_{trainer}.sh from the directory holding {launch_file} ({nodes} node(s) x "
        f"{per_node} GPUs).",
        "Time limit, partition and account: sbatch reads SBATCH_TIMELIMIT, SBATCH_PARTITION and SBATCH_ACCOUNT",
        "from the environment (e.g. SBATCH_TIMELIMIT=48:00:00 SBATCH_PARTITION=gpu SBATCH_ACCOUNT=myproj sbatch ...);",
        "the data, tokenizer and checkpoint variables of the launch script must be exported too.",
    ]
    return (
        "#!/usr/bin/env bash\n"
        f"#SBATCH --job-name autotune-{trainer}\n#SBATCH --nodes {nodes}\n#SBATCH --ntasks-per-node 1\n"
        f"#SBATCH --gpus-per-node {per_node}\n#SBATCH --exclusive\n"
        + commented(header_lines(inp, trainer, target)) + "#\n" + commented(notes)
        + "set -euo pipefail\n\n"
        "# The first node is the rendezvous host (sed reads every line: head would end the pipe early and, with\n"
        "# pipefail, a long node list would fail the job with SIGPIPE).\n"
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"\n'
        f'MASTER_PORT="${{MASTER_PORT:-{master_port}}}"\n'
        'export MASTER_ADDR MASTER_PORT NNODES="$SLURM_NNODES"\n'
        f'if (( SLURM_NNODES != {nodes} )); then\n'
        f'    echo "this plan needs {nodes} node(s), the allocation has $SLURM_NNODES" >&2\n    exit 1\nfi\n\n'
        f'srun --nodes {nodes} --ntasks-per-node 1 bash -c \\\n'
        f'    \'NODE_RANK="$SLURM_NODEID" exec bash "$SLURM_SUBMIT_DIR/{launch_file}" "$@"\' bash "$@"\n'
    )
