"""Megatron-LM emitter: a plan as the flags of `pretrain_gpt.py`, in a torchrun launch script and a Slurm script.

Target: Megatron-LM core_r0.16 (megatron-core 0.16). Flag names are Megatron's own (megatron/training/arguments.py
and the megatron-core dataclass fields they are generated from); see ../shared/TRAINERS.md section 1.

Files (always both, also for one node, so the file set never depends on the plan):
* `launch_megatron.sh`: the flags in bash arrays, one flag per line, groups in a fixed order, flags sorted within a
  group; runs `torchrun ... pretrain_gpt.py` on one node. NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT and
  MEGATRON_LM (the checkout holding pretrain_gpt.py) come from the environment; extra arguments are passed on.
* `sbatch_megatron.sh`: one Slurm task per node, each running the launch script with NODE_RANK=$SLURM_NODEID.

A real run (emit/runfiles.py): the model's own hyperparameters (RoPE base and scaling, norm epsilon, init std),
its Hugging Face tokenizer and DATA_PATH/TOKENIZER_MODEL/CHECKPOINT_DIR required from the environment (values
written "${NAME}", the Env class), the schedule from --train-tokens, save/load, logging and the NCCL block;
`mock_data` swaps the data and tokenizer for --mock-data and NullTokenizer.

The pipeline partition becomes nothing (an even split), `--decoder-first/last-pipeline-num-layers` or
`--pipeline-model-parallel-layout` (megatron_partition.py). Data parallelism has no flag: Megatron derives
it from the world size, which the launch script checks.

What mainline Megatron-LM lacks (zero-bubble and V schedules, vocabulary parallelism) is emitted as the closest
config with a warning; megatron_forks.py says how, and how the vocabulary-parallel fork's flag stays switchable.
"""

from __future__ import annotations

import math

from autotune.emit import EmitInput, EmitResult, softcap_warning
from autotune.emit.common import commented, header_lines
from autotune.emit.quote import bash_word
from autotune.emit.megatron_moe import moe_flags
from autotune.emit.megatron_forks import VOCAB_FORK, fork_block, fork_flags, mainline_plan, schedule_warnings
from autotune.emit.megatron_partition import Flag, layout_string, partition_flags
from autotune.emit.runfiles import float_text, nccl_env_block, required_env_block, sbatch_script, schedule
from autotune.specs.job import state_zero_stages
from autotune.specs.plan import Plan, largest_chunk

TARGET = "Megatron-LM pretrain_gpt.py, flags as in megatron-core 0.16 / Megatron-LM core_r0.16"
#: Flags Megatron refuses to see together (validate_args in megatron/training/arguments.py and
#: TransformerConfig.__post_init__); the emitter never produces any of these pairs.
FORBIDDEN_TOGETHER: tuple[tuple[str, str, str], ...] = (
    ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank", "at most one VPP spec"),
    ("--num-layers-per-virtual-pipeline-stage", "--pipeline-model-parallel-layout", "at most one VPP spec"),
    ("--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout", "at most one VPP spec"),
    ("--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers", "VPP by layers vs uneven"),
    ("--num-layers-per-virtual-pipeline-stage", "--decoder-last-pipeline-num-layers", "VPP by layers vs uneven"),
    ("--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers", "layout vs uneven first"),
    ("--pipeline-model-parallel-layout", "--decoder-last-pipeline-num-layers", "layout vs uneven last"),
    ("--pipeline-model-parallel-layout", "--account-for-embedding-in-pipeline-split", "layout vs account-for"),
    ("--pipeline-model-parallel-layout", "--account-for-loss-in-pipeline-split", "layout vs account-for"),
    ("--decoder-first-pipeline-num-layers", "--account-for-embedding-in-pipeline-split", "uneven vs account-for"),
    ("--decoder-first-pipeline-num-layers", "--account-for-loss-in-pipeline-split", "uneven vs account-for"),
    ("--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split", "uneven vs account-for"),
    ("--decoder-last-pipeline-num-layers", "--account-for-loss-in-pipeline-split", "uneven vs account-for"),
    ("--bf16", "--fp16", "one 16-bit format"),
    ("--use-megatron-fsdp", "--use-torch-fsdp2", "one FSDP implementation"),
    ("--use-torch-fsdp2", "--use-distributed-optimizer", "torch FSDP2 shards the optimizer itself"),
)
#: Flags that may only follow --recompute-granularity full (selective recompute takes neither).
FULL_RECOMPUTE_ONLY = ("--recompute-method", "--recompute-num-layers")

