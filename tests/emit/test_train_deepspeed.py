"""Real DeepSpeed training steps on CPU from the emitted files, unchanged (issue 12): `deepspeed.initialize` with
ds_config.json (its optimizer and WarmupCosineLR scheduler included), a PipelineModule built from ds_pipeline.json
when pp > 1, and `train_batch()`; gloo, 2-4 processes, the tiny-gpt layer count, 3 steps (deepspeed_train.py).

Covered: pp 2 x dp 2 with ZeRO-1 and layer checkpointing, pp 4 with ZeRO-0, pp 1 with ZeRO-1/2/3 (ZeRO-2 with the
activation_checkpointing section), dp 2 x cp 2 as DeepSpeed-Ulysses (DeepSpeed's own (dp, sp) mesh from the
config; the stand-in layers mix no tokens, so each rank's slice of the sequence is exact), and the refusal of
pp > 1 with cp > 1. What this does not exercise: NCCL, GPUs,
FusedAdam (the config asks for torch's AdamW), tensor parallelism and Ulysses (they live in the model code's mpu).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed is installed by `make trainers`")

from autotune.catalog import load_model  # noqa: E402
from autotune.emit import EmitInput  # noqa: E402
from autotune.emit.deepspeed import DeepSpeedPlanError, emit_deepspeed  # noqa: E402
from autotune.emit.runfiles import schedule  # noqa: E402
from autotune.specs.job import JobSpec  # noqa: E402
from autotune.specs.plan import Plan  # noqa: E402

WORKER = Path(__file__).resolve().parent / "deepspeed_train.py"
STEPS = 3


def tiny_input(plan: Plan, *, train_tokens: float) -> EmitInput:
    job = JobSpec(global_batch=plan.dp * plan.mbs * plan.num_microbatches, seq_len=16)
    return EmitInput(plan=plan, model=load_model("tiny-gpt"), job=job, gpu="cpu", gpus_per_node=8, step_time_s=1.0,
                     peak_memory_gib=0.1, mfu=0.1, train_tokens=train_tokens)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(inputs: dict[str, EmitInput], workdir: Path, world: int) -> dict[str, dict]:
    """Write each input's emitted files to workdir/NAME and train them all in one run of `world` processes of
    deepspeed_train.py; rank 0's RESULT per name."""
    for name, inp in inputs.items():
        assert inp.plan.num_gpus == world
        (workdir / name).mkdir()
        for file, content in emit_deepspeed(inp).files:
            (workdir / name / file).write_text(content)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    # without a pipeline first: a pipeline engine leaves process-global state behind (deepspeed.utils.groups)
    order = sorted(inputs, key=lambda name: (inputs[name].plan.pp > 1, name))
    argv = [sys.executable, str(WORKER), str(STEPS), *(str(workdir / name) for name in order)]
    procs = [subprocess.Popen(argv, cwd=workdir, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        outs = [proc.communicate(timeout=400)[0] for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outs = [proc.communicate()[0] for proc in procs]
        pytest.fail("DeepSpeed ranks still running after 400 s:\n" + "\n".join(o[-3000:] for o in outs))
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    results = [json.loads(line[len("RESULT "):]) for line in outs[0].splitlines() if line.startswith("RESULT ")]
    return {Path(r["dir"]).name: r for r in results}


#: Every case on 4 processes (one start-up): pp x dp, pipeline ZeRO-0/1, ZeRO-1/2/3 without a pipeline,
#: layer checkpointing with and without a pipeline.
CASES = {
    "pp2-dp2-zero1-checkpointed": Plan(tp=1, pp=2, dp=2, mbs=1, num_microbatches=4, zero=1, recompute="full",
                                       layers_per_stage=(2, 2)),
    "pp4-zero0": Plan(tp=1, pp=4, dp=1, mbs=2, num_microbatches=4, zero=0, layers_per_stage=(1, 1, 1, 1)),
    "dp4-zero1": Plan(tp=1, pp=1, dp=4, mbs=2, num_microbatches=2, zero=1, layers_per_stage=(4,)),
    "dp4-zero2-checkpointed": Plan(tp=1, pp=1, dp=4, mbs=1, num_microbatches=2, zero=2, recompute="full",
                                   layers_per_stage=(4,)),
    "dp4-zero3": Plan(tp=1, pp=1, dp=4, mbs=1, num_microbatches=1, zero=3, layers_per_stage=(4,)),
    "dp2-cp2-zero1": Plan(tp=1, pp=1, dp=2, cp=2, mbs=1, num_microbatches=2, zero=1, layers_per_stage=(4,)),
}
PARTS = {"pp2-dp2-zero1-checkpointed": [0, 3, 6], "pp4-zero0": [0, 2, 3, 4, 6]}


@pytest.mark.slow
def test_deepspeed_trains_from_the_emitted_files(tmp_path):
    # each schedule: 20 steps with a 2-step warm-up, so the 3 steps run see the learning rate rise
    inputs = {name: tiny_input(p, train_tokens=20 * p.dp * p.mbs * p.num_microbatches * 16)
              for name, p in CASES.items()}
    results = train(inputs, tmp_path, 4)
    assert sorted(results) == sorted(CASES)
    for name, got in results.items():
        plan, s = CASES[name], schedule(inputs[name])
        assert (s.steps, s.warmup) == (20, 2)
        assert len(got["losses"]) == STEPS and all(0 < x < 10 for x in got["losses"]), name
        assert (got["zero"], got["dp"], got["gas"], got["sp"]) == (plan.zero, plan.dp, plan.num_microbatches,
                                                                  plan.cp), name
        assert got["train_batch_size"] == inputs[name].job.global_batch and got["bf16"], name
        assert got["scheduler"] == "WarmupCosineLR", name
        assert got["lrs"][0] < got["lrs"][1] < got["lrs"][2] <= s.lr and got["lrs"][2] > 0.9 * s.lr, name
        # DeepSpeed's own partition (layer-spec boundaries): the embedding with the first stage's layers, the
        # head with the last's
        assert got["parts"] == PARTS.get(name, []), name


def test_pipeline_with_context_parallelism_is_refused_up_front():
    plan = Plan(tp=1, pp=2, dp=1, cp=2, mbs=1, num_microbatches=2, layers_per_stage=(2, 2))
    with pytest.raises(DeepSpeedPlanError, match="cp 2 with pp 2"):
        emit_deepspeed(tiny_input(plan, train_tokens=1e6))
