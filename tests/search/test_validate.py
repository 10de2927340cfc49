"""The independent validator: it rejects hand-made plans that break a rule or overflow a stage's memory, and
accepts every plan the planner returns."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.estimate import CostModel
from autotune.errors import InfeasibleError, InvalidPlanError
from autotune.search.planner import search
from autotune.search.space import SearchSpace
from autotune.search.validate import validate_plan
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, check_plan
from autotune.units import gib
from ._instances import Instance, instances, tiny_model

MODEL = tiny_model(layers=8, hidden=512, heads=8, kv_heads=2, vocab=32000)
JOB = JobSpec(global_batch=16, seq_len=512)
GOOD = Plan(tp=2, pp=2, dp=2, mbs=1, num_microbatches=8, layers_per_stage=(4, 4))


def cost_model(hw=None) -> CostModel:
    return CostModel(MODEL, hw or load_hardware("h100-sxm"), JOB)


def test_a_good_plan_passes_and_returns_its_estimate() -> None:
    cm = cost_model()
    est = validate_plan(GOOD, cm, 8)
    assert est.step_time_s == cm.estimate(GOOD).step_time_s
    assert est.fits


@pytest.mark.parametrize(("change", "gpus", "message"), [
    ({"layers_per_stage": (4, 3)}, 8, "sum to num_layers"),
    ({"layers_per_stage": (8,)}, 8, "entries but pp is 2"),
    ({"layers_per_stage": (9, -1)}, 8, "must be >= 0"),
    ({"layers_per_stage": (5, 3)}, 8, "vocab 'ends' means an even split"),
    ({"tp": 4, "dp": 1}, 8, "must divide num_heads 8 and num_kv_heads 2"),
    ({"tp": 1}, 8, "= 4 GPUs, but --gpus is 8"),
    ({"dp": 1, "cp": 6, "tp": 1}, 12, "needs seq_len divisible by 2\\*cp = 12"),
    ({"mbs": 2}, 8, "global batch 16 != dp 2 x mbs 2"),
    ({"tp": 1, "dp": 4, "num_microbatches": 4, "sequence_parallel": True}, 8, "sequence_parallel needs tp > 1"),
    ({"zero": 2}, 8, "zero 2 shards gradients"),
    ({"recompute_layers": 2}, 8, "recompute_layers applies only to recompute 'full'"),
])
def test_rule_breaking_plans_are_rejected(change: dict, gpus: int, message: str) -> None:
    with pytest.raises(InvalidPlanError, match=message):
        validate_plan(replace(GOOD, **change), cost_model(), gpus)


def test_tp_across_nodes_and_idle_gpus_follow_the_flags() -> None:
    cm = cost_model(replace(load_hardware("h100-sxm"), gpus_per_node=1))
    with pytest.raises(InvalidPlanError, match="exceeds the 1 GPUs of a node"):
        validate_plan(GOOD, cm, 8)
    assert validate_plan(GOOD, cm, 8, allow_cross_node_tp=True).fits
    with pytest.raises(InvalidPlanError, match="--gpus is 16"):
        validate_plan(GOOD, cost_model(), 16)
    assert validate_plan(GOOD, cost_model(), 16, allow_idle=True).fits


@pytest.mark.parametrize(("layers", "stage"), [((32,), 0), ((2, 2, 2, 26), 3)])
def test_a_stage_over_memory_is_named_with_its_gib(layers: tuple[int, ...], stage: int) -> None:
    """Llama-3-8B, one H100 per stage: everything on one GPU overflows stage 0; piling 26 layers on the last
    of four stages overflows stage 3 only."""
    model, hw, job = load_model("llama3-8b"), load_hardware("h100-sxm"), JobSpec(global_batch=8, seq_len=4096)
    cm = CostModel(model, hw, job)
    plan = Plan(tp=1, pp=len(layers), dp=1, mbs=1, num_microbatches=8, layers_per_stage=layers,
                vocab="ends" if len(set(layers)) == 1 else "balanced")
    est = cm.estimate(plan)
    over = [s.index for s in est.stages if s.memory.total > est.usable_memory_bytes]
    assert over == [stage]
    with pytest.raises(InvalidPlanError) as info:
        validate_plan(plan, cm, len(layers))
    need, usable = gib(est.stages[stage].memory.total), gib(hw.usable_memory_bytes)
    assert re.fullmatch(rf"stage {stage} needs {need:.1f} GiB \(.+\) > {usable:.1f} GiB usable", str(info.value))


def test_the_planners_plans_validate() -> None:
    model, hw, job = load_model("llama3-8b"), load_hardware("h100-sxm"), JobSpec(global_batch=64, seq_len=4096)
    res = search(model, hw, job, 16, SearchSpace())
    cm = CostModel(model, hw, job)
    for est in [res.best, *(r.estimate for r in res.runners_up if r.reason.startswith("slower"))]:
        assert validate_plan(est.plan, cm, 16).step_time_s == est.step_time_s


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances())
def test_every_returned_plan_validates(inst: Instance) -> None:
    """Whatever the space (full recompute and the default buckets included), the best plan and the runners-up
    that lost on time pass check_plan and validate_plan; those that lost on memory do not fit."""
    space = SearchSpace()
    try:
        res = search(inst.model, inst.hw, inst.job, inst.gpus, space, time_limit_s=20)
    except InfeasibleError:
        event("nothing fits")
        return
    cm = CostModel(inst.model, inst.hw, inst.job)
    slower = [r.estimate for r in res.runners_up if r.reason.startswith("slower by ")]
    for est in [res.best, *slower]:
        check_plan(est.plan, inst.model, inst.job, inst.gpus, inst.hw.gpus_per_node)
        assert validate_plan(est.plan, cm, inst.gpus).step_time_s == est.step_time_s
        assert est.step_time_s >= res.best.step_time_s
    for r in res.runners_up:
        if r.reason.startswith("out of memory"):
            event("a runner-up out of memory")
            assert not r.estimate.fits
        else:
            assert r.reason.startswith("slower by ")


@pytest.mark.parametrize(("name", "gpus", "batch"), [("mixtral-8x7b", 64, 512), ("llama3-70b", 64, 512)])
def test_runners_up_are_the_closest_strategies_whatever_top_asks(name, gpus, batch):
    """The runners-up search visits candidates in bound order while one may still enter the top k, visiting, timing
    and solving the same whatever k (reviewer: a per-k visit cap made llama3-70b's --top 1 show a plan 3.4% slower
    where --top 3 found one 1.3% slower), so asking for more extends the list and never reorders it, and a plan
    met early in the proof no longer stands in for faster strategies never visited (mixtral-8x7b on 64 H100s:
    --top 1 showed one 291% slower)."""
    model, hw, job = load_model(name), load_hardware("h100-sxm"), JobSpec(global_batch=batch, seq_len=4096)

    def slower(top: int) -> list[tuple[Plan, float]]:
        res = search(model, hw, job, gpus, SearchSpace(), top_k=top)
        return [(r.estimate.plan, r.estimate.step_time_s / res.best.step_time_s) for r in res.runners_up
                if r.reason.startswith("slower by ")]

    one, five = slower(1), slower(5)
    assert one == five[:1] and one[0][1] < 1.02
    assert [ratio for _, ratio in five] == sorted(ratio for _, ratio in five)


def test_a_long_runners_up_list_is_complete_or_says_it_was_cut(monkeypatch, capsys):
    """--top 50 on llama3-8b / 64 H100s: a fixed cap of 5000 visits left out a strategy 2% faster than the 47th
    (user-tester). The cap grows with the list asked for, a complete list is a prefix of a longer one, and a list
    the cap cuts says so (PlanResult.runners_up_cut, a warning on stderr)."""
    import autotune.search.planner as planner
    from autotune.cli.app import main

    model, hw, job = load_model("llama3-8b"), load_hardware("h100-sxm"), JobSpec(global_batch=512, seq_len=8192)

    def listed(top: int) -> tuple[list[tuple[Plan, float]], bool]:
        res = search(model, hw, job, 64, SearchSpace(), top_k=top)
        return ([(r.estimate.plan, r.estimate.step_time_s) for r in res.runners_up
                 if r.reason.startswith("slower by ")], res.runners_up_cut)

    fifty, cut = listed(50)
    sixty, _ = listed(60)
    assert not cut and len(fifty) == 50 and fifty == sixty[:50]
    assert [t for _, t in fifty] == sorted(t for _, t in fifty)
    monkeypatch.setattr(planner, "RUNNER_VISITS", 100)
    monkeypatch.setattr(planner, "RUNNER_VISITS_EACH", 0)
    assert listed(50)[1]
    with pytest.raises(SystemExit) as done:
        main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "512",
              "--seq-len", "8192", "--top", "50", "--brief"])
    assert done.value.code == 0 and "--top 50: the runners-up search stopped at its cap" in capsys.readouterr().err
