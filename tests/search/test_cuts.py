"""The partition model's cuts (search/cuts.py): the neighbours' critical paths, walked all at once, are the
ones the plain per-neighbour loop finds; and seeding a solve with a hint's paths (search/partition.py) never
changes the optimum it proves."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from autotune.catalog import load_hardware
from autotune.costmodel.critical import critical_path
from autotune.costmodel.estimate import CostModel
from autotune.search.cuts import durations_at, neighbour_paths, neighbours, pass_coefficients
from autotune.search.partition import Hint, solve_partition
from autotune.search.space import Candidate
from autotune.search.tables import candidate_costs
from autotune.specs.job import JobSpec

from ._instances import tiny_model

LAYERS = 12


def _costs(schedule: str, pp: int, m: int, vpp: int = 1, full_max: int = 0):
    model = tiny_model(layers=LAYERS, hidden=128, heads=8, ffn=256, vocab=64000)
    cm = CostModel(model, replace(load_hardware("h100-sxm"), gpus_per_node=2), JobSpec(global_batch=2 * m, seq_len=128))
    c = Candidate(tp=1, pp=pp, dp=2, cp=1, mbs=1, num_microbatches=m, schedule=schedule, vpp=vpp, base="none",
                  full_min=0, full_max=full_max, zero=1, sp=False, vocab="balanced")
    return candidate_costs(cm, c, (4000,))


def _plain_neighbour_paths(cc, durations, k_vals, rc_vals, paths):
    """The loop neighbour_paths replaces: one critical path per neighbour, each path's length summed in Python."""
    c, out = cc.cand, []
    for k, rc in neighbours(k_vals, rc_vals):
        at = durations_at(durations, k, rc)
        length, path = critical_path(c.schedule, c.pp, c.vpp, c.num_microbatches, at, cc.ticks)
        if all(sum(count * at[i][j]["FBW".index(kind)] for (i, j, kind), count in q.items()) < length
               for q in paths + out):
            out.append(path)
    return out


@pytest.mark.parametrize(("schedule", "pp", "m", "vpp"), [
    ("1f1b", 4, 3, 1), ("1f1b", 3, 9, 1), ("zb-h1", 4, 2, 1), ("zb-h1", 4, 8, 1), ("interleaved", 2, 4, 2),
    ("v-half", 3, 6, 1)])
def test_neighbour_paths_are_the_plain_loops(schedule, pp, m, vpp) -> None:
    cc = _costs(schedule, pp, m, vpp, full_max=2)
    durations = pass_coefficients(cc)
    chunks = LAYERS // vpp
    partitions = [k for k in itertools.product(range(chunks + 1), repeat=pp) if sum(k) == chunks][::7]
    for k_vals in partitions[:12]:
        for r in (0, 1):
            rc = tuple(min(r, k) for k in k_vals)
            for known in ([], _plain_neighbour_paths(cc, durations, k_vals, rc, [])[:2]):
                assert (neighbour_paths(cc, durations, k_vals, rc, list(known))
                        == _plain_neighbour_paths(cc, durations, k_vals, rc, list(known))), (k_vals, r)


@pytest.mark.parametrize(("schedule", "pp", "m"), [("1f1b", 4, 4), ("zb-h1", 4, 8), ("zb-h1", 3, 24)])
def test_a_hint_seeds_cuts_but_not_the_answer(schedule, pp, m) -> None:
    """With few micro-batches (m <= 2p) the hint's critical path and its neighbours' are cut in at once, with
    many only its own: the proven optimum is the unseeded one, from good and from poor hints."""
    cc = _costs(schedule, pp, m, full_max=3)
    plain = solve_partition(cc, LAYERS)
    assert plain.status == "OPTIMAL"
    for chunks in ((LAYERS // pp,) * pp, (LAYERS - pp + 1,) + (1,) * (pp - 1)):
        seeded = solve_partition(cc, LAYERS, hint=Hint(chunks, 1, 4000))
        assert (seeded.status, seeded.objective) == ("OPTIMAL", plain.objective), chunks


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_schedules_without_a_split_backward_run_w_inside_b(schedule) -> None:
    """The tables the cuts walk carry W = 0 there (folded into B), as makespan runs them."""
    cc = _costs(schedule, 2, 4, 2 if schedule == "interleaved" else 1, full_max=2)
    fixed, (f, b, w, d) = pass_coefficients(cc)
    assert w == 0 and all(W == 0 for row in fixed for _, _, W in row)


def test_neighbours_by_hand() -> None:
    """Two stages of 2 and 1 chunks, the first recomputing 1: a chunk moved either way, each stage one larger
    or smaller; the recomputed chunks capped by the stage's own and the solution's most recomputed."""
    assert neighbours([2, 1], [1, 0]) == [([1, 2], (1, 1)), ([3, 0], (1, 0)), ([1, 1], (1, 1)), ([2, 0], (1, 0)),
                                          ([3, 1], (1, 1)), ([2, 2], (1, 1))]
    assert neighbours([0, 1], [0, 0]) == [([1, 0], (0, 0)), ([0, 0], (0, 0)), ([1, 1], (0, 0)), ([0, 2], (0, 0))]


@pytest.mark.parametrize(("schedule", "pp", "m"), [("1f1b", 4, 4), ("zb-h1", 4, 8), ("v-half", 3, 6)])
def test_paths_met_for_another_candidate_cut_but_do_not_change_the_answer(schedule, pp, m) -> None:
    """A path of a schedule's graph bounds the pipeline time whatever the passes last, so the planner hands the
    critical paths met solving one candidate to the others with the same graph (`known`); and an exact loop
    whose relaxation it cannot replay starts from the relaxation's cuts (`first`): the optimum stays the one
    proven without them."""
    donor, cc = _costs(schedule, pp, m, full_max=3), _costs(schedule, pp, m)
    met = solve_partition(donor, LAYERS).met
    plain = solve_partition(cc, LAYERS)
    assert met and plain.status == "OPTIMAL"
    assert solve_partition(cc, LAYERS, known=met).objective == plain.objective
    hint = Hint((LAYERS - pp + 1,) + (1,) * (pp - 1), 0, 4000)
    relaxed = solve_partition(cc, LAYERS, exact=False, hint=hint, known=met)
    if relaxed.status == "RELAXED":  # then the exact loop, from a different hint: no replay, the cuts
        exact = solve_partition(cc, LAYERS, hint=Hint((LAYERS // pp,) * pp, 0, 4000), first=relaxed.first)
        assert (exact.status, exact.objective) == ("OPTIMAL", plain.objective)