#: Argument groups of the launch script, in the order they are written and passed.
GROUPS = ("GPT_ARGS", "DATA_ARGS", "PARALLEL_ARGS", "BATCH_ARGS", "PRECISION_ARGS", "RECOMPUTE_ARGS", "DDP_ARGS",
          "KERNEL_ARGS", "TRAINING_ARGS")
#: Fixed optimizer settings of the Llama recipes (AdamW betas 0.9/0.95, weight decay 0.1, clipping 1.0); the
#: schedule (iterations, warm-up, LR) comes from runfiles.schedule.
OPTIMIZER = (("--adam-beta1", "0.9"), ("--adam-beta2", "0.95"), ("--clip-grad", "1.0"), ("--weight-decay", "0.1"))
MASTER_PORT = 6000
#: Flags newer than the sail-sg/VocabularyParallelism fork's core 0.9 arguments.py: the launch script passes them
#: only when VOCAB_PARALLEL=0 (mainline), as MAINLINE_ARGS.
MAINLINE_ONLY = ("--attention-backend", "--cp-comm-type", "--cross-entropy-fusion-impl")


class Env(str):
    """A flag value that is a bash variable of the launch script (written "${NAME}", expanded at run time)."""


# ---------------------------------------------------------------- flag groups


def _model_flags(inp: EmitInput, warn: list[str]) -> list[Flag]:
    m, job = inp.model, inp.job
    flags: list[Flag] = [
        ("--num-layers", str(m.num_layers)), ("--hidden-size", str(m.hidden_size)),
        ("--num-attention-heads", str(m.num_heads)), ("--ffn-hidden-size", str(m.ffn_hidden_size)),
        ("--seq-length", str(job.seq_len)),
        ("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"),
    ]
    if m.hidden_size % m.num_heads or m.head_dim != m.hidden_size // m.num_heads:
        flags.append(("--kv-channels", str(m.head_dim)))
    if m.num_kv_heads < m.num_heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", str(m.num_kv_heads))]
    if m.activation == "geglu":
        warn.append("geglu: Megatron-LM has no GeGLU flag; emitted --swiglu (same gated shape and cost, SiLU gate)")
    if warning := softcap_warning("megatron", m):
        warn.append(warning)
    if m.gated:
        flags.append(("--swiglu", None))
    if m.position_embedding == "rope":
        flags += [("--position-embedding-type", "rope"), ("--max-position-embeddings", str(job.seq_len))]
    elif m.position_embedding == "alibi":
        warn.append("ALiBi: megatron-core 0.16 has no ALiBi (Megatron-LM offers rope, learned_absolute, mrope and "
                    "none); emitted --position-embedding-type none, the cost predicted, but another model: no "
                    "position signal besides the causal mask")
        flags += [("--position-embedding-type", "none"), ("--max-position-embeddings", str(job.seq_len))]
    else:
        max_pos = m.max_position_embeddings
        if max_pos < job.seq_len:
            warn.append(f"learned position table of {max_pos} rows is shorter than seq_len {job.seq_len}; emitted "
                        f"--max-position-embeddings {job.seq_len}")
            max_pos = job.seq_len
        flags += [("--position-embedding-type", "learned_absolute"), ("--max-position-embeddings", str(max_pos))]
    if not m.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights", None))
    if m.bias != "all":
        flags.append(("--disable-bias-linear", None))
    if m.bias == "qkv":
        flags.append(("--add-qkv-bias", None))
    if m.qk_norm or m.mla:  # with MLA the flag builds the latents' norms (q_a/kv_a_layernorm, megatron-core's
        flags.append(("--qk-layernorm", None))  # gpt_layer_specs: LayerNormLinear up-projections), as DeepSeek has
    if m.mtp_layers:  # trained with their loss at Megatron's default weight (mtp_loss_scaling_factor 0.1)
        flags.append(("--mtp-num-layers", str(m.mtp_layers)))
    if not m.dropout:
        flags += [("--attention-dropout", "0.0"), ("--hidden-dropout", "0.0")]
    flags += [("--norm-epsilon", float_text(m.norm_eps)), ("--init-method-std", float_text(m.init_std))]
    if m.position_embedding == "rope":
        flags.append(("--rotary-base", str(round(m.rope_theta))))
        if m.rotary_fraction < 1:
            flags.append(("--rotary-percent", float_text(m.rotary_fraction)))
        if m.rope_scaling == "llama3":  # Megatron's apply_rope_scaling: Llama 3.1's low 1, high 4, original 8192
            flags += [("--use-rope-scaling", None), ("--rope-scaling-factor", float_text(m.rope_scaling_factor))]
    if m.parallel_block:
        warn.append("parallel block: megatron-core 0.16 builds attention then MLP in sequence (it has no parallel-"
                    "residual option), so this config trains that variant: same parameters and predicted cost")
    if not m.causal:
        warn.append("the model is not causal; pretrain_gpt.py trains a causal decoder (bidirectional models "
                    "use pretrain_bert.py)")
    return flags


