"""Paper 4's comparison: where the vocabulary layers go, as the vocabulary grows.

Yeung et al., "Balancing Pipeline Parallelism with Vocabulary Parallelism" (2024) train a ~4B GPT (32
layers, hidden 3072, 24 heads, FFN 12288) with pp 8 on 8 A100-80GB, micro-batch 1, 128 micro-batches,
sequence 2048 and 4096, vocabularies 32k to 256k, and compare the naive placement (embedding on the first
stage, output layer on the last), a rebalanced layer split, and vocabulary parallelism: 5% to 51% more
throughput, and a much lower peak memory for large vocabularies.

`python -m autotune.reports.vocab` (or `make vocab-report`) prints autotune's prediction for the same grid:
  ends      the even split (4 layers per stage), vocabulary layers on the end stages;
  balanced  the best uneven split with the same placement, found by the planner (CP-SAT) with every other
            dimension pinned;
  parallel  vocabulary parallelism (the embedding and output layer split over the 8 ranks), even split.
Everything else is pinned to the paper's setting: tp 1, dp 1, 1F1B, no recomputation, no ZeRO. Model
details the summary does not give are assumptions: GeLU MLP with biases, LayerNorm, untied embeddings (the
fork requires them), rotary positions, flash attention, bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.catalog import load_hardware
from autotune.costmodel.estimate import CostModel, Estimate
from autotune.search.planner import search
from autotune.search.space import SearchSpace
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan, even_split
from autotune.units import gib
from autotune.reports import run_main

PP, MICROBATCHES = 8, 128
VOCABS = (32_000, 64_000, 128_000, 256_000)
SEQ_LENS = (2048, 4096)
PLACEMENTS = ("ends", "balanced", "parallel")
PAPER_GAIN = (0.05, 0.51)
"""Yeung et al. 2024, abstract: vocabulary parallelism's throughput gain over naive placement."""


def paper4_model(vocab: int) -> ModelSpec:
    return ModelSpec(name=f"paper4-4b-v{vocab // 1000}k", num_layers=32, hidden_size=3072, num_heads=24,
                     num_kv_heads=24, head_dim=128, ffn_hidden_size=12288, vocab_size=vocab, activation="gelu",
                     norm="layernorm", tied_embeddings=False, bias="all", source="Yeung et al. 2024 (assumed details)")


def paper4_job(seq_len: int) -> JobSpec:
    """The paper's runs: the sail-sg fork (Megatron-LM core 0.9) without --cross-entropy-loss-fusion, so the loss
    runs as separate fp32 passes, as in its baseline."""
    return JobSpec(global_batch=MICROBATCHES, seq_len=seq_len, cross_entropy="unfused")


@dataclass(frozen=True, slots=True)
class Row:
    seq_len: int
    vocab: int
    results: dict[str, Estimate]

    def gain(self, placement: str) -> float:
        """Throughput of `placement` over 'ends', minus one."""
        return self.results["ends"].step_time_s / self.results[placement].step_time_s - 1


def placement_estimates(seq_len: int, vocab: int, gpu: str = "a100-80gb") -> Row:
    model, hw, job = paper4_model(vocab), load_hardware(gpu), paper4_job(seq_len)
    cm = CostModel(model, hw, job)
    base = Plan(tp=1, pp=PP, dp=1, mbs=1, num_microbatches=MICROBATCHES, layers_per_stage=even_split(32, PP))
    space = SearchSpace(tp=(1,), pp=(PP,), dp=(1,), cp=(1,), mbs=(1,), schedule=("1f1b",), recompute=("none",),
                        zero=(0,), vocab=("balanced",), sequence_parallel=(False,))
    balanced = search(model, hw, job, PP, space, top_k=0).best
    return Row(seq_len, vocab, {
        "ends": cm.estimate(base),
        "balanced": cm.estimate(balanced.plan),
        "parallel": cm.estimate(Plan(**{**_fields(base), "vocab": "parallel"})),
    })


def _fields(plan: Plan) -> dict:
    return {k: getattr(plan, k) for k in plan.__dataclass_fields__}


def report() -> list[Row]:
    return [placement_estimates(s, v) for s in SEQ_LENS for v in VOCABS]


def format_report(rows: list[Row]) -> str:
    head = (f"{'seq':>5} {'vocab':>6} | " + " | ".join(f"{p:^17}" for p in PLACEMENTS) + " | parallel vs ends\n"
            + f"{'':>5} {'':>6} | " + " | ".join(f"{'MFU':>6} {'peak GiB':>9} " for _ in PLACEMENTS) + " |")
    lines = [head]
    for r in rows:
        cells = " | ".join(f"{100 * r.results[p].mfu:5.1f}% {gib(r.results[p].peak_memory_bytes):9.1f} "
                           for p in PLACEMENTS)
        lines.append(f"{r.seq_len:>5} {r.vocab // 1000:>5}k | {cells} | {100 * r.gain('parallel'):+6.1f}%")
    lo, hi = PAPER_GAIN
    lines.append(f"paper: vocabulary parallelism {100 * lo:.0f}% to {100 * hi:.0f}% faster than naive placement")
    lines.append("balanced layers per stage: " + "; ".join(
        f"{r.seq_len}/{r.vocab // 1000}k {list(r.results['balanced'].plan.layers_per_stage)}" for r in rows))
    return "\n".join(lines)


def main() -> None:
    print(format_report(report()))


if __name__ == "__main__":
    raise SystemExit(run_main(main))
