"""Scenarios shared by the emitter tests (megatron, torchtitan, deepspeed) and the golden-file helper.

* `GOLDEN`: hand-built EmitInputs, one per golden scenario (`even`, `uneven_vocab`, `interleaved`,
  `vocab_parallel`, `v_half`); the predicted figures in their headers are fixed numbers, so the golden files do
  not move with the cost model.
* `planner_scenarios()`: EmitInputs for the plans `autotune.search.planner.search` picks on catalog scenarios
  (each search kept small by pins; computed once per test session and cached).
* `check_golden(result, trainer, scenario)`: byte-for-byte comparison with tests/emit/golden/<trainer>/<scenario>/;
  `AUTOTUNE_REGEN_GOLDEN=1 python -m pytest tests/emit` rewrites those directories instead.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from autotune.catalog import load_hardware, load_model
from autotune.emit import EmitInput, EmitResult
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, check_plan

# ---------------------------------------------------------------- golden files

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
WARNINGS_FILE = "_warnings.txt"


def _regen() -> bool:
    return os.environ.get("AUTOTUNE_REGEN_GOLDEN", "") not in ("", "0")


def golden_files(result: EmitResult) -> dict[str, str]:
    """What the golden directory holds for a result: the emitted files plus the warnings file."""
    files = dict(result.files)
    assert WARNINGS_FILE not in files, f"an emitter may not emit a file named {WARNINGS_FILE}"
    files[WARNINGS_FILE] = "".join(f"{w}\n" for w in result.warnings)
    return files


def check_golden(result: EmitResult, trainer: str, scenario: str) -> None:
    """Compare an EmitResult with tests/emit/golden/<trainer>/<scenario>/ byte for byte (missing or extra files
    fail too); with AUTOTUNE_REGEN_GOLDEN=1 rewrite that directory instead."""
    directory = GOLDEN_DIR / trainer / scenario
    files = golden_files(result)
    if _regen():
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.rglob("*"):
            if old.is_file() and str(old.relative_to(directory)) not in files:
                old.unlink()
        for name, content in files.items():
            path = directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode())
        return
    hint = "if the change is intended, regenerate with AUTOTUNE_REGEN_GOLDEN=1 python -m pytest tests/emit"
    assert directory.is_dir(), f"no golden files in {directory}; {hint}"
    on_disk = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    assert on_disk == sorted(files), f"{directory}: golden files {on_disk} != emitted {sorted(files)}; {hint}"
    for name, content in files.items():
        assert content == (directory / name).read_bytes().decode(), f"{directory / name} differs; {hint}"


# ---------------------------------------------------------------- hand-built golden scenarios


def _inp(model: str, gpu: str, job: JobSpec, plan: Plan, *, step: float, mem: float, mfu: float) -> EmitInput:
    m, hw = load_model(model), load_hardware(gpu)
    check_plan(plan, m, job, plan.num_gpus, hw.gpus_per_node)
    return EmitInput(plan=plan, model=m, job=job, gpu=gpu, gpus_per_node=hw.gpus_per_node, step_time_s=step,
                     peak_memory_gib=mem, mfu=mfu)


#: even: llama3-8b on 2 nodes of 8 H100, tp 2 x pp 2 x dp 4, 16+16 layers, ZeRO-1, selective recompute, SP.
EVEN = _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=64, seq_len=8192),
            Plan(tp=2, pp=2, dp=4, mbs=1, num_microbatches=16, recompute="selective", zero=1,
                 sequence_parallel=True, layers_per_stage=(16, 16)),
            step=9.5, mem=61.2, mfu=0.42)

#: uneven_vocab: llama3-8b on 4 nodes, tp 2 x pp 4 x dp 4, layers 7,9,9,7 (embedding and LM head on the
#: ends carry fewer layers), full recompute of 2 layers per stage, ZeRO-1, SP.
UNEVEN_VOCAB = _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=128, seq_len=8192),
                    Plan(tp=2, pp=4, dp=4, mbs=1, num_microbatches=32, recompute="full", recompute_layers=2,
                         zero=1, sequence_parallel=True, vocab="balanced", layers_per_stage=(7, 9, 9, 7)),
                    step=10.25, mem=58.7, mfu=0.445)

#: interleaved: gpt-1.7b (GeLU, LayerNorm, learned positions, biases, dropout, tied) on one node,
#: tp 2 x pp 4 x dp 1, interleaved vpp 2, 6 layers per rank, no recompute, ZeRO-0, fp16.
INTERLEAVED = _inp("gpt-1.7b", "a100-80gb", JobSpec(global_batch=16, seq_len=2048, dtype="fp16"),
                   Plan(tp=2, pp=4, dp=1, mbs=2, num_microbatches=8, schedule="interleaved", vpp=2,
                        layers_per_stage=(6, 6, 6, 6)),
                   step=1.875, mem=21.4, mfu=0.38)

#: vocab_parallel: llama3-8b (untied) on 2 nodes, tp 2 x pp 4 x dp 2, 1F1B, 8 layers per rank, the embedding and
#: LM head split over all 4 pipeline ranks (vocabulary parallelism, Yeung et al. 2024), ZeRO-1, SP.
VOCAB_PARALLEL = _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=64, seq_len=4096),
                      Plan(tp=2, pp=4, dp=2, mbs=1, num_microbatches=32, zero=1, sequence_parallel=True,
                           vocab="parallel", layers_per_stage=(8, 8, 8, 8)),
                      step=4.125, mem=52.3, mfu=0.47)

#: v_half: llama3-8b on one node, pp 4 x dp 2, the V-Half schedule (2 chunks per rank in a V, rank 0 holding
#: the embedding and the LM head, hence its fewer layers), layers 6,8,8,10, ZeRO-1.
V_HALF = _inp("llama3-8b", "h100-sxm", JobSpec(global_batch=32, seq_len=4096),
              Plan(tp=1, pp=4, dp=2, mbs=1, num_microbatches=16, schedule="v-half", vpp=2, zero=1,
                   vocab="balanced", layers_per_stage=(6, 8, 8, 10)),
              step=3.5, mem=48.5, mfu=0.45)

GOLDEN: dict[str, EmitInput] = {"even": EVEN, "uneven_vocab": UNEVEN_VOCAB, "interleaved": INTERLEAVED,
                                "vocab_parallel": VOCAB_PARALLEL, "v_half": V_HALF}

# ---------------------------------------------------------------- plans the planner picks

#: (name, model, gpu, gpus, global batch, seq len, dtype, SearchSpace pins). Pins keep each search fast and
#: steer it to the feature the scenario is meant to cover (noted alongside).
PLANNER_CASES: tuple[tuple[str, str, str, int, int, int, str, dict], ...] = (
    ("llama3-8b-8xh100", "llama3-8b", "h100-sxm", 8, 64, 8192, "bf16", {}),  # pp 1, ZeRO-3
    ("llama3-8b-16xh100-pp4-balanced", "llama3-8b", "h100-sxm", 16, 128, 8192, "bf16",
     {"pp": (4,), "vocab": ("balanced",), "layers_per_stage": (7, 9, 9, 7)}),  # uneven first/last, equal middle
    ("llama3-8b-16xh100-pinned-layout", "llama3-8b", "h100-sxm", 16, 128, 8192, "bf16",
     {"pp": (4,), "cp": (1,), "layers_per_stage": (7, 9, 8, 8)}),  # unequal middle ranks: a layout
    ("llama3-8b-32xh100-interleaved-balanced", "llama3-8b", "h100-sxm", 32, 256, 8192, "bf16",
     {"pp": (4,), "cp": (1,), "schedule": ("interleaved",), "vocab": ("balanced",)}),  # first/last with vpp
    ("llama3-8b-32xh100-interleaved-layout", "llama3-8b", "h100-sxm", 32, 256, 8192, "bf16",
     {"pp": (4,), "cp": (1,), "schedule": ("interleaved",), "vpp": (2,), "layers_per_stage": (6, 10, 8, 8)}),
    ("llama3-8b-8xh100-cp2-32k", "llama3-8b", "h100-sxm", 8, 16, 32768, "bf16", {"cp": (2,)}),
    ("llama3-70b-64xh100-tp8-pp8", "llama3-70b", "h100-sxm", 64, 256, 4096, "bf16",
     {"tp": (8,), "pp": (8,)}),  # interleaved, ZeRO-0, SP
    ("llama3-70b-32xa100-full-recompute", "llama3-70b", "a100-80gb", 32, 128, 4096, "bf16",
     {"tp": (8,), "pp": (4,), "zero": (1,), "recompute": ("full",)}),  # partial full recompute, vpp 5
    ("llama2-13b-16xa100-selective", "llama2-13b", "a100-40gb", 16, 64, 4096, "bf16",
     {"pp": (4,), "recompute": ("selective",)}),
    ("qwen2.5-7b-16xh100-pp2", "qwen2.5-7b", "h100-sxm", 16, 64, 4096, "bf16", {"pp": (2,)}),  # QKV bias
    ("qwen2.5-72b-32xh200-fp8", "qwen2.5-72b", "h200", 32, 128, 4096, "fp8", {"tp": (8,)}),
    ("gemma2-9b-8xh100-tp2", "gemma2-9b", "h100-sxm", 8, 32, 8192, "bf16", {"tp": (2,)}),  # GeGLU, head_dim 256
    ("gpt-1.7b-8xa100-interleaved-fp16", "gpt-1.7b", "a100-80gb", 8, 64, 2048, "fp16",
     {"schedule": ("interleaved",), "pp": (4,)}),  # GeLU, LayerNorm, learned positions, biases
    ("gpt-7.5b-16xa100-pp2-zero0", "gpt-7.5b", "a100-80gb", 16, 64, 2048, "bf16",
     {"pp": (2,), "vocab": ("balanced",), "zero": (0,)}),
    ("gpt-18.4b-32xa100-full", "gpt-18.4b", "a100-80gb", 32, 256, 2048, "bf16",
     {"tp": (4,), "recompute": ("full",)}),
    ("bert-large-4xv100", "bert-large", "v100-32gb", 4, 64, 512, "fp16", {}),  # not causal: a warning
)


@lru_cache(maxsize=None)
def planner_scenarios() -> tuple[tuple[str, EmitInput], ...]:
    """(name, EmitInput) for the best plan of each PLANNER_CASES search (cached for the session)."""
    from autotune.search.planner import search
    from autotune.search.space import SearchSpace

    out = []
    for name, model, gpu, gpus, gbs, seq, dtype, pins in PLANNER_CASES:
        m, hw = load_model(model), load_hardware(gpu)
        job = JobSpec(global_batch=gbs, seq_len=seq, dtype=dtype)  # type: ignore[arg-type]
        best = search(m, hw, job, gpus, SearchSpace(**pins), top_k=0, time_limit_s=60.0).best
        out.append((name, EmitInput(plan=best.plan, model=m, job=job, gpu=gpu, gpus_per_node=hw.gpus_per_node,
                                    step_time_s=best.step_time_s,
                                    peak_memory_gib=best.peak_memory_bytes / 2**30, mfu=best.mfu)))
    return tuple(out)
