"""Paper 2's comparison: 1-D vs 2-D vs 3-D tensor parallelism of one large Transformer on 64 V100-32GB.

Bian et al. (2021, arXiv 2105.14450) report 3-D 2.32x faster than 1-D and 1.57x faster than 2-D on 64 V100s.
`python -m autotune.reports.tpmodes` prints autotune's prediction beside those numbers.

The exact model of the paper's 64-GPU run is not restated here: the shape below is an assumption, chosen as
a Transformer layer that all three modes can split (h and heads divisible by 64 for 1-D, micro-batch divisible
by q^2 = 16 for 3-D), of the size the paper targets (h = 8192, 64 heads, FFN 4h, sequence 512, fp16, no
flash attention, which did not exist in 2021), micro-batch 16 sequences: the smallest that 3-D can split
(q^2 = 16) and the largest power of two at which the 1-D baseline's 24 layers of activations fit in 32 GB
without recomputation. The prediction is sensitive to it (weights move per micro-batch in 2-D and 3-D, so
the token/weight ratio sets who wins); `main` prints the sweep. Only per-layer time matters: every layer is identical and no
data or pipeline parallelism is used (tp = 64 is the whole machine).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.catalog import load_hardware
from autotune.costmodel.layer import layer_cost
from autotune.costmodel.tpmodes import layer_tp_comm_s, layer_tp_memory, tp_mode_degrees
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.reports import run_main

PAPER_SPEEDUP = {"1d": 2.32, "2d": 1.57}
"""Bian et al. 2021, abstract: 3-D over 1-D and over 2-D on 64 V100 GPUs."""


@dataclass(frozen=True, slots=True)
class ModeTime:
    """One layer, one micro-batch, one device, under one tensor-parallel mode."""

    mode: str
    tp: int
    compute_s: float
    comm_s: float
    params: int
    act_bytes: int

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


def paper2_model() -> ModelSpec:
    """The assumed large Transformer layer (see the module docstring)."""
    return ModelSpec(name="paper2-assumed", num_layers=24, hidden_size=8192, num_heads=64, num_kv_heads=64,
                     head_dim=128, ffn_hidden_size=4 * 8192, vocab_size=51200, activation="gelu",
                     norm="layernorm", tied_embeddings=True, bias="all", dropout=True, causal=True,
                     position_embedding="learned", max_position_embeddings=512, source="assumed, Bian et al. 2021")


def paper2_job() -> JobSpec:
    return JobSpec(global_batch=64, seq_len=512, dtype="fp16", flash_attention=False, fused_kernels=True)


def mode_layer_time(mode: str, model: ModelSpec, hw: HardwareSpec, job: JobSpec, *, tp: int, mbs: int) -> ModeTime:
    """Compute from autotune's roofline on the per-device shapes, plus the mode's collectives (not overlapped).

    A 2-D / 2.5-D / 3-D device runs the layer on mbs/split sequences with heads and hidden split by q
    (layer_cost with tp=q and sequence parallelism, so norms see 1/q of those tokens): 1/p of every op's FLOPs.
    """
    grid = tp_mode_degrees(mode, tp)
    if grid.mode == "1d":
        lc = layer_cost(model, hw, job, tp=tp, cp=1, mbs=mbs, sp=False)
    else:
        lc = layer_cost(model, hw, job, tp=grid.q, cp=1, mbs=mbs // grid.act_split, sp=True)
    tokens = mbs * job.seq_len
    t = layer_tp_comm_s(mode, model, hw, tp=tp, tokens=tokens)
    mem = layer_tp_memory(mode, model, tp=tp, tokens=tokens, seq_len=job.seq_len, flash=job.flash_attention)
    return ModeTime(mode, tp, lc.fwd.seconds + lc.bwd.seconds, t.fwd_s + t.bwd_s, mem.params, mem.act_bytes)


def paper2_comparison(hw: HardwareSpec | None = None, *, mbs: int = 16) -> tuple[ModeTime, ...]:
    """1-D (tp 64, across 8 nodes), 2-D (8 x 8) and 3-D (4 x 4 x 4) on the paper's 64 V100s."""
    hw = hw or load_hardware("v100-32gb")
    model, job = paper2_model(), paper2_job()
    return tuple(mode_layer_time(m, model, hw, job, tp=64, mbs=mbs) for m in ("1d", "2d", "3d"))


def format_comparison(rows: tuple[ModeTime, ...], title: str) -> str:
    by = {r.mode: r for r in rows}
    header = (f"{'mode':<5}{'compute ms':>12}{'comm ms':>10}{'total ms':>10}{'params/dev M':>14}"
              f"{'act/dev MiB':>13}{'3-D speedup':>13}{'paper':>7}")
    lines = [title, header]
    for r in rows:
        speed = by["3d"].total_s and r.total_s / by["3d"].total_s
        paper = f"{PAPER_SPEEDUP[r.mode]:.2f}x" if r.mode in PAPER_SPEEDUP else "-"
        lines.append(f"{r.mode:<5}{r.compute_s * 1e3:>12.2f}{r.comm_s * 1e3:>10.2f}{r.total_s * 1e3:>10.2f}"
                     f"{r.params / 1e6:>14.2f}{r.act_bytes / 2**20:>13.1f}{speed:>12.2f}x{paper:>7}")
    return "\n".join(lines)


def speedups(rows: tuple[ModeTime, ...]) -> dict[str, float]:
    """Predicted speedup of 3-D over each mode (per-layer step time ratio)."""
    by = {r.mode: r for r in rows}
    return {m: by[m].total_s / by["3d"].total_s for m in by if m != "3d"}


def main() -> None:
    hw = load_hardware("v100-32gb")
    print(format_comparison(paper2_comparison(hw), "64 x V100-32GB, 8 GPUs/node (DGX-1), one layer fwd+bwd, mbs 16"))
    print("\nsensitivity of the predicted 3-D speedups (paper: 2.32x over 1-D, 1.57x over 2-D)")
    for label, spec in (("8 GPUs/node", hw), ("4 GPUs/node", replace(hw, gpus_per_node=4))):
        for mbs in (16, 32, 64, 128):
            s = speedups(paper2_comparison(spec, mbs=mbs))
            print(f"  {label}, mbs {mbs:>3}: over 1-D {s['1d']:.2f}x, over 2-D {s['2d']:.2f}x")


if __name__ == "__main__":
    raise SystemExit(run_main(main))
