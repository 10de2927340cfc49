"""Real torchtitan 0.3.0 training steps on CPU (gloo) from the emitted launch_torchtitan.sh, run unchanged under
bash with a stand-in torchrun on PATH (issue 12). The script's own variables choose the tiny model's config
function (TT_MODULE/TT_CONFIG), DATA_PATH is a local text corpus, TOKENIZER_MODEL a word-level tokenizer built
here, CHECKPOINT_DIR a temporary directory; the step count (2) comes from --train-tokens; the plans are emitted with
--unfused (no torch.compile: inductor on CPU would take minutes). torchtitan's trainer
then runs as it would on GPUs: its config parsing, device mesh, FSDP2 / DDP / TP / pipeline schedules, loss,
optimizer, LR schedule, metrics and the last-step DCP checkpoint (torchtitan_train.py: the stand-in and the CPU
shim, which leaves all of this to torchtitan).

Covered: FSDP2 (ZeRO-3, gradient accumulation, full AC), TP 2 with sequence parallelism x DDP 2 (selective AC),
1F1B over pp 2 x FSDP2 without resharding (ZeRO-1, an uneven split: module_fqns_per_model_part), Interleaved1F1B
over pp 2 x vpp 2 x FSDP2 2 (pipeline_parallel_layers_per_stage), ZBVZeroBubble (v-half), context parallelism 2
(torch's FlexAttention CP: K/V all-gathered, the block mask sharded; FSDP2 over the cp ranks). Not exercised:
NCCL, bf16 compute on GPUs, torch.compile, async TP, Float8, CUDA graphs, FlexAttention's kernels (SDPA with
the same dense mask instead), torchtitan's default spmd_types backend (see torchtitan_train.tiny_llama),
multi-node rendezvous.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is installed by `make trainers`")

from autotune.emit import EmitInput  # noqa: E402
from autotune.emit.torchtitan import emit_torchtitan  # noqa: E402
from autotune.specs.job import JobSpec  # noqa: E402
from autotune.specs.model import ModelSpec  # noqa: E402
from autotune.specs.plan import Plan  # noqa: E402

from . import torchtitan_train as tt  # noqa: E402

#: Llama 3's layout at a tiny size: GQA, SwiGLU, RMSNorm, RoPE base 500000, untied; vocabulary 64.
TINY_LLAMA = ModelSpec(name="tiny-llama", num_layers=4, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                       ffn_hidden_size=64, vocab_size=64, activation="swiglu", norm="rmsnorm", tied_embeddings=False,
                       rope_theta=500000.0)
SEQ_LEN, STEPS = 16, 2
#: torch's FlexAttention context parallelism shards the block mask in 128-token blocks per cp rank
CP_SEQ_LEN = 256
#: One run per emitter branch: (plan, torchtitan's mesh line, its schedule line or None).
CASES = {
    "fsdp-dp2": (Plan(tp=1, pp=1, dp=2, mbs=2, num_microbatches=2, zero=3, recompute="full",
                      layers_per_stage=(4,)), "pp=1, dp_replicate=1, dp_shard=2, cp=1, tp=1", None),
    "tp2-sp-ddp2": (Plan(tp=2, pp=1, dp=2, mbs=2, num_microbatches=1, zero=0, sequence_parallel=True,
                         recompute="selective", layers_per_stage=(4,)),
                    "pp=1, dp_replicate=2, dp_shard=1, cp=1, tp=2", None),
    "pp2-1f1b-zero1-dp2": (Plan(tp=1, pp=2, dp=2, mbs=1, num_microbatches=4, zero=1, layers_per_stage=(3, 1)),
                           "pp=2, dp_replicate=1, dp_shard=2, cp=1, tp=1", "1F1B with 4 microbatches and 2 stages"),
    "pp2-interleaved-fsdp2": (Plan(tp=1, pp=2, dp=2, mbs=1, num_microbatches=4, schedule="interleaved", vpp=2, zero=3,
                                   layers_per_stage=(2, 2)), "pp=2, dp_replicate=1, dp_shard=2, cp=1, tp=1",
                              "Interleaved1F1B with 4 microbatches and 4 stages"),
    "pp2-zbv": (Plan(tp=1, pp=2, dp=1, mbs=1, num_microbatches=4, schedule="v-half", zero=0, layers_per_stage=(2, 2)),
                "pp=2, dp_replicate=1, dp_shard=1, cp=1, tp=1", "ZBVZeroBubble with 4 microbatches and 4 stages"),
    "cp2": (Plan(tp=1, pp=1, dp=1, cp=2, mbs=1, num_microbatches=1, zero=3, layers_per_stage=(4,)),
            "pp=1, dp_replicate=1, dp_shard=1, cp=2, tp=1", None),
}
STEP_LINE = re.compile(r"step:\s+(\d+)\s+\S*loss:\s+(-?[\d.]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def seq_len(plan: Plan) -> int:
    return CP_SEQ_LEN if plan.cp > 1 else SEQ_LEN


def emitted(plan: Plan) -> dict[str, str]:
    gbs = plan.dp * plan.mbs * plan.num_microbatches
    inp = EmitInput(plan=plan, model=TINY_LLAMA, job=JobSpec(global_batch=gbs, seq_len=seq_len(plan),
                                                             fused_kernels=False),
                    gpu="cpu", gpus_per_node=plan.num_gpus, step_time_s=1.0, peak_memory_gib=0.1, mfu=0.1,
                    train_tokens=STEPS * gbs * seq_len(plan))
    return dict(emit_torchtitan(inp).files)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(plan: Plan, workdir: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """The emitted launch script, unchanged, under bash with the stand-in torchrun first on PATH."""
    script = workdir / "launch_torchtitan.sh"
    script.write_text(emitted(plan)["launch_torchtitan.sh"])
    corpus, tokenizer = workdir / "corpus.txt", workdir / "tokenizer"
    tt.write_corpus(corpus)
    assert tt.build_tokenizer(corpus, tokenizer, TINY_LLAMA.vocab_size) <= TINY_LLAMA.vocab_size
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(tt.__file__)}" torchrun "$@"\n')
    (bin_dir / "torchrun").chmod(0o755)
    m = TINY_LLAMA
    shape = {"n_layers": m.num_layers, "n_heads": m.num_heads, "n_kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
             "vocab_size": m.vocab_size, "ffn": m.ffn_hidden_size, "rope_theta": m.rope_theta}
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "DATA_PATH": str(corpus),
           "TOKENIZER_MODEL": str(tokenizer), "CHECKPOINT_DIR": str(workdir / "run"), "TT_MODULE": "torchtitan_train",
           "TT_CONFIG": "tiny_llama", "MASTER_PORT": str(free_port()), "AUTOTUNE_TT_SHAPE": json.dumps(shape),
           "AUTOTUNE_TT_LAUNCH_LOG": str(workdir / "torchrun.json"), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(["bash", str(script)], env=env, cwd=workdir, capture_output=True, text=True, timeout=400)
    launch = json.loads((workdir / "torchrun.json").read_text()) if (workdir / "torchrun.json").exists() else {}
    return proc, launch


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_torchtitan_trains_from_the_emitted_launch(name, tmp_path):
    plan, mesh, schedule = CASES[name]
    proc, launch = run(plan, tmp_path)
    log = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, log[-6000:]
    assert (launch["nnodes"], launch["nproc_per_node"]) == (1, plan.num_gpus)
    assert f"Building device mesh with parallelism: {mesh}, ep=1" in log
    lbs = plan.mbs * plan.num_microbatches if plan.pp > 1 else plan.mbs
    accum = 1 if plan.pp > 1 else plan.num_microbatches
    assert (f"local batch size {lbs}, global batch size {plan.dp * plan.mbs * plan.num_microbatches}, gradient "
            f"accumulation steps {accum}, sequence length {seq_len(plan)}, total steps {STEPS}") in log
    if schedule:
        assert f"Using pipeline schedule {schedule}" in log
    # the loss the last stage reports (other stages print a negative placeholder) starts near ln(vocabulary):
    # random weights predict about uniformly, so a loss scaled by a wrong token count or dp degree shows here
    losses = {(int(s), float(x)) for s, x in STEP_LINE.findall(log) if float(x) >= 0}
    assert sorted({s for s, _ in losses}) == list(range(1, STEPS + 1)), log[-3000:]
    assert all(abs(x - math.log(TINY_LLAMA.vocab_size)) < 0.5 for _, x in losses), losses
    assert (tmp_path / "run" / "checkpoint" / f"step-{STEPS}").is_dir()  # torchtitan's last-step save
