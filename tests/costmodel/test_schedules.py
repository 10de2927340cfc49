"""Pipeline schedules: the exact timing of pipeline.py against an independent event simulation, hand
timelines, the papers' closed forms for equal stages, and the activations each schedule holds."""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.costmodel import critical, passids, pipeline, schedules, wavefront
from autotune.specs.job import JobSpec


# ------------------------------------------------------------------------ an independent event simulator
def order_from_definition(schedule: str, rank: int, pp: int, v: int, m: int,
                          ticks=pipeline.UNIT_TICKS) -> list[tuple[str, int, int]]:
    """Each schedule's per-rank order written from its paper/Megatron description, not from pipeline.py
    (v-half's order is built by a greedy rule, so for it the package's order is the definition)."""
    if schedule == "v-half":
        return [(op.kind, op.chunk, op.microbatch) for op in pipeline.rank_orders("v-half", pp, 2, m, ticks)[rank]]
    if schedule == "interleaved":  # Megatron-LM schedules.py: forward_backward_pipelining_with_interleaving
        total = m * v
        warm = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
        fwd = [("F", (k // pp) % v, (k // (pp * v)) * pp + k % pp) for k in range(total)]
        bwd = [("B", v - 1 - (k // pp) % v, (k // (pp * v)) * pp + k % pp) for k in range(total)]
        order = fwd[:warm]
        for k in range(total):
            if warm + k < total:
                order.append(fwd[warm + k])
            order.append(bwd[k])
        return order
    warm = min(pp - rank - 1, m)
    order = [("F", 0, k) for k in range(warm)]
    pending_w = []
    for k in range(m):
        if warm + k < m:
            order.append(("F", 0, warm + k))
        order.append(("B", 0, k))
        if schedule == "zb-h1":  # Qi et al. 2024: rank i keeps i weight gradients pending
            pending_w.append(k)
            if len(pending_w) > rank:
                order.append(("W", 0, pending_w.pop(0)))
    return order + [("W", 0, k) for k in pending_w]


def event_simulation(schedule: str, pp: int, v: int, m: int, dur, ticks=pipeline.UNIT_TICKS) -> float:
    """A discrete-event simulation with an event queue: a rank starts its next pass when it is idle and the
    pass's input has arrived; completion events release dependants. dur[rank][chunk] = (F, B, W)."""
    split = schedule in ("zb-h1", "v-half")
    stages = pp * (2 if schedule == "v-half" else v)

    def vstage(rank, chunk):
        if schedule == "v-half":
            return rank if chunk == 0 else 2 * pp - 1 - rank
        return chunk * pp + rank

    orders = [order_from_definition(schedule, r, pp, v, m, ticks) for r in range(pp)]
    finished: dict[tuple[str, int, int], float] = {}
    pos, idle_at, now = [0] * pp, [0.0] * pp, 0.0
    events: list[float] = [0.0]
    while events:
        now = heapq.heappop(events)
        for r in range(pp):
            while pos[r] < len(orders[r]) and idle_at[r] <= now:
                kind, chunk, mb = orders[r][pos[r]]
                s = vstage(r, chunk)
                need = (("F", s - 1, mb) if s > 0 else None) if kind == "F" else \
                    ((("B", s + 1, mb) if s < stages - 1 else ("F", s, mb)) if kind == "B" else ("B", s, mb))
                if need is not None and (need not in finished or finished[need] > now):
                    break
                f, b, w = dur[r][chunk]
                length = f if kind == "F" else (w if kind == "W" else (b if split else b + w))
                idle_at[r] = now + length
                finished[(kind, s, mb)] = idle_at[r]
                heapq.heappush(events, idle_at[r])
                pos[r] += 1
                break
    assert all(pos[r] == len(orders[r]) for r in range(pp)), "deadlock"
    return max(finished.values())


def random_durations(rng: random.Random, pp: int, chunks: int):
    return tuple(tuple((rng.uniform(0.2, 3), rng.uniform(0.2, 4), rng.uniform(0.1, 2)) for _ in range(chunks))
                 for _ in range(pp))


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "interleaved", "v-half"])
def test_step_time_equals_the_event_simulation_on_random_stage_times(schedule):
    rng = random.Random(sum(map(ord, schedule)))
    for _ in range(60):
        pp = rng.randint(2, 6)
        v = {"interleaved": rng.randint(2, 3), "v-half": 2}.get(schedule, 1)
        m = pp * rng.randint(1, 4) if schedule == "interleaved" else rng.randint(1, 3 * pp)
        dur = random_durations(rng, pp, v)
        ticks = pipeline.pass_ticks(dur)
        want = event_simulation(schedule, pp, v, m, dur, ticks)
        assert pipeline.makespan(schedule, pp, v, m, dur, ticks) == pytest.approx(want, rel=1e-12)
        timeline = pipeline.simulate(schedule, pp, v, m, dur, ticks)
        assert timeline.makespan == pytest.approx(want, rel=1e-12)
        length, counts = critical.critical_path(schedule, pp, v, m, dur, ticks)
        assert length == pytest.approx(want, rel=1e-12)
        split = schedule in pipeline.SPLIT_BACKWARD
        path = sum(n * (dur[r][c][0] if k == "F" else dur[r][c][2] if k == "W" else
                        dur[r][c][1] + (0 if split else dur[r][c][2])) for (r, c, k), n in counts.items())
        assert path == pytest.approx(want, rel=1e-9)  # the critical path's passes add up to the step


def test_orders_match_their_definitions():
    for schedule, v in (("1f1b", 1), ("zb-h1", 1), ("interleaved", 2), ("interleaved", 3)):
        for pp, m in ((2, 4), (4, 8), (4, 12), (3, 2)):
            if schedule == "interleaved" and m % pp:
                continue
            got = pipeline.rank_orders(schedule, pp, v, m)
            for r in range(pp):
                assert [(o.kind, o.chunk, o.microbatch) for o in got[r]] == \
                    order_from_definition(schedule, r, pp, v, m), (schedule, pp, m, r)


# ------------------------------------------------------------------------------ hand-built timelines
def _equal(pp, chunks, f, b, w=0.0):
    return tuple(tuple((f / chunks, b / chunks, w / chunks) for _ in range(chunks)) for _ in range(pp))


def test_two_stage_1f1b_by_hand():
    """p = 2, m = 4, every stage f = 1, b = 2 (t = 3). Hand timeline (F/B micro-batch, [start, end)):

        stage 0: F1[0,1] F2[1,2] .. B1[4,6] F3[6,7] B2[7,9] F4[9,10] B3[10,12] .. B4[13,15]
        stage 1: .. F1[1,2] B1[2,4] F2[4,5] B2[5,7] F3[7,8] B3[8,10] F4[10,11] B4[11,13]

    The step ends at 15 = (m + p - 1) * t (Narayanan et al. 2021, Sec. 2.2.1: bubble (p-1)*t)."""
    tl = pipeline.simulate("1f1b", 2, 1, 4, _equal(2, 1, 1, 2))
    assert tl.makespan == 15
    stage0 = [(i.op.kind, i.op.microbatch + 1, i.start, i.end) for i in tl.intervals if i.rank == 0]
    assert sorted(stage0, key=lambda x: x[2]) == [("F", 1, 0, 1), ("F", 2, 1, 2), ("B", 1, 4, 6), ("F", 3, 6, 7),
                                                   ("B", 2, 7, 9), ("F", 4, 9, 10), ("B", 3, 10, 12),
                                                   ("B", 4, 13, 15)]


def test_two_stage_1f1b_unequal_by_hand():
    """p = 2, m = 4, stage 0 f=1 b=2, stage 1 f=2 b=4. Hand timeline:

        stage 0: F1[0,1] F2[1,2] ......... B1[7,9] F3[9,10] .. B2[13,15] F4[15,16] .. B3[19,21] .. B4[25,27]
        stage 1: .. F1[1,3] B1[3,7] F2[7,9] B2[9,13] F3[13,15] B3[15,19] F4[19,21] B4[21,25]

    The step ends at 27 = (m-1)*max(t) + sum(t) = 3*6 + 9."""
    assert pipeline.makespan("1f1b", 2, 1, 4, (((1, 2, 0),), ((2, 4, 0),))) == 27


def test_a_slow_first_stage_by_hand():
    """p = 2, m = 2, stage 0 f=b=2, stage 1 f=b=1: stage 0 runs F1[0,2] F2[2,4] B1[4,6] B2[6,8]; stage 1 runs
    F1[2,3] B1[3,4] F2[4,5] B2[5,6]: the step takes 8 (the textbook (m-1)*max + sum form would say 10)."""
    assert pipeline.makespan("1f1b", 2, 1, 2, (((2, 2, 0),), ((1, 1, 0),))) == 8


def test_zb_h1_two_stages_by_hand():
    """p = 2, m = 2, F = B = W = 1. Rank 1 keeps one W pending; rank 0 none:

        rank 0: F1[0,1] F2[1,2] .. B1[3,4] W1[4,5] B2[5,6] W2[6,7]
        rank 1: .. F1[1,2] B1[2,3] F2[3,4] B2[4,5] W1[5,6] W2[6,7]

    7 = m*(F+B+W) + (p-1)*(F+B-W) (Qi et al. 2024); 1F1B would take (m+p-1)*3 = 9."""
    tl = pipeline.simulate("zb-h1", 2, 1, 2, _equal(2, 1, 1, 1, 1))
    rank1 = sorted(((i.op.kind, i.op.microbatch + 1, i.start) for i in tl.intervals if i.rank == 1),
                   key=lambda x: x[2])
    assert rank1 == [("F", 1, 1), ("B", 1, 2), ("F", 2, 3), ("B", 2, 4), ("W", 1, 5), ("W", 2, 6)]
    assert tl.makespan == 7
    assert pipeline.makespan("1f1b", 2, 1, 2, _equal(2, 1, 1, 1, 1)) == 9


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), mult=st.integers(1, 4), f=st.floats(0.1, 5), rb=st.floats(0.5, 2.0),
       rw=st.floats(0.2, 1.0))
def test_equal_stages_match_the_closed_forms(p, mult, f, rb, rw):
    """Narayanan et al. 2021 for 1F1B and interleaving; Qi et al. 2024 for ZB-H1 (whose form assumes W is no
    longer than F or B, as in a Transformer layer)."""
    m = p * mult
    b = f * rb
    w = min(f, b) * rw
    for schedule, v in (("1f1b", 1), ("interleaved", 2), ("interleaved", 3), ("zb-h1", 1)):
        if schedule != "1f1b" and p < 2:
            continue
        want = schedules.equal_stage_time(schedule, p, v, m, f, b, w)
        assert pipeline.makespan(schedule, p, v, m, _equal(p, v, f, b, w)) == pytest.approx(want, rel=1e-9)


def test_zb_h1_and_v_half_shrink_the_bubble_of_equal_stages():
    """F = B = W: 1F1B idles (p-1)*3 per step, ZB-H1 (p-1)*1; v-half, built to half the memory, still
    beats 1F1B."""
    p, m = 8, 64
    ideal = m * 3.0
    one_f = pipeline.makespan("1f1b", p, 1, m, _equal(p, 1, 1, 1, 1)) - ideal
    zb = pipeline.makespan("zb-h1", p, 1, m, _equal(p, 1, 1, 1, 1)) - ideal
    vh = pipeline.makespan("v-half", p, 2, m, _equal(p, 2, 1, 1, 1)) - ideal
    assert (one_f, zb) == (21.0, 7.0)
    assert vh < one_f


# ------------------------------------------------------------------------------ activations in flight
@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_1f1b_rank_i_holds_p_minus_i(p):
    """Narayanan et al. 2021, Sec. 2.2.1: under 1F1B stage i stashes at most p - i micro-batches."""
    assert pipeline.peak_in_flight("1f1b", p, 1, 64) == tuple(p - i for i in range(p))
    assert pipeline.peak_in_flight("1f1b", p, 1, 1) == (1,) * p


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 4), (8, 3)])
def test_interleaved_rank_0_holds_p_times_1_plus_p_minus_1_over_pv(p, v):
    """Korthikanti et al. 2022, Sec. 4.2.3: interleaving makes the first rank hold p*(1 + (p-1)/(p*v)) stages'
    worth; in chunks, Megatron's warm-up 2*(p-i-1) + (v-1)*p plus one."""
    got = pipeline.peak_in_flight("interleaved", p, v, 8 * p)
    assert got[0] / v == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert got == tuple(2 * (p - i - 1) + (v - 1) * p + 1 for i in range(p))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zb_h1_holds_1f1b_peak_on_every_rank(p):
    """ZB-H1 keeps rank i's i pending weight gradients' activations: p on every rank, 1F1B's peak."""
    assert pipeline.peak_in_flight("zb-h1", p, 1, 4 * p) == (p,) * p


