"""What makes the search fast must not change its answer: the bound that sums the pipeline and the sync
(search/joint.py) never exceeds a candidate's optimum, and the sizes of a `scale` sweep, which share one cost
model, get the plans their own searches find. (The exact loop with the neighbours' critical paths,
search/partition.py, is checked against brute force by test_optimality.py.)"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings

from autotune.catalog import load_hardware
from autotune.search.joint import pipe_sync_floor
from autotune.search.planner import search
from autotune.search.scaling import scale
from autotune.search.space import SearchSpace
from autotune.search.tables import candidate_costs
from autotune.specs.job import JobSpec

from ._instances import Instance, fitting_candidates, instances, tiny_model

RANDOM = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
SLACK = 1 + 1e-9


@pytest.mark.slow
@settings(RANDOM, max_examples=20)
@given(inst=instances())
def test_summed_bound_never_exceeds_a_candidates_optimum(inst: Instance) -> None:
    """For every candidate with a fitting plan, with buckets that fit every stage and one that does not: the
    summed bound is <= its brute-force optimum whatever plan the search holds (the optimum itself, a slower
    one, none), and >= the pivot-path floor it starts from."""
    L = inst.model.num_layers
    for cm, space, c, best in fitting_candidates(inst):
        opt = best.step_time_s
        cc = candidate_costs(cm, c, space.buckets)
        for held in (opt, 1.5 * opt, 1.01 * opt, math.inf):
            assert pipe_sync_floor(cc, L, held) <= opt * SLACK, (c, held)


def test_a_sweep_shares_its_cost_model_without_changing_a_size() -> None:
    """The sizes of a sweep share one cost model (it knows no GPU count): each size's plan is the one its own
    search, with a fresh cost model, finds. (One process against two: tests/test_scaling.py.)"""
    model, hw = tiny_model(layers=8, hidden=512, heads=8), load_hardware("a100-80gb")
    job = JobSpec(global_batch=32, seq_len=512)
    sweep = scale(model, hw, job, (8, 16, 32), SearchSpace())
    for point in sweep.points:
        alone = search(model, hw, job, point.gpus, SearchSpace(), top_k=0)
        assert point.status == alone.status == "OPTIMAL"
        assert point.best == alone.best
