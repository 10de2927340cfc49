"""Pipeline step time and in-flight micro-batches, pinned to hand timelines and Narayanan/Korthikanti."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.costmodel import memory, schedules


def simulate_1f1b(fwd: list[float], bwd: list[float], m: int) -> float:
    """Event simulation of non-interleaved 1F1B (PipeDream-Flush; Megatron-LM's schedules.py): stage i runs
    min(p-i-1, m) warm-up forwards, then alternates one forward and one backward, then drains backwards.
    F(i, k) needs F(i-1, k) done; B(i, k) needs B(i+1, k) done (the last stage's needs its own F)."""
    p = len(fwd)
    orders = []
    for i in range(p):
        warm = min(p - i - 1, m)
        order = [("F", k) for k in range(warm)]
        for k in range(m - warm):
            order += [("F", warm + k), ("B", k)]
        order += [("B", k) for k in range(m - warm, m)]
        orders.append(order)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    while any(pos[i] < len(orders[i]) for i in range(p)):
        progressed = False
        for i in range(p):
            if pos[i] == len(orders[i]):
                continue
            kind, k = orders[i][pos[i]]
            dep = ("F", i - 1, k) if kind == "F" else (("B", i + 1, k) if i < p - 1 else ("F", i, k))
            if kind == "F" and i == 0:
                ready = 0.0
            elif dep in done:
                ready = done[dep]
            else:
                continue
            start = max(free[i], ready)
            free[i] = done[(kind, i, k)] = start + (fwd[i] if kind == "F" else bwd[i])
            pos[i] += 1
            progressed = True
        assert progressed, "deadlock in the 1F1B order"
    return max(free)


def test_two_stage_1f1b_by_hand():
    """p = 2, m = 4, every stage f = 1, b = 2 (t = 3). Hand timeline (F/B micro-batch, [start, end)):

        stage 0: F1[0,1] F2[1,2] .. B1[4,6] F3[6,7] B2[7,9] F4[9,10] B3[10,12] .. B4[13,15]
        stage 1: .. F1[1,2] B1[2,4] F2[4,5] B2[5,7] F3[7,8] B3[8,10] F4[10,11] B4[11,13]

    The step ends at 15 = (m + p - 1) * t (Narayanan et al. 2021, Sec. 2.2.1: bubble (p-1)*t)."""
    assert simulate_1f1b([1, 1], [2, 2], 4) == 15
    assert schedules.pipeline_time([3, 3], 4) == pytest.approx(15)
    assert schedules.bubble_time([3, 3], 4) == pytest.approx(3)


def test_two_stage_1f1b_unequal_by_hand():
    """p = 2, m = 4, stage 0 f=1 b=2 (t0 = 3), stage 1 f=2 b=4 (t1 = 6). Hand timeline:

        stage 0: F1[0,1] F2[1,2] ......... B1[7,9] F3[9,10] .. B2[13,15] F4[15,16] .. B3[19,21] .. B4[25,27]
        stage 1: .. F1[1,3] B1[3,7] F2[7,9] B2[9,13] F3[13,15] B3[15,19] F4[19,21] B4[21,25]

    The step ends at 27 = (m-1)*max(t) + sum(t) = 3*6 + 9 (the form Alpa and PipeDream use)."""
    assert simulate_1f1b([1, 2], [2, 4], 4) == 27
    assert schedules.pipeline_time([3, 6], 4) == pytest.approx(27)


@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), f=st.floats(0.1, 5), ratio=st.floats(1.0, 3.0))
def test_equal_stages_match_the_simulated_1f1b(p, m, f, ratio):
    """Equal stages: T = (m + p - 1) * t for any p and m, the simulation and the closed form agree."""
    b = f * ratio
    sim = simulate_1f1b([f] * p, [b] * p, m)
    assert sim == pytest.approx((m + p - 1) * (f + b))
    assert schedules.pipeline_time([f + b] * p, m) == pytest.approx(sim)


