"""Launch files a team can submit as they are (issue 12): model hyperparameters, required paths, the schedule from
--train-tokens, the NCCL block, and a Slurm script for every trainer run through stand-in srun/scontrol/torchrun."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.catalog import load_model
from autotune.emit import TRAINERS, EmitInput, emit
from autotune.emit.colossalai import emit_colossalai
from autotune.emit.megatron import emit_megatron, megatron_argv
from autotune.emit.runfiles import REQUIRED_ENV, launch_shape, peak_lr, schedule
from autotune.emit.torchtitan import CONFIG_MODULE, emit_torchtitan
from autotune.search.scaling import DEFAULT_TRAIN_TOKENS
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan

from .megatron_validate import RUN_ENV, MegatronArgsError, run_launch_script, validate_launch
from .scenarios import GOLDEN

LLAMA3_8B = GOLDEN["even"]  # llama3-8b, tp 2 x pp 2 x dp 4 on 2 nodes of 8 H100


def _script(inp: EmitInput) -> str:
    return dict(emit_megatron(inp).files)["launch_megatron.sh"]


def _value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------- schedule


def test_schedule_from_train_tokens_by_hand():
    """1e12 tokens / (64 x 8192 tokens a step) = 1907348.6 -> 1907349 steps; warm-up 2000 (Llama recipes);
    8B -> 3e-4 (Llama 3 paper); a checkpoint every round(3600 s / 9.5 s) = 379 steps."""
    assert EmitInput.__dataclass_fields__["train_tokens"].default == DEFAULT_TRAIN_TOKENS
    s = schedule(LLAMA3_8B)
    assert (s.steps, s.warmup, s.lr, s.min_lr, s.save_interval) == (1907349, 2000, 3e-4, 3e-5, 379)
    short = schedule(replace(LLAMA3_8B, train_tokens=64 * 8192 * 50))
    assert (short.steps, short.warmup) == (50, 5)  # warm-up at most a tenth of the run
    assert [peak_lr(n) for n in (8.0e9, 70.6e9, 405.9e9)] == [3e-4, 1.5e-4, 8e-5]


def test_the_checkpoint_interval_follows_the_step_time_of_what_the_trainer_runs():
    """DeepSpeed runs the plan's selective recompute as full recompute: the header re-estimates that step, and the
    checkpoint interval (about an hour) must come from the same step, not the planned one (an hour's worth of
    planned steps took 2 h of what it runs here). A trainer that runs the plan as planned keeps the planned step."""
    inp = replace(LLAMA3_8B, reestimate=lambda plan, job, model=None: (2 * LLAMA3_8B.step_time_s, 30.0, 0.2))
    assert inp.plan.recompute == "selective" and inp.plan.pp == 2
    planned, as_run = round(3600 / inp.step_time_s), round(3600 / (2 * inp.step_time_s))
    files = dict(emit("deepspeed", inp).files)
    assert f"predicted: step {2 * inp.step_time_s:.3f} s" in files["ds_config.json"]
    assert json.loads(files["ds_pipeline.json"])["run"]["save_interval"] == as_run != planned
    assert re.search(rf"--save-interval {planned}\b", dict(emit("megatron", inp).files)["launch_megatron.sh"])
    assert schedule(inp).save_interval == schedule(inp, "megatron").save_interval == planned  # runs as planned
    assert schedule(inp, "deepspeed").save_interval == as_run


# ---------------------------------------------------------------- Megatron: a real run for llama3-8b


def test_llama3_8b_launch_has_every_model_flag_and_passes_validation():
    script = _script(LLAMA3_8B)
    launch, v = validate_launch(script, tokenizer_vocab=128256)
    argv, a, c = launch.argv, v.args, v.config
    assert _value(argv, "--rotary-base") == "500000" and a.rotary_base == 500000  # Megatron's default: 10000
    assert _value(argv, "--norm-epsilon") == "1e-05" and c.layernorm_epsilon == 1e-5
    assert "--swiglu" in argv and c.gated_linear_unit
    assert "--group-query-attention" in argv and c.num_query_groups == 8
    assert "--untie-embeddings-and-output-weights" in argv
    assert _value(argv, "--init-method-std") == "0.02" and c.init_method_std == 0.02
    assert _value(argv, "--normalization") == "RMSNorm" and "--disable-bias-linear" in argv
    assert v.padded_vocab == 128256  # 128256 / (128 x tp 2) has no remainder: no padding rows
    assert "--use-rope-scaling" not in argv  # Llama 3 (not 3.1) has no RoPE scaling
    assert (_value(argv, "--tokenizer-type"), _value(argv, "--tokenizer-model")) == (
        "HuggingFaceTokenizer", RUN_ENV["TOKENIZER_MODEL"])
    assert _value(argv, "--data-path") == RUN_ENV["DATA_PATH"] and "--mock-data" not in argv
    assert _value(argv, "--save") == _value(argv, "--load") == RUN_ENV["CHECKPOINT_DIR"]
    assert argv == tuple(megatron_argv(LLAMA3_8B, env=RUN_ENV))
    # megatron-core's own LR scheduler on the emitted flags: 0 -> peak over the warm-up, cosine to min_lr
    s, gbs, sched = schedule(LLAMA3_8B), a.global_batch_size, v.scheduler
    sched.num_steps = s.warmup * gbs
    assert sched.get_lr({}) == pytest.approx(3e-4)
    sched.num_steps = s.steps * gbs
    assert sched.get_lr({}) == pytest.approx(3e-5)


@pytest.mark.parametrize("unset", ["DATA_PATH", "TOKENIZER_MODEL", "CHECKPOINT_DIR"])
def test_launch_refuses_to_start_without_data_tokenizer_or_checkpoints(unset):
    with pytest.raises(MegatronArgsError, match=f"{unset}: set {unset} to ") as err:
        run_launch_script(_script(LLAMA3_8B), env={unset: None})
    assert "launch script failed (1)" in str(err.value)  # bash's :? exits before torchrun runs


def test_llama31_gets_rope_scaling():
    inp = replace(LLAMA3_8B, model=load_model("llama3.1-8b"))
    launch, v = validate_launch(_script(inp), tokenizer_vocab=128256)
    assert "--use-rope-scaling" in launch.argv and _value(launch.argv, "--rope-scaling-factor") == "8"


def test_mock_data_is_an_explicit_opt_in():
    inp = replace(LLAMA3_8B, mock_data=True)
    launch, v = validate_launch(_script(inp), env={name: None for name, _ in REQUIRED_ENV})
    assert "--mock-data" in launch.argv and _value(launch.argv, "--tokenizer-type") == "NullTokenizer"
    assert "--save" not in launch.argv and v.padded_vocab == 128256


def test_nccl_block_explains_every_setting():
    script = _script(LLAMA3_8B)
    block = script[script.index("# ---- NCCL / network"):script.index("GPT_ARGS=(")]
    exports = [line for line in block.splitlines() if line.startswith("export ")]
    assert exports and all(block.splitlines()[block.splitlines().index(e) - 1].startswith("#") for e in exports)
    assert 'NCCL_DEBUG="${NCCL_DEBUG:-WARN}"' in block  # a site's own value wins


# ---------------------------------------------------------------- Slurm scripts, every trainer

_FAKES = {
    "scontrol": '#!/usr/bin/env bash\n[[ "$1 $2" == "show hostnames" ]] || exit 7\n'
                'for ((i = 0; i < SLURM_NNODES; i++)); do echo "node$i"; done\n',
    # one task per node, as the allocation would run it: SLURM_NODEID 0..nodes-1
    "srun": '#!/usr/bin/env bash\nnodes=\nwhile [[ "$1" == --* ]]; do\n  case "$1" in\n'
            '    --nodes) nodes="$2"; shift 2 ;;\n    --ntasks-per-node) [[ "$2" == 1 ]] || exit 9; shift 2 ;;\n'
            '    *) exit 8 ;;\n  esac\ndone\necho "$nodes" > "$LOG_DIR/srun.nodes"\n'
            'for ((i = 0; i < nodes; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" || exit $?; done\n',
    "torchrun": '#!/usr/bin/env bash\nn=$(ls "$LOG_DIR" | grep -c "^torchrun\\.")\n'
                'printf "%s\\0" "$@" > "$LOG_DIR/torchrun.$n"\n',
}
_SBATCH = {"megatron": "sbatch_megatron.sh", "torchtitan": "sbatch_torchtitan.sh", "deepspeed": "sbatch_deepspeed.sh",
           "colossalai": "sbatch_colossalai.sh"}


def run_sbatch(result_files: dict[str, str], sbatch: str, nodes: int, tmp_path: Path) -> tuple[list[list[str]], str]:
    """Run the Slurm script as an allocation of `nodes` nodes would; each torchrun's argv and srun's node count."""
    work, bin_dir, logs = tmp_path / "job", tmp_path / "bin", tmp_path / "logs"
    for d in (work, bin_dir, logs):
        d.mkdir()
    for name, content in result_files.items():
        (work / name).write_text(content)
    for name, content in _FAKES.items():
        (bin_dir / name).write_text(content)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG_DIR": str(logs), "SLURM_NNODES": str(nodes),
           "SLURM_JOB_NODELIST": f"node[0-{nodes - 1}]", "SLURM_SUBMIT_DIR": str(work), "TRAIN_SCRIPT": "train.py",
           "TT_CONFIG": "user_config", **RUN_ENV}
    proc = subprocess.run(["bash", str(work / sbatch)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    calls = sorted(logs.glob("torchrun.*"), key=lambda p: int(p.suffix[1:]))
    return [p.read_text().split("\0")[:-1] for p in calls], (logs / "srun.nodes").read_text().strip()


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("scenario", ["even", "interleaved"])
@pytest.mark.parametrize("trainer", TRAINERS)
def test_slurm_script_starts_one_torchrun_per_node_with_the_plan_s_processes(trainer, scenario, tmp_path):
    inp = GOLDEN[scenario]
    if trainer == "deepspeed" and inp.plan.pp > 1 and inp.plan.zero >= 2:
        pytest.skip("refused by the DeepSpeed emitter")
    files = dict(emit(trainer, inp).files)
    sbatch = _SBATCH[trainer]
    for name, content in files.items():  # every shell file parses
        if name.endswith(".sh"):
            assert subprocess.run(["bash", "-n"], input=content, text=True, capture_output=True).returncode == 0, name
    nodes, per_node = launch_shape(inp.plan.num_gpus, inp.gpus_per_node)
    assert f"#SBATCH --nodes {nodes}\n" in files[sbatch] and f"#SBATCH --gpus-per-node {per_node}\n" in files[sbatch]
    calls, srun_nodes = run_sbatch(files, sbatch, nodes, tmp_path)
    assert srun_nodes == str(nodes) and len(calls) == nodes
    for rank, argv in enumerate(calls):
        assert (int(_arg(argv, "--nnodes")), int(_arg(argv, "--nproc-per-node"))) == (nodes, per_node)
        assert int(_arg(argv, "--node-rank")) == rank
        assert nodes * per_node == inp.plan.num_gpus
        host = _arg(argv, "--rdzv-endpoint").split(":")[0] if trainer == "torchtitan" else _arg(argv, "--master-addr")
        assert host == "node0"


def test_slurm_script_refuses_a_wrong_allocation(tmp_path):
    files = dict(emit("megatron", GOLDEN["even"]).files)
    with pytest.raises(AssertionError, match="this plan needs 2 node"):
        run_sbatch(files, "sbatch_megatron.sh", 3, tmp_path)


# ---------------------------------------------------------------- torchtitan: llama3-405b in bf16


def test_torchtitan_405b_does_not_inherit_float8_compile_or_async_tp(tmp_path):
    """torchtitan's llama3_405b config function turns on Float8 linears, compile and async TP (and needs torchao
    to load at all); the emitted config function trains the 405B model in bf16 and the flags set the rest."""
    pytest.importorskip("torchtitan")
    from torchtitan.config.manager import ConfigManager
    from torchtitan.models.llama3 import model_registry

    plan = Plan(tp=8, pp=2, dp=1, mbs=1, num_microbatches=8, layers_per_stage=(63, 63), sequence_parallel=True)
    inp = EmitInput(plan=plan, model=load_model("llama3-405b"), job=JobSpec(global_batch=8, seq_len=8192),
                    gpu="a100-80gb", gpus_per_node=8, step_time_s=10.0, peak_memory_gib=70.0, mfu=0.4)
    files = dict(emit_torchtitan(inp).files)
    assert f"{CONFIG_MODULE}.py" in files and "llama3_405b_bf16" in files["launch_torchtitan.sh"]
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    overrides = [t for line in files["torchtitan_overrides.txt"].splitlines() for t in line.split()]
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop(CONFIG_MODULE, None)  # another test's config module of the same name may be imported already
    try:
        cfg = ConfigManager().parse_args(["--module", CONFIG_MODULE, "--config", "llama3_405b_bf16", *overrides])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(CONFIG_MODULE, None)
    model = cfg.model_spec.model
    assert cfg.model_spec.flavor == "405B" and "float8" not in repr(model).lower()  # no Float8 converter
    def shape(m) -> str:  # the repr without object addresses
        return re.sub(r" at 0x[0-9a-f]+", "", repr(m))
    assert shape(model.layers) == shape(model_registry("405B").model.layers)
    assert cfg.compile.enable == inp.job.fused_kernels and not cfg.compile.enable_async_tensor_parallel
    assert cfg.optimizer.param_groups[0].optimizer_kwargs["lr"] == 8e-5
    assert dataclasses.is_dataclass(cfg)


# ---------------------------------------------------------------- Colossal-AI


def test_colossalai_bf16_is_not_written_as_fp16_amp():
    inp = replace(LLAMA3_8B, plan=replace(LLAMA3_8B.plan, tp_mode="1d"))
    result = emit_colossalai(inp)
    config = dict(result.files)["colossalai_config.py"]
    assert "AMP_TYPE.TORCH" not in config.split("import", 1)[1].split("\n", 1)[1] and "DTYPE = 'bfloat16'" in config
    assert any(w.startswith("dtype bf16: Colossal-AI's legacy AMP is fp16 only") for w in result.warnings)
    fp16 = emit_colossalai(replace(inp, job=replace(inp.job, dtype="fp16")))
    assert "fp16 = dict(mode=AMP_TYPE.TORCH)" in dict(fp16.files)["colossalai_config.py"]


def test_colossalai_warns_when_it_drops_zero1_with_a_pipeline():
    result = emit_colossalai(LLAMA3_8B)  # zero 1, pp 2
    assert "zero = dict(" not in dict(result.files)["colossalai_config.py"]
    assert any(w.startswith("ZeRO-1 with pp 2: Colossal-AI's legacy zero config") for w in result.warnings)