def test_peak_closed_forms_count_the_orders():
    """The closed forms peak_in_flight takes for the fixed orders are the counts along the orders themselves."""
    for p, m in itertools.product(range(1, 13), list(range(1, 30)) + [64, 96]):
        for schedule, v in (("1f1b", 1), ("zb-h1", 1), *(("interleaved", v) for v in range(2, 5) if m % p == 0)):
            assert pipeline.peak_in_flight(schedule, p, v, m) == pipeline._counted_peaks(schedule, p, v, m,
                                                                                        pipeline.UNIT_TICKS)


def test_fixed_pass_ids_number_the_orders_themselves():
    """The pass ids makespan builds from the fixed orders' rules are those of the orders' own Pass objects."""
    for p, m in itertools.product(range(1, 10), list(range(1, 20)) + [32, 48]):
        for schedule, v in (("1f1b", 1), ("zb-h1", 1), *(("interleaved", v) for v in range(2, 5) if m % p == 0)):
            want = passids.pass_ids(schedule, p, v, m, pipeline.rank_orders(schedule, p, v, m))
            got = passids.fixed_pass_ids(schedule, p, v, m)
            for name in ("own", "need", "rank", "slot", "starts"):
                assert getattr(got, name).tolist() == getattr(want, name).tolist(), (schedule, p, v, m, name)
            assert got.none == want.none