def _data_flags(inp: EmitInput, warn: list[str]) -> list[Flag]:
    """The model's Hugging Face tokenizer (TOKENIZER_MODEL, V entries) and DATA_PATH; with --mock-data,
    NullTokenizer with --vocab-size V-1 (V-1 tokens + EOD = V entries). Megatron then pads the vocabulary to
    a multiple of make_vocab_size_divisible_by * tp, chosen here so that V needs no padding."""
    v, tp, pp = inp.model.vocab_size, inp.plan.tp, inp.plan.pp
    divisor = math.gcd(v // tp, 128) if v % tp == 0 else 1
    if inp.plan.vocab == "parallel":  # the vocabulary-parallel fork: make_vocab_size_divisible_by % (tp*pp) == 0
        divisor = math.lcm(divisor, tp * pp)
    padded = math.ceil(v / (divisor * tp)) * divisor * tp
    if v % tp:
        warn.append(f"vocab {v} is not divisible by tp {tp}; Megatron pads it to {padded}")
    elif padded != v:
        warn.append(f"vocab parallel: {VOCAB_FORK} needs --make-vocab-size-divisible-by a multiple of tp*pp = "
                    f"{tp * pp}; with {divisor}, Megatron pads the vocabulary {v} to {padded}")
    if inp.mock_data:
        return [("--mock-data", None), ("--tokenizer-type", "NullTokenizer"), ("--vocab-size", str(v - 1)),
                ("--make-vocab-size-divisible-by", str(divisor))]
    return [("--data-path", Env("DATA_PATH")), ("--split", "99,1,0"), ("--tokenizer-type", "HuggingFaceTokenizer"),
            ("--tokenizer-model", Env("TOKENIZER_MODEL")), ("--make-vocab-size-divisible-by", str(divisor))]


def _training_flags(inp: EmitInput) -> list[Flag]:
    """Iterations from --train-tokens, linear warm-up then cosine decay to a tenth of the peak LR, checkpoints
    about hourly (saved and resumed from CHECKPOINT_DIR), evaluation at each checkpoint, throughput logging."""
    s = schedule(inp, "megatron")
    flags: list[Flag] = [
        *OPTIMIZER, ("--train-iters", str(s.steps)), ("--lr", float_text(s.lr)), ("--min-lr", float_text(s.min_lr)),
        ("--lr-decay-style", "cosine"), ("--lr-warmup-iters", str(s.warmup)), ("--lr-decay-iters", str(s.steps)),
        ("--log-interval", str(s.log_interval)), ("--log-throughput", None),
        ("--eval-interval", str(s.save_interval)), ("--eval-iters", "10"),
    ]
    if not inp.mock_data:
        flags += [("--save", Env("CHECKPOINT_DIR")), ("--load", Env("CHECKPOINT_DIR")),
                  ("--save-interval", str(s.save_interval))]
    return flags


def _parallel_flags(inp: EmitInput, warn: list[str]) -> list[Flag]:
    p = inp.plan
    flags: list[Flag] = [("--tensor-model-parallel-size", str(p.tp)), ("--pipeline-model-parallel-size", str(p.pp))]
    if p.cp > 1:
        flags += [("--context-parallel-size", str(p.cp)), ("--cp-comm-type", "p2p")]
    if p.sequence_parallel and p.tp > 1:
        flags.append(("--sequence-parallel", None))
        if p.tp_overlap:  # Transformer Engine userbuffers; validate_args requires sequence parallelism
            flags.append(("--tp-comm-overlap", None))
    elif p.sequence_parallel:
        warn.append("sequence_parallel needs tp > 1 (Megatron turns it off); not emitted")
    return flags + partition_flags(mainline_plan(p), inp.model.mtp_layers)[0]


def _precision_flags(inp: EmitInput) -> list[Flag]:
    job = inp.job
    flags: list[Flag] = [("--fp16", None)] if job.dtype == "fp16" else [("--bf16", None)]
    if job.dtype == "fp8":
        flags.append(("--fp8-format", "hybrid"))
    # the gradient buffers and their reduction, as costed (JobSpec.grad_reduce): Megatron-LM forces fp32 for bf16
    # parameters but keeps fp16 ones' buffers in fp16 unless asked for fp32
    if job.grad_reduce == "bf16":
        flags.append(("--grad-reduce-in-bf16", None))
    elif job.grad_reduce == "fp32" and job.dtype == "fp16":
        flags.append(("--accumulate-allreduce-grads-in-fp32", None))
    # megatron-core OptimizerConfig's fields (JobSpec.optimizer_states), with the distributed optimizer only: its FSDP
    # keeps fp32 main weights and moments (emit/asrun.py costs the script so and warns)
    if job.optimizer_states != "fp32" and inp.plan.zero in state_zero_stages("megatron", job.optimizer_states):
        flags += [("--use-precision-aware-optimizer", None), ("--exp-avg-dtype", "bf16"),
                  ("--exp-avg-sq-dtype", "bf16")]
        if job.optimizer_states == "bf16-moments":  # the optimizer's fp32-master path follows the fp8 recipe
            flags.append(("--fp8-recipe", "tensorwise"))
        elif job.grad_reduce == "bf16":  # it steps on the bf16 buffer itself, as DeepSeek-V3's recipe sets
            flags.append(("--main-grads-dtype", "bf16"))
    return flags


def _recompute_flags(plan: Plan, mtp_layers: int = 0) -> list[Flag]:
    if plan.recompute == "selective":
        return [("--recompute-granularity", "selective")]
    if plan.recompute == "full":
        if plan.recompute_layers is None and not mtp_layers:  # every layer, each checkpointed on its own
            return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                    ("--recompute-num-layers", "1")]
        # with MTP, every layer is block over the largest chunk: uniform would also checkpoint the MTP modules
        # (multi_token_prediction.py recomputes them under uniform only), which the plan keeps stored, as costed
        return [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                ("--recompute-num-layers", str(plan.recompute_layers or largest_chunk(plan)))]
    return []


