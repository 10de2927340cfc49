"""What a CostModel remembers across plans (layer costs, tick proportions, pipeline simulations, point-to-point
times) and the precompiled pass graph change no estimate: every figure equals a fresh CostModel's and the
plain pass-by-pass simulation's, to the last bit."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from autotune.catalog import load_hardware, load_model
from autotune.costmodel import pipeline
from autotune.costmodel.estimate import CostModel
from autotune.costmodel.passids import pass_ids
from autotune.costmodel.wavefront import wavefront_makespan, wavefronts
from autotune.search.space import SearchSpace, enumerate_candidates
from autotune.search.tables import to_plan
from autotune.specs.job import JobSpec
from autotune.specs.plan import InvalidPlanError, Plan, check_plan, even_split

GPUS = 64


def _varied_plans(model, job, hw, space: SearchSpace, every: int, limit: int) -> list[Plan]:
    """Every `every`-th plan of the enumeration: even and uneven splits, full recompute of some layers."""
    plans, seen = [], 0
    for c in enumerate_candidates(model, job, GPUS, hw.gpus_per_node, space):
        even = even_split(model.num_layers, c.pp)
        uneven = (even[0] - 2,) + even[1:-1] + (even[-1] + 2,) if c.pp > 2 else even
        for layers in (even, uneven):
            for r in (0, 1) if c.full_max else (0,):
                seen += 1
                if seen % every:
                    continue
                plan = to_plan(c, layers, r=r)
                try:
                    check_plan(plan, model, job, GPUS, hw.gpus_per_node)
                except InvalidPlanError:
                    continue
                plans.append(plan)
        if len(plans) >= limit:
            break
    return plans


@pytest.fixture(scope="module")
def setting():
    model, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    job = JobSpec(global_batch=512, seq_len=8192)
    plans = _varied_plans(model, job, hw, SearchSpace(zero=(0, 1, 2, 3), vocab=("ends", "balanced", "parallel")),
                          37, 80)
    plans += _varied_plans(model, job, hw, SearchSpace(schedule=("v-half", "zb-h1"), tp_overlap=(False, True)),
                           11, 40)
    for mode in ("2d", "3d"):
        plans += _varied_plans(model, job, hw, SearchSpace(tp_mode=(mode,)), 7, 10)
    return model, hw, job, plans


def test_the_plans_cover_the_knobs(setting):
    _, _, _, plans = setting
    assert {p.schedule for p in plans} >= {"1f1b", "interleaved", "zb-h1", "v-half"}
    assert {p.vocab for p in plans} >= {"ends", "balanced", "parallel"}
    assert {p.zero for p in plans} >= {0, 1, 2, 3} and {p.tp_mode for p in plans} >= {"1d", "2d", "3d"}
    assert {p.recompute for p in plans} >= {"none", "selective", "full"}


def test_a_cost_model_used_for_many_plans_estimates_each_as_a_fresh_one(setting):
    model, hw, job, plans = setting
    shared = CostModel(model, hw, job)
    for plan in plans + plans[::-1]:  # twice, the second time from what the first left behind
        fresh = CostModel(model, hw, job).estimate(plan)
        cached = shared.estimate(plan)
        assert cached == fresh and repr(cached) == repr(fresh), plan
    assert shared._makespan.cache_info().hits >= len(plans)


def test_stages_and_timeline_agree_with_the_estimate(setting):
    model, hw, job, plans = setting
    cm = CostModel(model, hw, job)
    for plan in plans[::9]:
        est = cm.estimate(plan)
        assert cm.stages(plan) == est.stages
        timeline = cm.timeline(plan)
        assert est.breakdown.bubble_s == timeline.makespan - plan.num_microbatches * est.stages[
            est.bottleneck].time_s


def _plain_makespan(schedule: str, pp: int, vpp: int, m: int, durations, ticks) -> float:
    """The pass-by-pass simulation makespan replaced: what the compiled graph must reproduce bit for bit."""
    g = pipeline._graph(schedule, pp, vpp, m, ticks)
    split = schedule in pipeline.SPLIT_BACKWARD
    code = {"F": 0, "B": 1, "W": 2}
    end = [0.0] * len(g.ops)
    for k, op in enumerate(g.ops):
        p, d = g.prev[k], g.dep[k]
        start = end[p] if p >= 0 else 0.0
        if d >= 0 and end[d] > start:
            start = end[d]
        f, b, w = durations[g.ranks[k]][op.chunk]
        end[k] = start + (f, b if split else b + w, w)[code[op.kind]]
    return max(end)


SHAPES = [(s, pp, v, m) for s, v in (("1f1b", 1), ("zb-h1", 1), ("interleaved", 2), ("interleaved", 3),
                                       ("v-half", 1))
          for pp in (1, 2, 3, 4, 8) for m in (1, 2, 5, 8, 16) if s != "interleaved" or m % pp == 0]


@pytest.mark.parametrize("schedule,pp,vpp,m", SHAPES)
def test_makespan_is_the_plain_simulation_to_the_last_bit(schedule, pp, vpp, m):
    rnd = random.Random(f"{schedule}{pp}{vpp}{m}")
    v = pipeline.chunks_per_rank(schedule, vpp)
    for _ in range(4):  # irregular times, zeros and exact ties between ranks
        pick = [rnd.random, lambda: 0.0, lambda: 0.125, lambda: rnd.random() * 1e-3]
        durations = tuple(tuple((rnd.choice(pick)(), rnd.choice(pick)(), rnd.choice(pick)()) for _ in range(v))
                          for _ in range(pp))
        ticks = pipeline._ticks(schedule, durations, None)
        got = pipeline.makespan(schedule, pp, vpp, m, durations)
        assert repr(got) == repr(_plain_makespan(schedule, pp, vpp, m, durations, ticks))
        assert repr(got) == repr(pipeline.simulate(schedule, pp, vpp, m, durations).makespan)


def _random_durations(rnd: random.Random, pp: int, v: int):
    """Irregular times, zeros and exact ties between ranks."""
    pick = [rnd.random, lambda: 0.0, lambda: 0.125, lambda: rnd.random() * 1e-3]
    return tuple(tuple((rnd.choice(pick)(), rnd.choice(pick)(), rnd.choice(pick)()) for _ in range(v))
                 for _ in range(pp))


@pytest.mark.parametrize("schedule,pp,vpp,m", SHAPES)
def test_wavefronts_give_the_plain_simulation_to_the_last_bit(schedule, pp, vpp, m):
    """makespan walks wavefronts only with many ranks: here the grouping is checked on every small shape."""
    rnd = random.Random(f"wave{schedule}{pp}{vpp}{m}")
    for _ in range(4):
        durations = _random_durations(rnd, pp, pipeline.chunks_per_rank(schedule, vpp))
        ticks = pipeline._ticks(schedule, durations, None)
        v = pipeline.chunks_per_rank(schedule, vpp)
        ids = pass_ids(schedule, pp, v, m, pipeline.rank_orders(schedule, pp, vpp, m, ticks))
        got = wavefront_makespan(wavefronts(ids), pipeline.flat_durations(schedule, durations))
        assert repr(got) == repr(_plain_makespan(schedule, pp, vpp, m, durations, ticks))


@pytest.mark.parametrize("schedule,vpp,m", [("1f1b", 1, 7), ("zb-h1", 1, 70), ("interleaved", 2, 96), ("v-half", 1, 5)])
def test_makespan_of_many_ranks_is_the_plain_simulation(schedule, vpp, m):
    pp = pipeline.WAVEFRONT_MIN_PP
    rnd = random.Random(f"wide{schedule}{m}")
    durations = _random_durations(rnd, pp, pipeline.chunks_per_rank(schedule, vpp))
    ticks = pipeline._ticks(schedule, durations, None)
    assert repr(pipeline.makespan(schedule, pp, vpp, m, durations)) == repr(
        _plain_makespan(schedule, pp, vpp, m, durations, ticks))
    # makespan walks the grid only where its rows are full (Wavefronts.pays): the grid itself, whether it does
    grid = pipeline._wavefronts(schedule, pp, vpp, m, ticks)
    assert repr(wavefront_makespan(grid, pipeline.flat_durations(schedule, durations))) == repr(
        _plain_makespan(schedule, pp, vpp, m, durations, ticks))
    integers = tuple(tuple((1, 2, 1) for _ in row) for row in durations)  # a float, as the loop's
    assert repr(pipeline.makespan(schedule, pp, vpp, m, integers)) == repr(
        _plain_makespan(schedule, pp, vpp, m, integers, pipeline._ticks(schedule, integers, None)))


def test_makespan_rejects_durations_of_the_wrong_width():
    with pytest.raises(ValueError, match="2 \\(F, B, W\\) per rank"):
        pipeline.makespan("interleaved", 2, 2, 4, (((1.0, 1.0, 0.0),), ((1.0, 1.0, 0.0),)))


def test_graph_passes_follow_their_rank_order_and_dependencies():
    for schedule, pp, vpp, m in SHAPES:
        g = pipeline._graph(schedule, pp, vpp, m)
        orders = pipeline.rank_orders(schedule, pp, vpp, m)
        for r in range(pp):
            assert tuple(op for rank, op in zip(g.ranks, g.ops) if rank == r) == orders[r]
        for k in range(len(g.ops)):
            assert g.prev[k] < k and g.dep[k] < k
            assert g.prev_at[k] == (g.prev[k] + 2 if g.prev[k] >= 0 else 0)
            assert g.dep_at[k] == (g.dep[k] + 2 if g.dep[k] >= 0 else 1)


def test_peaks_ignore_ticks_except_under_v_half():
    assert pipeline.peak_in_flight("1f1b", 4, 1, 8, (3, 5, 2)) == pipeline.peak_in_flight("1f1b", 4, 1, 8)
    assert pipeline.peak_in_flight("zb-h1", 4, 1, 8, (3, 5, 2)) == (4, 4, 4, 4)


def test_partitions_of_one_plan_share_its_stage_memo_and_estimate_as_fresh(setting):
    """Plans that differ only in their partition share one memo of stage costs (a stage of equal index and layer
    count costs the same), and each estimate still equals a fresh CostModel's to the last bit."""
    model, hw, job, _ = setting
    base = Plan(tp=2, pp=4, dp=8, mbs=1, num_microbatches=64, zero=1, sequence_parallel=True,
                layers_per_stage=(8, 8, 8, 8), vocab="balanced")
    shared = CostModel(model, hw, job)
    splits = [(8, 8, 8, 8), (7, 9, 8, 8), (9, 8, 8, 7), (7, 9, 9, 7), (8, 8, 9, 7), (8, 8, 8, 8)]
    for layers in splits:
        plan = replace(base, layers_per_stage=layers)
        check_plan(plan, model, job, GPUS, hw.gpus_per_node)
        assert shared.estimate(plan) == CostModel(model, hw, job).estimate(plan), layers
    assert len(shared._stage_memo) == 1
    (memo,) = shared._stage_memo.values()
    assert set(memo["built"]) == {(i, n) for layers in splits for i, n in enumerate(layers)}