def test_closed_depths_are_the_walked_depths_or_refused():
    """wavefront.closed_depths is each pass's depth for 1F1B (any m) and ZB-H1 (m >= p); where it is not (ZB-H1
    with fewer micro-batches than ranks), wavefronts' check refuses it and walks the order instead."""
    for p, m in itertools.product(range(1, 14), list(range(1, 30)) + [64, 96]):
        for schedule in ("1f1b", "zb-h1"):
            ids = passids.fixed_pass_ids(schedule, p, 1, m)
            guess, walked = wavefront.closed_depths(schedule, ids, p, m), wavefront._walked_depths(ids)
            exact = guess.tolist() == walked.tolist()
            assert exact or (schedule == "zb-h1" and m < p), (schedule, p, m)
            assert wavefront._is_depth(ids, guess) == exact
            guess[len(guess) // 2] += 1
            assert not wavefront._is_depth(ids, guess)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_v_half_halves_and_balances_activation_memory(p):
    """V-Half: every rank holds at most p+2 chunks (p/2 + 1 micro-batches of a whole rank's layers, half
    of 1F1B's p on rank 0), about the same on every rank."""
    for ticks in ((1, 1, 1), (4, 6, 3), (4, 8, 4)):
        got = pipeline.peak_in_flight("v-half", p, 2, 4 * p, ticks)
        assert max(got) <= pipeline.v_half_cap(p) == p + 2
        assert max(got) - min(got) <= 1


# ------------------------------------------------------------------------------ the planner's bound
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_lower_bound_never_exceeds_the_simulated_time(data):
    schedule = data.draw(st.sampled_from(["1f1b", "interleaved", "zb-h1", "v-half"]))
    p = data.draw(st.integers(2, 6))
    v = {"interleaved": data.draw(st.integers(2, 3)), "v-half": 2}.get(schedule, 1)
    m = p * data.draw(st.integers(1, 3))
    # as stages.chunk_durations builds them: a rank's layers split evenly over its chunks, the embedding's
    # extra on the first chunk of rank 0, the head's on the last chunk of the rank that holds it
    x = st.floats(0.05, 3)
    base = [[data.draw(x) / v for _ in range(3)] for _ in range(p)]
    table = [[list(base[r]) for _ in range(v)] for r in range(p)]
    head_rank = 0 if schedule == "v-half" else p - 1
    for rank, chunk in ((0, 0), (head_rank, v - 1)):
        table[rank][chunk] = [a + data.draw(x) for a in table[rank][chunk]]
    dur = tuple(tuple(tuple(c) for c in row) for row in table)
    t = [sum(map(sum, row)) for row in dur]
    got = pipeline.makespan(schedule, p, v, m, dur)
    share = min(f / (f + b + w) for row in dur for f, b, w in row)  # ZB-H1's drain may end in W passes
    bound = schedules.pipeline_lower_bound(schedule, m, v, p, max(t), t[-1], sum(t), share)
    assert bound <= got * (1 + 1e-9)


def test_single_stage_has_no_bubble():
    assert pipeline.makespan("1f1b", 1, 1, 7, (((1.5, 2.5, 0.0),),)) == pytest.approx(28.0)


def _critical_path_pass_by_pass(schedule, pp, v, m, durations, ticks):
    """The plain reading of critical_path: each pass starts after the later of the pass before it on its rank
    and the pass it depends on (that one only when it ends strictly later), the path walked back from the
    first pass to end last."""
    g = pipeline._graph(schedule, pp, v, m, ticks)
    split = schedule in pipeline.SPLIT_BACKWARD
    end, came = [0.0] * len(g.ops), [-1] * len(g.ops)
    for k, op in enumerate(g.ops):
        p, d = g.prev[k], g.dep[k]
        start, came[k] = (end[p], p) if p >= 0 else (0.0, -1)
        if d >= 0 and end[d] > start:
            start, came[k] = end[d], d
        f, b, w = durations[g.ranks[k]][op.chunk]
        end[k] = start + {"F": f, "B": b if split else b + w, "W": w}[op.kind]
    k = max(range(len(end)), key=lambda i: (end[i], -i))
    total, counts = end[k], {}
    while k >= 0:
        key = (g.ranks[k], g.ops[k].chunk, g.ops[k].kind)
        counts[key] = counts.get(key, 0) + 1
        k = came[k]
    return total, counts


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "interleaved", "v-half"])
def test_critical_path_is_the_pass_by_pass_walk_to_the_last_bit(schedule):
    """Float durations and small integers (the planner's solver units, where ties are the rule): the same
    length to the bit and the same passes on the path."""
    rng = random.Random(7 + sum(map(ord, schedule)))
    for trial in range(80):
        pp = rng.randint(2, 6)
        v = {"interleaved": rng.randint(2, 3), "v-half": 2}.get(schedule, 1)
        m = pp * rng.randint(1, 4) if schedule == "interleaved" else rng.randint(1, 3 * pp)
        dur = random_durations(rng, pp, v)
        if trial % 2:
            dur = tuple(tuple(tuple(float(rng.randint(0, 3)) for _ in fbw) for fbw in row) for row in dur)
        ticks = pipeline._ticks(schedule, dur, None)
        want = _critical_path_pass_by_pass(schedule, pp, v, m, dur, ticks)
        got = critical.critical_path(schedule, pp, v, m, dur)
        assert got == want and repr(got[0]) == repr(want[0]), (schedule, pp, v, m, dur)