def _ddp_flags(plan: Plan, warn: list[str]) -> list[Flag]:
    zero = plan.zero
    if zero >= 2 and plan.pp > 1:
        warn.append(f"zero {zero} with pp {plan.pp}: Megatron FSDP is not used with pipelining; emitted zero 1 "
                    "(--use-distributed-optimizer)")
        zero = 1
    flags: list[Flag] = [("--ddp-bucket-size", str(plan.bucket_size)), ("--overlap-grad-reduce", None)]
    if zero >= 1:  # --overlap-param-gather needs the distributed optimizer (or FSDP) and --overlap-grad-reduce
        flags += [("--use-distributed-optimizer", None), ("--overlap-param-gather", None)]
    if zero >= 2:  # Megatron FSDP: the flags its guide lists as required
        flags += [("--use-megatron-fsdp", None),
                  ("--data-parallel-sharding-strategy", "optim_grads" if zero == 2 else "optim_grads_params"),
                  ("--no-gradient-accumulation-fusion", None), ("--ckpt-format", "fsdp_dtensor")]
    return flags


def _kernel_flags(inp: EmitInput, warn: list[str]) -> list[Flag]:
    m, job = inp.model, inp.job
    # fused = Transformer Engine's cuDNN attention, the kernel costed for Megatron; flash would set NVTE_FLASH_ATTN=1
    # NVTE_FUSED_ATTN=0 (megatron-core 0.16 language_module.py) and run the flash-attn package's kernel instead
    backend = "fused" if job.flash_attention else "unfused"
    if inp.plan.cp > 1 and not job.flash_attention:
        warn.append("context parallelism needs a fused attention kernel; emitted --attention-backend fused")
        backend = "fused"
    flags: list[Flag] = [("--transformer-impl", "transformer_engine"), ("--attention-backend", backend)]
    if not job.fused_kernels:
        flags += [("--no-masked-softmax-fusion", None), ("--no-bias-dropout-fusion", None)]
        if m.position_embedding == "rope":
            flags.append(("--no-rope-fusion", None))
    if m.gated and not job.fused_kernels:
        flags.append(("--no-bias-swiglu-fusion", None))
    if not m.gated and (not job.fused_kernels or m.bias != "all"):  # the fused bias-GeLU needs a bias
        flags.append(("--no-bias-gelu-fusion", None))
    if job.runs_cross_entropy != "unfused":  # the loss kernel costed (ops.cross_entropy_bytes)
        flags.append(("--cross-entropy-loss-fusion", None))
        if job.runs_cross_entropy == "te":
            flags.append(("--cross-entropy-fusion-impl", "te"))
    return flags


