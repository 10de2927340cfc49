"""CP-SAT model of the inner problem: for one outer candidate, choose the layers of every pipeline stage,
how many layers per chunk run under full recomputation and the gradient bucket size, minimizing the step
time subject to every stage's memory.

Layout after the cpsat-primer: instance (CandidateCosts) -> variables -> constraint groups -> objective ->
solve -> read back. Costs are scaled to integers once (units.to_solver_time); memory stays in whole bytes.
Step time, multiplied by vpp to stay integral:
    vpp*m*t_max + sum(t_i) - t_max + vpp*(exposed gradient sync + exposed parameter sync + Adam step)
with t_i = n_i*a + r_i*d + c_i linear in the layers n_i = vpp*k_i and the recomputed layers r_i = vpp*rc_i.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from autotune.search.tables import CandidateCosts, grad_table, max_chunks, param_table
from autotune.units import to_solver_time


@dataclass(frozen=True, slots=True)
class PartitionResult:
    status: str
    """OPTIMAL, FEASIBLE, INFEASIBLE (nothing fits, or nothing beats the cutoff) or UNKNOWN (time limit)."""
    layers: tuple[int, ...] = ()
    recompute_layers: int = 0
    bucket: int = 0
    objective: int = 0


_STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE", cp_model.INFEASIBLE: "INFEASIBLE",
           cp_model.UNKNOWN: "UNKNOWN", cp_model.MODEL_INVALID: "MODEL_INVALID"}


def solve_partition(cc: CandidateCosts, num_layers: int, buckets: tuple[int, ...], *, time_limit_s: float,
                    cutoff: int | None = None, pinned: tuple[int, ...] | None = None) -> PartitionResult:
    """Solve one candidate. With `cutoff` (scaled objective), only strictly better plans are feasible."""
    c = cc.cand
    model = cp_model.CpModel()
    chunks = _chunk_vars(model, cc, num_layers, pinned)
    if chunks is None:
        return PartitionResult("INFEASIBLE")
    rc, r = _recompute_vars(model, cc, chunks)
    times, t_hi = _stage_times(model, cc, chunks, rc, num_layers // c.vpp)
    t_max = model.NewIntVar(0, t_hi, "t_max")
    model.AddMaxEquality(t_max, times)
    _memory_constraints(model, cc, chunks, rc)
    bucket_idx, sync = _dp_sync(model, cc, chunks, buckets, num_layers)
    adam = _adam(model, cc, chunks)
    v, m = c.vpp, c.num_microbatches
    objective = v * m * t_max + sum(times) - t_max + v * (sync + adam + to_solver_time(cc.tied_sync_s))
    if cutoff is not None:
        model.Add(objective < cutoff)
    model.Minimize(objective)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1  # deterministic, and the machine has two cores
    solver.parameters.random_seed = 0
    solver.parameters.max_time_in_seconds = max(time_limit_s, 0.001)
    code = solver.Solve(model)
    status = _STATUS.get(code, "UNKNOWN")
    if status not in ("OPTIMAL", "FEASIBLE"):
        return PartitionResult(status)
    layers = tuple(v * solver.Value(k) for k in chunks)
    r_val = solver.Value(r) if r is not None else 0
    r_val = min(r_val, max(layers) // v)
    bucket = buckets[solver.Value(bucket_idx)] if bucket_idx is not None else buckets[0]
    return PartitionResult(status, layers, r_val, bucket, int(solver.ObjectiveValue()))


def _chunk_vars(model: cp_model.CpModel, cc: CandidateCosts, num_layers: int,
                pinned: tuple[int, ...] | None) -> list[cp_model.IntVar] | None:
    """k_i chunks' worth of layers per stage (n_i = vpp*k_i), summing to the model."""
    c = cc.cand
    v, p = c.vpp, c.pp
    total = num_layers // v
    chunks = []
    for i in range(p):
        end = i in (0, p - 1)
        lo = 0 if (end and p > 1 and v == 1) else 1
        hi = min(total, max_chunks(cc, i, num_layers))
        if pinned is not None:
            lo = hi = pinned[i] // v if pinned[i] % v == 0 else -1
        elif c.even_only:
            lo, hi = max(lo, (num_layers // p) // v), min(hi, -(-num_layers // p) // v)
        if p == 1:
            lo = hi = total if hi >= total else -1
        if hi < lo or lo < 0:
            return None
        chunks.append(model.NewIntVar(lo, hi, f"k{i}"))
    if num_layers % v:
        return None
    model.Add(sum(chunks) == total)
    return chunks


def _recompute_vars(model: cp_model.CpModel, cc: CandidateCosts, chunks: list[cp_model.IntVar]):
    """rc_i = min(r, k_i): Megatron's block method recomputes the first r layers of every chunk."""
    c = cc.cand
    if c.full_max == 0:
        return [0] * len(chunks), None
    r = model.NewIntVar(c.full_min, c.full_max, "r")
    rc = []
    for i, k in enumerate(chunks):
        x = model.NewIntVar(0, c.full_max, f"rc{i}")
        model.AddMinEquality(x, [r, k])
        rc.append(x)
    return rc, r


def _stage_times(model: cp_model.CpModel, cc: CandidateCosts, chunks, rc, kmax: int) -> tuple[list, int]:
    """t_i = n_i*a + r_i*d + c_i in solver units, and an upper bound on all of them."""
    v = cc.cand.vpp
    a, d = to_solver_time(cc.layer_time_s), to_solver_time(cc.full_extra_s)
    hi = v * (a + max(d, 0)) * kmax + max(to_solver_time(s.time_s) for s in cc.stages)
    out = []
    for i, k in enumerate(chunks):
        t = model.NewIntVar(0, hi, f"t{i}")
        model.Add(t == v * a * k + v * d * rc[i] + to_solver_time(cc.stages[i].time_s))
        out.append(t)
    return out, hi


def _memory_constraints(model: cp_model.CpModel, cc: CandidateCosts, chunks, rc) -> None:
    """Weights, gradients, optimizer states, in-flight activations, vocabulary terms and the scratch of a
    fully recomputed layer must fit in the usable memory of every stage."""
    v = cc.cand.vpp
    for i, k in enumerate(chunks):
        s = cc.stages[i]
        expr = k * (v * cc.layer_state + s.in_flight * cc.act_base) + s.memory
        if cc.cand.full_max:
            expr += rc[i] * s.in_flight * (cc.act_full - cc.act_base)
            scratch = model.NewBoolVar(f"scratch{i}")
            model.Add(rc[i] <= cc.cand.full_max * scratch)
            expr += scratch * cc.act_none
        model.Add(expr <= cc.usable)


def _dp_sync(model: cp_model.CpModel, cc: CandidateCosts, chunks, buckets: tuple[int, ...], num_layers: int):
    """Exposed data-parallel sync: per stage an exact table over (bucket, layers), minus the slack of the
    stages that finish their backward (start their forward) earlier, as in estimate.dp_sync_exposed."""
    c = cc.cand
    if cc.dp_group == 1 or c.zero >= 3:
        return None, 0
    v = c.vpp
    kmax = num_layers // v
    idx = model.NewIntVar(0, len(buckets) - 1, "bucket")
    total = 0
    for table_fn, window in ((grad_table, "bwd"), (param_table, "fwd")):
        if table_fn is param_table and c.zero == 0:
            continue
        exposed = model.NewIntVar(0, 10**15, f"{window}_exposed")
        slack = 0
        for i, k in enumerate(chunks):
            values = [to_solver_time(table_fn(cc, i, b, v * kk)) for b in buckets for kk in range(kmax + 1)]
            e = model.NewIntVar(min(values), max(values), f"{window}_e{i}")
            model.AddElement(idx * (kmax + 1) + k, values, e)
            model.Add(exposed >= e - slack)
            slack = slack + _window_expr(cc, i, k, window)
        total = total + exposed
    return idx, total


def _window_expr(cc: CandidateCosts, i: int, k, window: str):
    """Forward or backward time of stage i per micro-batch (recomputation excluded), linear in k."""
    layer, vocab, s = cc.layer, cc.vocab, cc.stages[i]
    v = cc.cand.vpp
    if window == "bwd":
        per = layer.bwd.seconds + layer.tp_bwd_s + layer.cp_bwd_s
        fixed = (vocab.embed_bwd.seconds if s.first else 0.0) + (vocab.head_bwd.seconds if s.last else 0.0)
    else:
        per = layer.fwd.seconds + layer.tp_fwd_s + layer.cp_fwd_s
        fixed = (vocab.embed_fwd.seconds if s.first else 0.0) + (vocab.head_fwd.seconds if s.last else 0.0)
    return v * to_solver_time(per) * k + to_solver_time(fixed)


def _adam(model: cp_model.CpModel, cc: CandidateCosts, chunks):
    """The optimizer step of the stage with the most parameters."""
    v = cc.cand.vpp
    per = to_solver_time(cc.layer.params * cc.adam_s_per_param)
    terms = [v * per * k + to_solver_time(s.vocab_params * cc.adam_s_per_param) for k, s in zip(chunks, cc.stages)]
    adam = model.NewIntVar(0, 10**15, "adam")
    for t in terms:
        model.Add(adam >= t)
    return adam
