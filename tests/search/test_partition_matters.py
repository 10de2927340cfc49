"""Where the vocabulary layers make the layer split matter: a 256k vocabulary on 8 pipeline stages.

The LM head and loss of a 256k vocabulary cost a few Transformer layers (6*s*h*V FLOP against ~100*s*h^2 for
a layer of this shape), so the even split leaves the last stage the bottleneck; the planner moves layers off it.
With a 32k vocabulary the head costs under one layer and the even split is already the optimum. Both margins
are checked against CostModel.estimate of the two plans, so they are exactly what the cost model predicts.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import load_hardware
from autotune.costmodel.estimate import CostModel
from autotune.search.planner import PlanResult, search
from autotune.search.space import SearchSpace
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan, is_even_split
from ._instances import tiny_model
from .bruteforce import brute_force

JOB = JobSpec(global_batch=32, seq_len=4096)
GPUS = 8
#: pp pinned to 8 on 8 GPUs; the rest of the space (micro-batch, schedule, recompute, ZeRO, bucket) stays free;
#: the vocabulary layers stay on the end stages (vocabulary parallelism: tests/search/test_vocab_choice.py).
SPACE = SearchSpace(pp=(8,), tp=(1,), dp=(1,), cp=(1,), vocab=("ends", "balanced"))
EVEN = replace(SPACE, vocab=("ends",))


def llama_shape(vocab: int) -> ModelSpec:
    """Llama-3-8B's body (32 layers, h 4096, 32 heads, 8 KV heads, SwiGLU 14336) with the given vocabulary."""
    return tiny_model(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=vocab)


def plan_both(model: ModelSpec) -> tuple[CostModel, PlanResult, PlanResult]:
    hw = load_hardware("h100-sxm")
    free = search(model, hw, JOB, GPUS, SPACE)
    even = search(model, hw, JOB, GPUS, EVEN)
    assert free.status == even.status == "OPTIMAL"
    return CostModel(model, hw, JOB), free, even


def margin(cm: CostModel, free: PlanResult, even: PlanResult) -> float:
    """Even-split step time minus the planner's, re-derived from CostModel.estimate of the two plans."""
    t_free, t_even = cm.estimate(free.best.plan).step_time_s, cm.estimate(even.best.plan).step_time_s
    assert t_free == pytest.approx(free.best.step_time_s, rel=1e-12)
    assert t_even == pytest.approx(even.best.step_time_s, rel=1e-12)
    return t_even - t_free


@pytest.fixture(scope="module")
def large_vocab() -> tuple[CostModel, PlanResult, PlanResult]:
    return plan_both(llama_shape(256000))


def test_large_vocabulary_moves_layers_off_the_last_stage(large_vocab) -> None:
    cm, free, even = large_vocab
    layers = free.best.plan.layers_per_stage
    assert layers[-1] < max(layers)
    assert free.best.plan.vocab == "balanced"
    assert even.best.plan.layers_per_stage == (4,) * 8
    gain = margin(cm, free, even)
    assert free.best.step_time_s == pytest.approx(even.best.step_time_s - gain, rel=1e-12)
    assert gain / even.best.step_time_s > 0.10  # about 34% with this cost model


def test_even_split_search_is_the_even_optimum(large_vocab) -> None:
    """vocab 'ends' is the even split with everything else free: brute force over it agrees."""
    cm, _, even = large_vocab
    bf = brute_force(cm.model, cm.hw, JOB, GPUS, EVEN).best
    assert even.best.step_time_s == pytest.approx(bf.step_time_s, rel=1e-6)


def test_same_strategy_on_the_even_split_is_slower(large_vocab) -> None:
    """Only the split changes: the planner's plan on the even split fits and is no faster than the even
    optimum (about 60% slower than the planner's plan with this cost model)."""
    cm, free, even = large_vocab
    r = free.best.plan.recompute_layers
    plan = replace(free.best.plan, layers_per_stage=(4,) * 8, vocab="ends",
                   recompute_layers=None if r is None or r >= 4 else r)
    est = cm.estimate(plan)
    assert est.fits
    assert est.step_time_s >= even.best.step_time_s * (1 - 1e-9) > free.best.step_time_s


def test_no_single_layer_move_improves(large_vocab) -> None:
    """Local optimality under the estimate: moving one layer between two stages never gives a faster plan
    that fits (a check independent of the solver)."""
    cm, free, _ = large_vocab
    best = free.best
    for neighbour in _one_layer_moves(best.plan):
        est = cm.estimate(neighbour)
        assert not (est.fits and est.step_time_s < best.step_time_s * (1 - 1e-9)), neighbour.layers_per_stage


def _one_layer_moves(plan: Plan):
    layers = plan.layers_per_stage
    for src in range(len(layers)):
        for dst in range(len(layers)):
            if src != dst and layers[src] > (0 if src in (0, len(layers) - 1) else 1):
                moved = list(layers)
                moved[src] -= 1
                moved[dst] += 1
                r = plan.recompute_layers
                yield replace(plan, layers_per_stage=tuple(moved), vocab="ends" if is_even_split(moved) else "balanced",
                              recompute_layers=None if r is None or r >= max(moved) else r)


def test_small_vocabulary_gains_little() -> None:
    """A 32k vocabulary: the head is lighter than a layer, the even split is (about) optimal."""
    cm, free, even = plan_both(llama_shape(32000))
    gain = margin(cm, free, even)
    assert gain >= -1e-12 * even.best.step_time_s
    assert gain / even.best.step_time_s < 0.01  # 0 with this cost model
