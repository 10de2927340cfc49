"""The coarse bound: the first bound of every candidate, from per-layer costs alone (issue 13).

The planner bounds every candidate of the space before visiting any (hundreds of thousands for an MoE model),
so `coarse_bounds` computes them for a whole list at once: the per-layer terms once per distinct layer shape,
the arithmetic over numpy arrays. Every bound is `coarse_bound`'s to the bit (the same IEEE operations in the
same order; the one power is taken by Python's own `**`), which tests/search/test_coarse.py checks.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

from autotune.costmodel.epoverlap import pairing
from autotune.costmodel.estimate import ADAM_STEP_BYTES, CostModel
from autotune.costmodel.schedules import pipeline_lower_bound
from autotune.costmodel.state import dense_first_credit, layer_state_bytes
from autotune.search.bounds import vocab_path_share
from autotune.search.experts import expert_dp
from autotune.search.space import Candidate


def coarse_bound(cm: CostModel, c: Candidate, memo: dict) -> tuple[float, bool]:
    """(A step time no partition of c can beat, whether c may fit), from cached per-layer costs alone.

    quick_bound without the terms that need the stages: every layer at the cheapest recomputation c allows,
    no vocabulary, point-to-point or sync time; the stage with the most chunks (at least ceil(chunks/p)) sets
    t_max, the pipeline bound follows (schedules.pipeline_lower_bound), and the optimizer step of the largest
    stage updates at least the average stage's layers. c cannot fit when that fullest stage cannot hold its
    layers' weights, gradients and optimizer states and one micro-batch of their activations at the most
    recomputation allowed. `memo` (one dict per search) keeps the per-layer terms."""
    shape = (c.tp, c.cp, c.mbs, c.sp, c.tp_mode, c.tp_overlap, c.ep, c.etp, pairing(c))
    (per_layer, act, share) = _timing(cm, ("time", *shape, c.base, c.full_max > 0), memo)
    (state, adam, credit) = _sharded(cm, ("state", c.tp, c.tp_mode, c.ep, c.etp, c.cp, c.dp, c.zero), shape, memo)
    L = cm.model.num_layers
    fullest = -(-(L // c.vpp) // c.pp)  # chunks on the stage with the most
    fits = fullest * (c.vpp * state + act) - credit <= cm.hw.usable_memory_bytes
    work = L * per_layer
    t_max = max(work / c.pp, c.vpp * fullest * per_layer)
    pipe = pipeline_lower_bound(c.schedule, c.num_microbatches, c.vpp, c.pp, t_max, 0.0, work, share)
    return pipe + adam * L / c.pp, fits


def coarse_bounds(cm: CostModel, cands: list[Candidate], memo: dict) -> list[tuple[float, bool]]:
    """coarse_bound of every candidate, to the bit, computed over arrays."""
    if not cands:
        return []
    (per_layer, share, act, state, adam, credit, pp_a, vpp_a, m_a) = _arrays(cm, cands, memo)
    schedule, m, pp = [c.schedule for c in cands], [c.num_microbatches for c in cands], [c.pp for c in cands]
    L = cm.model.num_layers
    fullest, floor = _fullest_and_floor(L, act, state, credit, pp_a, vpp_a)
    fits = floor <= cm.hw.usable_memory_bytes
    work = L * per_layer
    t_max = np.maximum(work / pp_a, (vpp_a * fullest) * per_layer)
    bound = m_a * t_max
    kind = np.array([_KINDS.get(s, 0) for s in schedule], dtype=np.int8)
    r = np.where(kind == _KINDS["interleaved"], 1 / vpp_a, np.where(kind == _KINDS["zb-h1"], share, 1.0))
    tail = np.array([1 - (1 - ri / mi) ** pi for ri, mi, pi in zip(r.tolist(), m, pp)], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # v-half and pp 1 take `bound` alone below
        paths = np.maximum(np.maximum(bound, (m_a - r) * 0.0 + r * work), r * work / tail)
    pipe = np.where((kind == _KINDS["v-half"]) | (pp_a == 1), bound, paths)
    total = pipe + adam * L / pp_a
    return list(zip(total.tolist(), fits.tolist()))


def coarse_memory(cm: CostModel, cands: list[Candidate], memo: dict) -> list[int]:
    """Per candidate, bytes its fullest stage needs at least whatever the partition (coarse_bound's memory
    check: its layers' weights, gradients and optimizer states and one micro-batch of their activations at
    the most recomputation allowed). A partition gives each stage whole chunks, so its fullest stage holds at
    least vpp x ceil((L / vpp) / pp) layers (a pinned split whose stages vpp does not divide is no plan)."""
    if not cands:
        return []
    (_, _, act, state, _, credit, pp_a, vpp_a, _) = _arrays(cm, cands, memo)
    return _fullest_and_floor(cm.model.num_layers, act, state, credit, pp_a, vpp_a)[1].tolist()


def _fullest_and_floor(L: int, act: np.ndarray, state: np.ndarray, credit: np.ndarray, pp_a: np.ndarray,
                       vpp_a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chunks on the stage with the most, and the bytes that stage needs at least (coarse_bound's check)."""
    fullest = -(-(L // vpp_a) // pp_a)
    return fullest, fullest * (vpp_a * state + act) - credit


def _arrays(cm: CostModel, cands: list[Candidate], memo: dict) -> tuple[np.ndarray, ...]:
    """The per-candidate terms of coarse_bound as arrays: per-layer time, pivot share, activation, state,
    Adam and dense-first credit, then pp, vpp and micro-batches."""
    (tp, pp, dp, cp, mbs, m, schedule, vpp, base, _, full_max, zero, sp, _, mode, overlap, ep, etp, _) = zip(*cands)
    epo = [pairing(c) if c.ep_overlap else 0.0 for c in cands]  # the share of passes paired (0.0: no overlap)
    may_full = [f > 0 for f in full_max]
    time_keys = list(zip(repeat("time"), tp, cp, mbs, sp, mode, overlap, ep, etp, epo, base, may_full))
    state_keys = list(zip(repeat("state"), tp, mode, ep, etp, cp, dp, zero))
    # each distinct key's terms once, then spread to the candidates by the key's number (one dict lookup each)
    numbers: dict = {}
    time_ids = np.array([numbers.setdefault(k, len(numbers)) for k in time_keys])
    timing = [_timing(cm, key, memo) for key in numbers]
    shapes = dict(zip(state_keys, zip(tp, cp, mbs, sp, mode, overlap, ep, etp, epo)))  # a layer shape of each key
    sharded = [_sharded(cm, key, shape, memo) for key, shape in shapes.items()]
    numbers = {key: i for i, key in enumerate(shapes)}
    state_ids = np.array([numbers[k] for k in state_keys])
    per_layer, share = (np.array([t[i] for t in timing], dtype=np.float64)[time_ids] for i in (0, 2))
    act = np.array([t[1] for t in timing], dtype=np.int64)[time_ids]
    state = np.array([x[0] for x in sharded], dtype=np.int64)[state_ids]
    adam = np.array([x[1] for x in sharded], dtype=np.float64)[state_ids]
    credit = np.array([x[2] for x in sharded], dtype=np.int64)[state_ids]
    pp_a, vpp_a, m_a = (np.array(x, dtype=np.int64) for x in (pp, vpp, m))
    return per_layer, share, act, state, adam, credit, pp_a, vpp_a, m_a


#: Schedules whose pipeline bound differs (schedules.pipeline_lower_bound); the rest are 1F1B-like (0).
_KINDS = {"interleaved": 1, "zb-h1": 2, "v-half": 3}


def _timing(cm: CostModel, key: tuple, memo: dict) -> tuple[float, int, float]:
    """Per layer of the candidates sharing `key`: time at the base recomputation, the fewest activation bytes
    allowed, and the pivot path's share (as in quick_bound)."""
    if (value := memo.get(key)) is None:
        _, tp, cp, mbs, sp, mode, overlap, ep, etp, epo, base, may_full = key
        layer = cm.layer(tp, cp, mbs, sp, mode, overlap, ep, etp, epo)
        act = min(layer.act.full, layer.act.get(base)) if may_full else layer.act.get(base)
        share = min(layer.fwd.seconds / layer.time("full") if layer.time("full") > 0 else 0.0, 0.5,
                    vocab_path_share(cm.vocab(tp, cp, mbs, sp, mode, overlap, ep, etp, base)))
        memo[key] = value = (layer.time(base), act, share)  # full_min > 0: only some layers in full
    return value


def _sharded(cm: CostModel, key: tuple, shape: tuple, memo: dict) -> tuple[int, float, int]:
    """Per layer of the candidates sharing `key`: weights, gradients and optimizer bytes; the Adam step's time;
    and the most bytes the dense-first layers take off a stage (state.dense_first_credit, all of them on one).
    A layer's parameters depend on its tensor-parallel mode and degree and its expert layout only, so `key`
    leaves out the rest of the layer `shape` (any shape of the key gives the same bytes)."""
    if (value := memo.get(key)) is None:
        _, tp, _, ep, etp, cp, dp, zero = key
        layer = cm.layer(*shape)
        shards = dp * cp
        edp = expert_dp(tp, cp, dp, ep, etp)
        state = sum(layer_state_bytes(layer, zero, shards, edp, cm.state_bytes))
        dense = cm.dense_first(key[2])
        credit = max(0, dense * sum(dense_first_credit(layer, zero, shards, edp, cm.state_bytes))) if dense else 0
        adam = layer.params * ADAM_STEP_BYTES / (shards if zero >= 1 else 1) / (cm.hw.hbm_bandwidth
                                                                               * cm.hw.efficiency.memory)
        memo[key] = value = (state, adam, credit)
    return value
