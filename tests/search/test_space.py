"""The outer search space and the bounds that prune it.

enumerate_candidates must obey every divisibility rule and miss no valid degree combination; the lower
bounds (`quick_bound`, refined with `forced_recompute_s` and `stage_time_floor`) must never exceed the best
step time of a candidate, found here by exhaustive search, or the planner's proof of optimality is unsound.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.catalog import load_hardware
from autotune.costmodel.estimate import CostModel
from autotune.search.space import MAX_MICROBATCH_TOKENS, Candidate, SearchSpace, divisors
from autotune.search.bounds import forced_recompute_s, memory_possible, quick_bound, stage_time_floor
from autotune.search.pivots import fluid_syncs, pivot_path_floor
from autotune.search.coarse import coarse_bound
from autotune.search.tables import candidate_costs, window_s
from autotune.specs.job import JobSpec
from autotune.specs.plan import is_even_split
from ._instances import Instance, fitting_candidates, instances, tiny_model, with_memory
from .bruteforce import candidate_optimum, partitions

RANDOM = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
#: Bounds are compared with a relative slack far below any real difference (float summation order).
SLACK = 1 + 1e-9


# ------------------------------------------------------------------------------------------ enumeration
@settings(RANDOM, max_examples=100)
@given(inst=instances(gpus=st.sampled_from((1, 2, 3, 4, 6, 8, 12, 16))), idle=st.booleans(),
       cross=st.booleans())
def test_candidates_obey_the_divisibility_rules(inst: Instance, idle: bool, cross: bool) -> None:
    model, job, gpn = inst.model, inst.job, inst.hw.gpus_per_node
    space = SearchSpace(allow_idle=idle, allow_cross_node_tp=cross)
    cands = inst.candidates(space)
    assert len(set(cands)) == len(cands)
    for c in cands:
        assert model.num_heads % c.tp == 0 and model.num_kv_heads % c.tp == 0
        assert cross or c.tp <= gpn
        used = c.tp * c.pp * c.dp * c.cp
        assert used <= inst.gpus if idle else used == inst.gpus
        assert job.global_batch == c.dp * c.mbs * c.num_microbatches
        assert c.cp == 1 or job.seq_len % (2 * c.cp) == 0
        assert 1 <= c.pp <= model.num_layers
        if c.schedule == "interleaved":
            assert c.pp >= 2 and c.vpp >= 2 and c.num_microbatches % c.pp == 0 and model.num_layers % c.vpp == 0
        elif c.schedule == "v-half":
            assert c.pp >= 2 and c.vpp == 2 and model.num_layers >= 2 * c.pp
        else:
            assert c.schedule in ("1f1b", "zb-h1") and c.vpp == 1 and (c.schedule == "1f1b" or c.pp >= 2)
        if c.vocab == "parallel":
            assert c.pp >= 2 and c.schedule != "interleaved" and not model.tied_embeddings
        assert c.zero in ((0, 1) if c.pp > 1 else (0, 1, 2, 3))
        assert not c.sp or c.tp > 1
        assert 0 <= c.full_min <= c.full_max <= model.num_layers // c.vpp
        assert c.base == "none" or c.full_max == 0
    assert {_degrees(c) for c in cands} == _valid_degrees(inst, idle, cross)


def _degrees(c: Candidate) -> tuple:
    return c.tp, c.cp, c.pp, c.dp, c.mbs


def _valid_degrees(inst: Instance, idle: bool, cross: bool) -> set[tuple]:
    """Every (tp, cp, pp, dp, mbs) the rules allow, by plain enumeration."""
    model, job, n = inst.model, inst.job, inst.gpus
    out = set()
    for tp, cp, pp, dp in itertools.product(range(1, n + 1), repeat=4):
        used = tp * cp * pp * dp
        if used > n or (used < n and not idle) or job.global_batch % dp:
            continue
        if model.num_heads % tp or model.num_kv_heads % tp or (tp > inst.hw.gpus_per_node and not cross):
            continue
        if (cp > 1 and job.seq_len % (2 * cp)) or pp > model.num_layers:  # idle GPUs: any degrees up to n
            continue
        for mbs in divisors(job.global_batch // dp):
            if mbs == 1 or mbs * job.seq_len // cp <= MAX_MICROBATCH_TOKENS:
                out.add((tp, cp, pp, dp, mbs))
    return out


def test_pins_restrict_each_axis() -> None:
    inst = Instance(tiny_model(layers=8, hidden=256, heads=8), load_hardware("h100-sxm"),
                    JobSpec(global_batch=16, seq_len=1024), 8)
    space = SearchSpace(tp=(2,), pp=(2,), cp=(1,), mbs=(2,), schedule=("interleaved",), vpp=(4,),
                        recompute=("selective",), zero=(1,), sequence_parallel=(True,), vocab=("ends",))
    cands = inst.candidates(space)
    one = Candidate(2, 2, 2, 1, 2, 4, "interleaved", 4, "selective", 0, 0, 1, True, "ends")
    assert cands == [one._replace(tp_overlap=True), one]  # with sequence parallelism, TP overlap on and off
    assert inst.candidates(replace(space, tp_overlap=(False,))) == [one]


def test_brute_force_partitions_are_every_allowed_split() -> None:
    """The helper the optimality tests rely on: every split into multiples of vpp, the ends of a 1F1B
    pipeline may be empty, the rest hold a chunk or more (checked against a plain product)."""
    for L, pp, vpp, even in itertools.product(range(1, 10), (1, 2, 3, 4), (1, 2, 3), (False, True)):
        want = []
        for split in itertools.product(range(L + 1), repeat=pp):
            lows = [0 if (i in (0, pp - 1) and vpp == 1) else vpp for i in range(pp)] if pp > 1 else [L]
            if sum(split) == L and all(n % vpp == 0 and n >= lo for n, lo in zip(split, lows)):
                if not even or is_even_split(split):
                    want.append(split)
        assert sorted(partitions(L, pp, vpp, even_only=even)) == sorted(want), (L, pp, vpp, even)


# ----------------------------------------------------------------------------------------------- bounds
@pytest.mark.slow
@settings(RANDOM, max_examples=80)
@given(inst=instances())
def test_bounds_never_exceed_a_candidates_optimum(inst: Instance) -> None:
    """For every candidate with a fitting plan: the memory check lets it through, and the quick bound, the
    bound refined by the stage-time floor and the fully refined bound the planner uses are all <= its
    brute-force optimum, with buckets that fit every stage and one that does not; so are the pivot-path floor
    (the dynamic program over partitions of the schedule's pivot paths), the same with each stage's sync and
    Adam step (with_step), and the coarse bound every candidate starts with, whose memory check lets it through."""
    L = inst.model.num_layers
    for cm, space, c, best in fitting_candidates(inst):
        opt = best.step_time_s * SLACK
        cc = candidate_costs(cm, c, space.buckets)
        assert memory_possible(cc, L), c
        floor = stage_time_floor(cc, L)
        assert quick_bound(cm, c, space.buckets) <= opt, c
        assert quick_bound(cm, c, space.buckets, 0.0, floor) <= opt, c
        assert quick_bound(cm, c, space.buckets, forced_recompute_s(cc, L), floor) <= opt, c
        pivots = pivot_path_floor(cc, L)
        assert pivots <= opt, c
        assert quick_bound(cm, c, space.buckets, forced_recompute_s(cc, L), floor, pipe_floor=pivots) <= opt, c
        if cc.syncs:  # the planner asks for it only then (without syncs it adds only Adam)
            assert pivot_path_floor(cc, L, with_step=True) <= opt, c
        coarse, fits = coarse_bound(cm, c, {})
        assert coarse <= opt and fits, c


def test_forced_recompute_is_a_lower_bound() -> None:
    model = tiny_model(layers=5, hidden=512, heads=8, kv_heads=4, ffn=1024, vocab=1000, activation="gelu")
    hw = with_memory(load_hardware("h100-sxm"), 149856460)
    cm = CostModel(model, hw, JobSpec(global_batch=16, seq_len=1024))
    c = Candidate(tp=1, pp=1, dp=4, cp=1, mbs=1, num_microbatches=4, schedule="1f1b", vpp=1, base="none",
                  full_min=0, full_max=5, zero=1, sp=False, vocab="balanced")
    buckets = (1_000_000, 4_000_000, 16_000_000)
    best = candidate_optimum(cm, c, SearchSpace(buckets=buckets), 4).best
    cc = candidate_costs(cm, c, buckets)
    assert quick_bound(cm, c, buckets, forced_recompute_s(cc, 5), stage_time_floor(cc, 5)) <= best.step_time_s


def test_quick_bound_holds_when_no_bucket_fits() -> None:
    model = tiny_model(layers=2, hidden=64, heads=2, vocab=1000, activation="gelu")
    cm = CostModel(model, load_hardware("h100-sxm"), JobSpec(global_batch=4, seq_len=128))
    c = Candidate(tp=1, pp=1, dp=4, cp=1, mbs=1, num_microbatches=1, schedule="1f1b", vpp=1, base="none",
                  full_min=0, full_max=0, zero=0, sp=False, vocab="balanced")
    buckets = (10_000_000,)
    best = candidate_optimum(cm, c, SearchSpace(buckets=buckets), 4).best
    assert quick_bound(cm, c, buckets) <= best.step_time_s


def test_fluid_sync_by_hand() -> None:
    """The fluid sync term of a stage (bytes/B * c less its whole window) and the slack of the stages before it
    (their whole windows), from the stage windows at the given chunk counts rather than per-layer slopes."""
    model = tiny_model(layers=4, hidden=256, heads=4, vocab=1000, activation="gelu")
    cm = CostModel(model, load_hardware("h100-sxm"), JobSpec(global_batch=8, seq_len=256))
    c = Candidate(tp=1, pp=2, dp=4, cp=1, mbs=1, num_microbatches=2, schedule="1f1b", vpp=1, base="none",
                  full_min=0, full_max=0, zero=1, sp=False, vocab="ends")
    buckets = (100_000, 1_000_000)
    cc = candidate_costs(cm, c, buckets)
    assert {sync.window for sync in cc.syncs} == {"bwd", "fwd"}
    n, used = np.array([1, 2, 3]), np.array([0, 1, 2])
    for sync, b in itertools.product(cc.syncs, range(len(buckets))):
        fixed = {"bwd": window_s(cc, 0, 0, "bwd"), "fwd": window_s(cc, 0, 0, "fwd")}  # rank 0's layer-free part
        own, slack = fluid_syncs(cc, 1, sync, n, used, fixed)
        own = own[b]
        for j, nj in enumerate(n):
            params = nj * cc.layer.params + cc.stages[1].vocab_params
            hand = params * sync.per_bucket[b] / buckets[b] - window_s(cc, 1, int(nj), sync.window)
            assert own[j] == pytest.approx(hand, rel=1e-12, abs=1e-15)
        for u, nu in enumerate(used):  # rank 0 holding the used chunks
            hand = window_s(cc, 0, int(nu), sync.window)
            assert slack[u] == pytest.approx(hand, rel=1e-12, abs=1e-15)


def test_idle_gpus_let_a_pin_leave_gpus_unused() -> None:
    """With --allow-idle a degree need not divide the GPU count (found in review: the search returned pp 5 on
    12 GPUs, which --pp 5 then refused); one beyond it is still refused."""
    from autotune.errors import SpecError
    from autotune.search.pins import check_space

    inst = Instance(tiny_model(layers=8, hidden=256, heads=8), load_hardware("h100-sxm"),
                    JobSpec(global_batch=8, seq_len=1024), 12)
    space = SearchSpace(allow_idle=True, tp=(1,), cp=(1,), pp=(5,))
    check_space(space, inst.model, inst.job, inst.gpus, 8)
    assert {(c.pp, c.dp) for c in inst.candidates(space)} == {(5, 1), (5, 2)}
    with pytest.raises(SpecError, match="--pp 13 exceeds --gpus 12"):
        check_space(replace(space, pp=(13,)), inst.model, inst.job, inst.gpus, 8)
    with pytest.raises(SpecError, match="--pp 5 does not divide --gpus 12"):
        check_space(replace(space, allow_idle=False), inst.model, inst.job, inst.gpus, 8)