def megatron_flags(inp: EmitInput) -> tuple[dict[str, list[Flag]], tuple[str, ...]]:
    """The flags by group (each group sorted by flag name) and the warnings."""
    warn: list[str] = schedule_warnings(inp.plan)
    p = inp.plan
    groups = {
        # MoE/MLA: emit/megatron_moe.py
        "GPT_ARGS": _model_flags(inp, warn) + moe_flags(inp.model, p, inp.job.moe_dispatcher, inp.job),
        "DATA_ARGS": _data_flags(inp, warn),
        "PARALLEL_ARGS": _parallel_flags(inp, warn),
        "BATCH_ARGS": [("--micro-batch-size", str(p.mbs)),
                       ("--global-batch-size", str(p.dp * p.mbs * p.num_microbatches))],
        "PRECISION_ARGS": _precision_flags(inp),
        "RECOMPUTE_ARGS": _recompute_flags(p, inp.model.mtp_layers),
        "DDP_ARGS": _ddp_flags(p, warn),
        "KERNEL_ARGS": _kernel_flags(inp, warn),
        "TRAINING_ARGS": _training_flags(inp),
    }
    groups = {name: sorted(flags) for name, flags in groups.items() if flags}
    names = {f for flags in groups.values() for f, _ in flags}
    for a, b, why in FORBIDDEN_TOGETHER:
        assert not (a in names and b in names), f"emitted {a} with {b} ({why})"
    return groups, tuple(warn)


def script_groups(inp: EmitInput) -> dict[str, list[Flag]]:
    """The launch script's arrays: the flag groups, with the flags the vocabulary-parallel fork lacks moved to
    MAINLINE_ARGS when the plan needs the fork (the script passes that array only with VOCAB_PARALLEL=0)."""
    groups, _ = megatron_flags(inp)
    if not fork_flags(inp.plan):
        return groups
    mainline = [f for group in groups.values() for f in group if f[0] in MAINLINE_ONLY]
    out = {name: [f for f in flags if f[0] not in MAINLINE_ONLY] for name, flags in groups.items()}
    return {name: flags for name, flags in out.items() if flags} | {"MAINLINE_ARGS": sorted(mainline)}


def megatron_argv(inp: EmitInput, *, fork: bool = True, env: dict[str, str] | None = None) -> list[str]:
    """The pretrain_gpt.py arguments of the launch script, in order; `fork=False`: as run on mainline Megatron-LM
    (VOCAB_PARALLEL=0, without the vocabulary-parallel fork's flags, with MAINLINE_ARGS). `env` gives the values of
    the script's variables (DATA_PATH, ...); without it they stay "$NAME"."""
    groups = script_groups(inp)
    mainline = groups.pop("MAINLINE_ARGS", [])
    flags = [f for group in groups.values() for f in group] + (fork_flags(inp.plan) if fork else mainline)
    env = env or {}
    def word(v: str) -> str:
        return env.get(v, f"${v}") if isinstance(v, Env) else v
    return [x for flag, value in flags for x in ((flag,) if value is None else (flag, word(value)))]


# ---------------------------------------------------------------- files