@pytest.mark.parametrize(("name", "trainer"), [("llama3-70b", "megatron"), ("llama3-70b", "torchtitan"),
                                                ("deepseek-v3", "megatron"), ("mixtral-8x7b", "torchtitan")])
def test_memoized_op_times_give_the_layer_costs_to_the_bit(name: str, trainer: str) -> None:
    """CostModel.layer shares op times between layer shapes (compute.memoized_op_time); every layer cost, with TP
    overlap (Megatron's userbuffers, torchtitan's async TP) and expert layouts, equals the unmemoized one."""
    from autotune.costmodel.layer import layer_cost

    model, hw = load_model(name), load_hardware("h100-sxm")
    job = JobSpec(global_batch=256, seq_len=4096, trainer=trainer)  # type: ignore[arg-type]
    cm = CostModel(model, hw, job)
    shapes = [(tp, cp, mbs, tp > 1, "1d", overlap and tp > 1, ep, etp)
              for tp in (1, 2, 8) for cp in (1, 2) for mbs in (1, 2) for overlap in (False, True)
              for ep, etp in ((1, 1), (1, tp), (8, 1)) if model.is_moe or (ep, etp) == (1, 1)]
    for tp, cp, mbs, sp, mode, overlap, ep, etp in shapes:
        memoized = cm.layer(tp, cp, mbs, sp, mode, overlap, ep, etp)
        plain = layer_cost(model, hw, job, tp=tp, cp=cp, mbs=mbs, sp=sp, tp_overlap=overlap, ep=ep, etp=etp)
        assert memoized == plain, (tp, cp, mbs, overlap, ep, etp)
    assert len(cm._op_memo) > 0
