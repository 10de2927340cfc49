"""Real megatron-core training steps on CPU from the emitted launch script (issue 12): the script runs through a
stand-in torchrun, its pretrain_gpt.py arguments go through the Megatron argument mirror, then megatron-core's
own parallel_state, GPTModel and schedules train a tiny Llama-shaped model for 2 steps (megatron_train.py).

Covered, on 4 processes: 1F1B over pp 2 x dp 2, the interleaved schedule (pp 2 x vpp 2 x dp 2), tp 2 x dp 2 and
tp 2 x pp 2 (no sequence parallelism: it needs Transformer Engine or Apex norms). Not exercised: Transformer Engine, flash attention, bf16 p2p,
NCCL, Megatron's DDP buckets and distributed optimizer (the gradients are averaged by hand), Megatron-LM's
training loop itself (pretrain_gpt.py is not on PyPI).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is installed by `make trainers`")

from autotune.emit import EmitInput  # noqa: E402
from autotune.emit.megatron import emit_megatron  # noqa: E402
from autotune.specs.job import JobSpec  # noqa: E402
from autotune.specs.model import ModelSpec  # noqa: E402
from autotune.specs.plan import Plan  # noqa: E402

from .megatron_validate import run_launch_script  # noqa: E402

WORKER = Path(__file__).resolve().parent / "megatron_train.py"
#: Llama 3's layout at a tiny size: GQA, SwiGLU, RMSNorm, RoPE base 500000, untied; vocabulary 64. RoPE turns
#: half of each head (--rotary-percent 0.5, as GPT-NeoX's rotary_pct does) so that flag trains through GPTModel too.
TINY_LLAMA = ModelSpec(name="tiny-llama", num_layers=4, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                       ffn_hidden_size=64, vocab_size=64, activation="swiglu", norm="rmsnorm", tied_embeddings=False,
                       rope_theta=500000.0, rotary_fraction=0.5)
#: All on 4 processes, trained in one start-up: 1F1B, interleaved, tp (each with data parallelism), tp x pp.
CASES = {
    "pp2-dp2-1f1b": Plan(tp=1, pp=2, dp=2, mbs=1, num_microbatches=4, zero=0, layers_per_stage=(2, 2)),
    "pp2-dp2-interleaved": Plan(tp=1, pp=2, dp=2, mbs=1, num_microbatches=4, schedule="interleaved", vpp=2, zero=0,
                                layers_per_stage=(2, 2)),
    "tp2-dp2": Plan(tp=2, pp=1, dp=2, mbs=2, num_microbatches=2, zero=0, sequence_parallel=False,
                    layers_per_stage=(4,)),
    "tp2-pp2": Plan(tp=2, pp=2, dp=1, mbs=1, num_microbatches=2, zero=0, sequence_parallel=False,
                    layers_per_stage=(2, 2)),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_argv(plan: Plan) -> list[str]:
    """What the emitted launch script passes to pretrain_gpt.py (stand-in torchrun), for the tiny model."""
    inp = EmitInput(plan=plan, model=TINY_LLAMA, job=JobSpec(global_batch=plan.dp * plan.mbs * plan.num_microbatches,
                                                             seq_len=16),
                    gpu="cpu", gpus_per_node=plan.num_gpus, step_time_s=1.0, peak_memory_gib=0.1, mfu=0.1,
                    train_tokens=1e6)
    launch = run_launch_script(dict(emit_megatron(inp).files)["launch_megatron.sh"])
    assert launch.world_size == plan.num_gpus
    return list(launch.argv)


def train(workdir: Path, world: int) -> dict[str, dict]:
    files = []
    for name, plan in CASES.items():
        (workdir / f"{name}.json").write_text(json.dumps(launch_argv(plan)))
        files.append(str(workdir / f"{name}.json"))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TOKENIZER_VOCAB": str(TINY_LLAMA.vocab_size)}
    procs = [subprocess.Popen([sys.executable, str(WORKER), "2", *files], cwd=workdir, env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        outs = [p.communicate(timeout=400)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    results = [json.loads(line[len("RESULT "):]) for o in outs for line in o.splitlines() if line.startswith("RESULT ")]
    return {Path(r["argv"]).stem: r for r in results}


@pytest.mark.slow
def test_megatron_core_trains_from_the_emitted_launch(tmp_path):
    results = train(tmp_path, 4)
    assert sorted(results) == sorted(CASES)
    for name, got in results.items():
        plan = CASES[name]
        assert len(got["losses"]) == 2 and all(0 < x < 10 for x in got["losses"]), name
        assert (got["vpp"], got["microbatches"]) == (plan.vpp, plan.num_microbatches), name
        assert got["schedule"] == {1: "forward_backward_no_pipelining"}.get(plan.pp, (
            "forward_backward_pipelining_with_interleaving" if plan.vpp > 1 else
            "forward_backward_pipelining_without_interleaving")), name
        assert sum(got["layers_last_rank"]) == plan.layers_per_stage[-1], name