# ------------------------------------------------------------------------ pipeline sends the passes wait on
MEGATRON = JobSpec(global_batch=64, seq_len=4096)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 5, 16), (8, 5, 64), (2, 2, 2), (4, 2, 4), (16, 2, 32)])
def test_exposed_p2p_share_is_rank_zeros_warm_up_in_megatron_core(pp, vpp, m):
    """Megatron's interleaved schedule with overlap_p2p_comm waits only on its warm-up forwards' and cool-down
    backwards' sends: rank 0's warm-up count, read from megatron-core's own get_pp_rank_microbatches."""
    schedules_mc = pytest.importorskip("megatron.core.pipeline_parallel.schedules",
                                       reason="megatron-core is installed by `make trainers`")
    group = SimpleNamespace(size=lambda: pp, rank=lambda: 0)
    comm = SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp)
    total, _, warm, _ = schedules_mc.get_pp_rank_microbatches(m, vpp, pp, p2p_communicator=comm)
    assert total == m * vpp
    assert schedules.exposed_p2p_share(MEGATRON, "interleaved", pp, vpp, m) == pytest.approx(warm / total)


def test_exposed_p2p_share_by_hand():
    """pp 4, vpp 5, 16 micro-batches: rank 0 warms up 2*3 + 4*4 = 22 of its 80 forward passes."""
    assert schedules.exposed_p2p_share(MEGATRON, "interleaved", 4, 5, 16) == 22 / 80
    assert schedules.exposed_p2p_share(MEGATRON, "interleaved", 4, 2, 2) == 1.0  # all of it warm-up