def node_layout(num_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs used per node): torchrun starts the same number of processes on every node, so a plan
    spanning nodes uses the largest divisor of its GPU count that fits in a node."""
    if num_gpus <= gpus_per_node:
        return 1, num_gpus
    per_node = max(d for d in range(1, gpus_per_node + 1) if num_gpus % d == 0)
    return num_gpus // per_node, per_node


def _value(value: str) -> str:
    return f'"${{{value}}}"' if isinstance(value, Env) else bash_word(value)


def _array(name: str, flags: list[Flag]) -> str:
    lines = [f"    {bash_word(flag)}" + ("" if value is None else f" {_value(value)}") for flag, value in flags]
    return f"{name}=(\n" + "\n".join(lines) + "\n)\n"


def _launch_script(inp: EmitInput, groups: dict[str, list[Flag]], nodes: int, per_node: int) -> str:
    p, run = inp.plan, mainline_plan(inp.plan)
    fsdp = any(f == "--use-megatron-fsdp" for f, _ in groups.get("DDP_ARGS", []))
    notes = [
        "Megatron-LM launch script: run it from a Megatron-LM checkout (core_r0.16) or set MEGATRON_LM.",
        "Run: bash launch_megatron.sh" if nodes == 1 else
        f"Run it on each of the {nodes} nodes with NODE_RANK (0..{nodes - 1}) and MASTER_ADDR set "
        "(sbatch_megatron.sh does).",
        "Extra arguments are passed on to pretrain_gpt.py (a later flag overrides an earlier one)."
        if inp.mock_data else
        "Needs DATA_PATH, TOKENIZER_MODEL and CHECKPOINT_DIR (it stops when one is unset); extra arguments are "
        "passed on to pretrain_gpt.py (a later flag overrides an earlier one).",
        f"pipeline: {partition_flags(run)[1]}; transformer layers per rank {','.join(map(str, p.layers_per_stage))}"
        + (f", per virtual stage {layout_string(run, inp.model.mtp_layers)}" if run.vpp > 1 else "")
        + (f"; the {inp.model.mtp_layers} MTP module(s) run on the last stage" if inp.model.mtp_layers else ""),
        f"data parallelism {p.dp} is derived by Megatron from the world size {p.num_gpus} / (tp*pp*cp).",
    ]
    if run.schedule != p.schedule:
        notes.append(f"schedule: the plan's {p.schedule} runs as 1F1B here (mainline Megatron-LM has no zero-bubble "
                     "or V schedule; see autotune's warnings).")
    env = ("# Megatron FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1: leave it unset.\n" if fsdp else
           "# One CUDA connection keeps TP/SP communication and compute kernels in issue order.\n"
           "export CUDA_DEVICE_MAX_CONNECTIONS=1\n")
    fork = fork_block(inp.plan, dict(groups["DATA_ARGS"])["--make-vocab-size-divisible-by"],
                      mainline="MAINLINE_ARGS" in groups)
    passed = " \\\n".join(f'    "${{{name}[@]}}"' for name in [*groups, *(["FORK_ARGS"] if fork else [])])
    return (
        "#!/usr/bin/env bash\n" + commented(header_lines(inp, "megatron", TARGET)) + "#\n" + commented(notes)
        + "set -euo pipefail\n\n"
        f'NNODES="${{NNODES:-{nodes}}}"\nNODE_RANK="${{NODE_RANK:-0}}"\nMASTER_ADDR="${{MASTER_ADDR:-localhost}}"\n'
        f'MASTER_PORT="${{MASTER_PORT:-{MASTER_PORT}}}"\nMEGATRON_LM="${{MEGATRON_LM:-.}}"\n'
        f"GPUS_PER_NODE={per_node}\nWORLD_SIZE={p.num_gpus}\n"
        'if (( NNODES * GPUS_PER_NODE != WORLD_SIZE )); then\n'
        '    echo "this plan needs $WORLD_SIZE GPUs ($GPUS_PER_NODE per node): set NNODES=$((WORLD_SIZE / '
        'GPUS_PER_NODE))" >&2\n    exit 1\nfi\n' + required_env_block(inp.mock_data) + "\n" + nccl_env_block()
        + env + "\n"
        + "\n".join(_array(name, flags) for name, flags in groups.items()) + "\n" + fork +
        'torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "$NODE_RANK" \\\n'
        '    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\\n'
        '    "$MEGATRON_LM/pretrain_gpt.py" \\\n' + passed + ' \\\n    "$@"\n'
    )


def _sbatch_script(inp: EmitInput, nodes: int, per_node: int) -> str:
    return sbatch_script(inp, "megatron", TARGET, "launch_megatron.sh", nodes, per_node, MASTER_PORT)


def emit_megatron(inp: EmitInput) -> EmitResult:
    """launch_megatron.sh and sbatch_megatron.sh for the plan (see the module docstring)."""
    _, warnings = megatron_flags(inp)
    groups = script_groups(inp)
    nodes, per_node = node_layout(inp.plan.num_gpus, inp.gpus_per_node)
    if nodes > 1 and per_node < inp.gpus_per_node:
        warnings += (f"{inp.plan.num_gpus} GPUs do not fill nodes of {inp.gpus_per_node}: the scripts use "
                     f"{per_node} GPUs on each of {nodes} nodes",)
    files = (("launch_megatron.sh", _launch_script(inp, groups, nodes, per_node)),
             ("sbatch_megatron.sh", _sbatch_script(inp, nodes, per_node)))
    return EmitResult(files=files, warnings=warnings)
