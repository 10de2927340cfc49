"""Small search instances built by hand or drawn by hypothesis: tiny Transformers on catalog GPUs whose memory
is scaled to the model so that it binds in some draws and not in others."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache

from hypothesis import event
from hypothesis import strategies as st

from autotune.catalog import load_hardware
from autotune.costmodel.estimate import CostModel, Estimate
from autotune.search.space import Candidate, SearchSpace, enumerate_candidates
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan
from .bruteforce import candidate_optimum, smallest_stage_params

GPUS = ("h100-sxm", "a100-80gb", "mi300x")
#: Usable memory as a fraction of the single-GPU plan's peak (no parallelism, no recompute, mbs 1): below
#: ~0.3 memory binds hard (parallelism, ZeRO or recompute needed, often nothing fits), 4.0 never binds.
MEMORY_FRACTIONS = (0.6, 0.45, 0.3, 1.0, 0.2, 4.0, 0.15)


@dataclass(frozen=True, slots=True)
class Instance:
    model: ModelSpec
    hw: HardwareSpec
    job: JobSpec
    gpus: int

    def candidates(self, space: SearchSpace) -> list:
        return list(enumerate_candidates(self.model, self.job, self.gpus, self.hw.gpus_per_node, space))


def tiny_model(*, layers: int, hidden: int, heads: int, kv_heads: int | None = None, ffn: int | None = None,
               vocab: int = 32000, activation: str = "swiglu", tied: bool = False) -> ModelSpec:
    return ModelSpec(name="tiny", num_layers=layers, hidden_size=hidden, num_heads=heads,
                     num_kv_heads=kv_heads or heads, head_dim=hidden // heads, ffn_hidden_size=ffn or 4 * hidden,
                     vocab_size=vocab, activation=activation, norm="rmsnorm", tied_embeddings=tied)


def single_gpu_peak(model: ModelSpec, hw: HardwareSpec, job: JobSpec) -> int:
    """Peak bytes of the plain single-GPU plan, the yardstick the memory of a drawn GPU is scaled by."""
    plan = Plan(tp=1, pp=1, dp=1, mbs=1, num_microbatches=job.global_batch, layers_per_stage=(model.num_layers,))
    return CostModel(model, hw, job).estimate(plan).peak_memory_bytes


def with_memory(hw: HardwareSpec, usable: int, **changes) -> HardwareSpec:
    """The GPU with exactly `usable` bytes a plan may fill (no reserve)."""
    return replace(hw, memory_bytes=max(1, usable), memory_reserve_bytes=0, **changes)


def fitting_bucket(inst: Instance, space: SearchSpace) -> int:
    """The largest bucket every candidate of the space can use (no larger than any stage can be), so the
    planner never falls back to a bucket outside space.buckets."""
    cm = CostModel(inst.model, inst.hw, inst.job)
    return max(1, min(smallest_stage_params(cm, c) for c in inst.candidates(space)))


def fitting_candidates(inst: Instance) -> Iterator[tuple[CostModel, SearchSpace, Candidate, Estimate]]:
    """(cost model, space, candidate, its brute-force best plan) for every candidate of the default space that
    has a fitting plan, the space's buckets being ones that fit every stage and one that does not."""
    space = SearchSpace()
    s = fitting_bucket(inst, space)
    space = replace(space, buckets=tuple(sorted({max(1, s // 2), s, 4 * s + 1})))
    cm = CostModel(inst.model, inst.hw, inst.job)
    for c in inst.candidates(space):
        best = candidate_optimum(cm, c, space, inst.gpus).best
        if best is None:
            continue
        event("a candidate fits")
        yield cm, space, c, best


@lru_cache(maxsize=None)
def catalog_gpu(name: str) -> HardwareSpec:
    return load_hardware(name)


@st.composite
def tiny_models(draw, layers: st.SearchStrategy[int] = st.integers(2, 8)) -> ModelSpec:
    heads = draw(st.sampled_from((2, 4, 8)))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8) if heads % d == 0]))
    hidden = heads * draw(st.sampled_from((16, 32, 64)))  # 32..512
    return tiny_model(layers=draw(layers), hidden=hidden, heads=heads, kv_heads=kv,
                      ffn=draw(st.sampled_from((2, 4))) * hidden,
                      vocab=draw(st.sampled_from((1000, 32000, 128000, 256000))),
                      activation=draw(st.sampled_from(("gelu", "swiglu"))), tied=draw(st.booleans()))


@st.composite
def instances(draw, layers: st.SearchStrategy[int] = st.integers(2, 8),
              gpus: st.SearchStrategy[int] = st.sampled_from((8, 4, 2, 1)),
              fractions: tuple[float, ...] = MEMORY_FRACTIONS) -> Instance:
    model = draw(tiny_models(layers))
    job = JobSpec(global_batch=draw(st.sampled_from((4, 8, 16, 32))),
                  seq_len=draw(st.sampled_from((128, 256, 512, 1024, 2048))))
    hw = catalog_gpu(draw(st.sampled_from(GPUS)))
    usable = int(single_gpu_peak(model, hw, job) * draw(st.sampled_from(fractions)))
    hw = with_memory(hw, usable, gpus_per_node=draw(st.sampled_from((2, 4, 8))))
    return Instance(model, hw, job, draw(gpus))
