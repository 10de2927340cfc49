"""The constraint groups of the partition model (search/partition.py) beside the pipeline: every stage's memory,
the exposed data-parallel sync for the chosen gradient bucket and the optimizer step. Each is linear in the chunk
variables k_i and the recomputed layers rc_i, in the solver's integer time units (units.to_solver_time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.search.tables import CandidateCosts, window_s
from autotune.units import to_solver_time

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


def memory_constraints(model: cp_model.CpModel, cc: CandidateCosts, chunks, rc) -> None:
    """Weights, gradients, optimizer states, in-flight activations, vocabulary terms and the scratch of a
    fully recomputed layer fit in the usable memory of every stage."""
    v = cc.cand.vpp
    for i, k in enumerate(chunks):
        s = cc.stages[i]
        expr = k * (v * cc.layer_state + s.in_flight * cc.act_base) + s.memory
        if i == 0 and cc.dense_credit:  # the dense-first layers of rank 0's first chunk: min(k, D) of them
            dense = model.NewIntVar(0, cc.dense_first, f"dense{i}")
            model.AddMinEquality(dense, [k, cc.dense_first])
            expr -= cc.dense_credit * dense
        if cc.cand.full_max:
            expr += rc[i] * s.in_flight * (cc.act_full - cc.act_base)
            scratch = model.NewBoolVar(f"scratch{i}")
            model.Add(rc[i] <= cc.cand.full_max * scratch)
            expr += scratch * cc.act_none
        model.Add(expr <= cc.usable)


def dp_sync(model: cp_model.CpModel, cc: CandidateCosts, chunks, ranges, num_layers: int):
    """Exposed data-parallel sync, as estimate.dp_sync_exposed computes it: for the chosen bucket B and every
    stage i, minus the windows of the stages before it (slack_i), the last bucket (one bucket if the stage
    holds at least B, else its whole buffer) and the fluid term (bytes_i/B)*c - window_i. A sync run after the
    backward (Sync.whole) is the collective of each stage's whole buffer less its slack (estimate._unoverlapped)."""
    if not cc.syncs:
        return [], 0
    v, lp = cc.cand.vpp, cc.layer.params
    choice = [model.NewBoolVar(f"bucket{b}") for b in cc.buckets]
    model.AddExactlyOne(choice)
    total = 0
    all_params = num_layers * lp + sum(s.vocab_params for s in cc.stages)
    for sync in cc.syncs:
        # tight domains keep CP-SAT's propagation and LP relaxation effective
        hi = (to_solver_time(whole_buffer_s(sync, all_params)) + num_layers + 1 if sync.whole else  # + roundings
              max(to_solver_time(c * (all_params / bucket + 1)) for bucket, c in zip(cc.buckets, sync.per_bucket)))
        exposed = model.NewIntVar(0, hi, f"{sync.window}_exposed")
        per_layer_window = cc.layer_bwd_s if sync.window == "bwd" else cc.layer_fwd_s
        if sync.whole:  # the collective of each stage's whole buffer, whatever the bucket
            slack = 0
            for i, k in enumerate(chunks):
                _whole_buffer(model, cc, sync, i, k, [], exposed, slack, f"whole_{sync.window}_{i}")
                slack = (slack + to_solver_time(cc.cand.vpp * per_layer_window) * k
                         + to_solver_time(window_s(cc, i, 0, sync.window)))
            total = total + exposed
            continue
        for y, bucket, c in zip(choice, cc.buckets, sync.per_bucket):
            per_param = c / bucket  # seconds of fluid communication per parameter
            slack, least_slack = 0, 0  # least_slack: the slack with every earlier stage at its fewest layers
            for i, k in enumerate(chunks):
                s = cc.stages[i]
                per_k = to_solver_time(v * (lp * per_param - per_layer_window))
                fixed = to_solver_time(s.vocab_params * per_param - window_s(cc, i, 0, sync.window))
                model.Add(exposed >= per_k * k + fixed - slack).OnlyEnforceIf(y)
                if to_solver_time(c) > least_slack:  # otherwise this stage's last bucket is always hidden
                    _last_bucket(model, cc, sync, i, k, ranges[i], y, bucket, c, exposed, slack)
                step = to_solver_time(v * per_layer_window), to_solver_time(window_s(cc, i, 0, sync.window))
                slack = slack + step[0] * k + step[1]
                least_slack += step[0] * ranges[i][0] + step[1]
        total = total + exposed
    return choice, total


def _last_bucket(model: cp_model.CpModel, cc: CandidateCosts, sync, i: int, k, k_range: tuple[int, int], y,
                 bucket: int, c: float, exposed, slack) -> None:
    """exposed >= last_i - slack_i, where last_i is one full bucket (c) when stage i holds at least `bucket`
    parameters, else the collective of its whole buffer: min over the collective's linear pieces, which the
    minimization picks through one literal per piece."""
    v, lp, s = cc.cand.vpp, cc.layer.params, cc.stages[i]
    threshold = -(-(bucket - s.vocab_params) // (v * lp)) if lp else 0  # fewest chunks that fill one bucket
    lo, hi = k_range
    if threshold <= lo:  # always at least one full bucket
        model.Add(exposed >= to_solver_time(c) - slack).OnlyEnforceIf(y)
        return
    small = model.NewBoolVar(f"small_{sync.window}_{i}_{bucket}")
    if threshold > hi:
        model.Add(small == 1)
    else:
        model.Add(k <= threshold - 1).OnlyEnforceIf(small)
        model.Add(k >= threshold).OnlyEnforceIf(small.Not())
        model.Add(exposed >= to_solver_time(c) - slack).OnlyEnforceIf([y, small.Not()])
    _whole_buffer(model, cc, sync, i, k, [y, small], exposed, slack, f"piece_{sync.window}_{i}_{bucket}")


def _whole_buffer(model: cp_model.CpModel, cc: CandidateCosts, sync, i: int, k, enforce: list, exposed, slack,
                  name: str) -> None:
    """Under `enforce`: exposed >= the collective of stage i's whole buffer - slack_i, the collective being the
    least of its linear pieces, which the minimization picks through one literal per piece."""
    v, lp, s = cc.cand.vpp, cc.layer.params, cc.stages[i]
    pieces = [model.NewBoolVar(f"{name}_{j}") for j in range(len(sync.pieces))]
    model.AddBoolOr(pieces).OnlyEnforceIf(enforce)
    nbytes = sync.bytes_per_param
    for lit, (a, slope) in zip(pieces, sync.pieces):
        per_k = to_solver_time(slope * nbytes * v * lp)
        fixed = to_solver_time(a + slope * nbytes * s.vocab_params)
        model.Add(exposed >= per_k * k + fixed - slack).OnlyEnforceIf([*enforce, lit])


def whole_buffer_s(sync, params: float) -> float:
    """Seconds of the collective over `params` parameters' buffer in one piece (the least of its linear pieces)."""
    return min(a + slope * sync.bytes_per_param * params for a, slope in sync.pieces)


def adam_term(model: cp_model.CpModel, cc: CandidateCosts, chunks, num_layers: int):
    """The optimizer step of the stage with the most parameters."""
    v = cc.cand.vpp
    per = to_solver_time(cc.layer.params * cc.adam_s_per_param)
    hi = v * per * (num_layers // v) + max(to_solver_time(s.vocab_params * cc.adam_s_per_param) for s in cc.stages)
    adam = model.NewIntVar(0, hi, "adam")
    for k, s in zip(chunks, cc.stages):
        model.Add(adam >= v * per * k + to_solver_time(s.vocab_params * cc.adam_s_per_param))
    return adam