@settings(max_examples=150, deadline=None)
@given(m=st.integers(1, 12), f=st.lists(st.floats(0.1, 5), min_size=2, max_size=6), ratio=st.floats(1.0, 3.0),
       extra=st.floats(1.0, 2.0))
def test_closed_form_is_exact_when_the_last_stage_is_slowest(m, f, ratio, extra):
    """With the slowest stage last (the LM-head stage, the usual case) the closed form equals the simulated
    1F1B timeline for any p, m and stage times."""
    f = f[:-1] + [max(f) * extra]
    b = [x * ratio for x in f]
    sim = simulate_1f1b(f, b, m)
    assert schedules.pipeline_time([x + y for x, y in zip(f, b)], m) == pytest.approx(sim)


@settings(max_examples=150, deadline=None)
@given(m=st.integers(1, 12), f=st.lists(st.floats(0.1, 5), min_size=2, max_size=6), ratio=st.floats(1.0, 3.0))
def test_closed_form_never_underestimates_1f1b(m, f, ratio):
    """Otherwise it is an upper bound: a slow early stage runs its warm-up forwards back to back, which the
    (m-1)*max + sum form does not credit."""
    b = [x * ratio for x in f]
    sim = simulate_1f1b(f, b, m)
    assert schedules.pipeline_time([x + y for x, y in zip(f, b)], m) >= sim * (1 - 1e-12)


def test_closed_form_overestimates_a_slow_first_stage():
    """p = 2, m = 2, stage 0 f=b=2, stage 1 f=b=1: stage 0 runs F1[0,2] F2[2,4] B1[4,6] B2[6,8]; stage 1 runs
    F1[2,3] B1[3,4] F2[4,5] B2[5,6]: the step takes 8, the closed form says (m-1)*4 + 6 = 10."""
    assert simulate_1f1b([2, 1], [2, 1], 2) == 8
    assert schedules.pipeline_time([4, 2], 2) == pytest.approx(10)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (8, 4, 16), (4, 3, 12)])
def test_interleaved_equal_stages(p, v, m):
    """Narayanan et al. 2021, Sec. 2.2.2: with v chunks per rank the bubble shrinks to (p-1)/v of a
    micro-batch's time: T = (m + (p-1)/v) * t."""
    t = 2.5
    assert schedules.pipeline_time([t] * p, m, v) == pytest.approx((m + (p - 1) / v) * t)
    assert schedules.bubble_time([t] * p, m, v) == pytest.approx((p - 1) / v * t)


def test_single_stage_has_no_bubble():
    assert schedules.pipeline_time([4.0], 7) == pytest.approx(28.0)
    assert schedules.bubble_time([4.0], 7) == 0.0


# ------------------------------------------------------------------------------ micro-batches in flight
@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_1f1b_stage_i_holds_p_minus_i(p):
    """Narayanan et al. 2021, Sec. 2.2.1: under 1F1B stage i stashes at most p - i micro-batches
    (fewer when there are fewer micro-batches)."""
    for i in range(p):
        assert memory.in_flight_1f1b(i, p, 64) == p - i
        assert memory.in_flight_1f1b(i, p, 1) == 1
        assert schedules.activation_multiplier("1f1b", i, p, 1, 64) == (p - i, 1)


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 4), (8, 3)])
def test_interleaved_rank_0_holds_p_times_1_plus_p_minus_1_over_pv(p, v):
    """Korthikanti et al. 2022, Sec. 4.2.3: interleaving makes the first rank hold p*(1 + (p-1)/(p*v)) stages'
    worth of activations; in chunks, Megatron-LM's warm-up 2*(p-1) + (v-1)*p plus one: p*v + p - 1."""
    chunks = memory.in_flight_chunks_interleaved(0, p, v, 1000)
    assert chunks == p * v + p - 1
    assert chunks / v == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert schedules.activation_multiplier("interleaved", 0, p, v, 1000) == (chunks, v)
    # later ranks warm up two chunks fewer each
    for i in range(p):
        assert memory.in_flight_chunks_interleaved(i, p, v, 1000) == 2 * (p - i - 1) + (v - 1) * p + 1