@pytest.mark.parametrize(("job", "schedule", "vpp"), [
    (MEGATRON, "1f1b", 1),  # Megatron forces overlap_p2p_comm off without interleaving
    (replace(MEGATRON, overlap_p2p=False), "interleaved", 4),  # --no-overlap-p2p-communication
    (replace(MEGATRON, trainer="torchtitan"), "1f1b", 1),  # Schedule1F1B waits on each send and receive
    (replace(MEGATRON, trainer="deepspeed"), "1f1b", 1),
])
def test_every_send_is_waited_on_without_an_interleaved_overlap(job, schedule, vpp):
    assert schedules.exposed_p2p_share(job, schedule, 8, vpp, 64) == 1.0


def test_torchtitans_interleaved_schedule_is_charged_megatrons_warm_up_at_most():
    """torchtitan's Interleaved1F1B (torch's _PipelineScheduleRuntime) posts receives early and never waits on a
    send: Megatron's blocking warm-up share is an upper bound on what it waits for."""
    titan = replace(MEGATRON, trainer="torchtitan")
    assert schedules.exposed_p2p_share(titan, "interleaved", 8, 4, 64) == schedules.exposed_p2p_share(
        MEGATRON, "interleaved", 8, 4, 64) == (2 * 7 + 3 * 8) / (64 * 4)
