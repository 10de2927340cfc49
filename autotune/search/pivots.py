"""The pivot-path floor: the least longest pivot path of any partition within the memory caps, found by a
dynamic program over the ranks and the chunks used (bounds.py holds the other bounds, joint.py sums this one
with the syncs).

A rank's step of the program covers a few hundred cells, where each numpy call costs more than its arithmetic,
so `PivotTerms` takes every term that does not depend on the chunks used before a rank in a few calls over
[rank, chunks] arrays, and a rank's step then costs a handful of calls (issue 13). Each value is computed with
the same IEEE operations in the same order as the path formulas read, so the floor does not depend on how the
calls are batched.
"""

from __future__ import annotations

import math

import numpy as np

from autotune.search.tables import CandidateCosts, Sync, chunk_ranges, window_s


def pivot_path_floor(cc: CandidateCosts, num_layers: int, *, with_step: bool = False) -> float:
    """The least, over every partition within the memory caps, of the longest pivot path (exactly).

    Rank k's pivot path is the first micro-batch's forward down to k, every pass of k, and (1F1B, interleaved)
    the last micro-batch's backward back up: m*t_k + r*S_k with S_k the time of the ranks before k and r as in
    schedules.pipeline_lower_bound (0 for v-half). With t_k = n_k*a + c_k (a: a layer chunk at the cheapest
    recomputation, c_k: the rank's fixed terms), a dynamic program over ranks and chunks used finds the
    partition minimizing the largest of them (numpy, O(p * chunks^2)). Every path is a lower bound on the
    pipeline time, so this is one too; it is tight for balanced 1F1B pipelines, where the bubble is exactly
    that of the path through the last rank. ZB-H1's rank k also has the path that leaves after its last B (its
    k deferred W passes and one more come after it), having come down the F and B chains of the ranks before
    it, and then runs rank 0's last W (search/partition.py, _pivot_paths): m*t_k - min(k+1, m)*W_k +
    sum_{i<k} (F_i + B_i) + W_0, exact for equal stages (with m <= k every W of rank k comes after its last B).

    with_step: each rank's paths also carry what its stage alone adds to the step (_sync_and_adam). The
    exposed sync and the Adam step are each the largest over the stages, so the step time is at least
    max_k(path_k + sync_k + adam_k) + the tied-embedding sync, which this then returns: the pipeline and the
    sync bounded together, as the CP-SAT relaxation sees them (a balanced pipeline leaves stage 0 most of its
    gradients to reduce with no earlier stage's window to hide them)."""
    key = ("pivot", num_layers, with_step)  # the refined bound and joint.pipe_sync_floor both need it
    if (out := cc.memo.get(key)) is None:
        cc.memo[key] = out = _pivot_path_floor(cc, num_layers, with_step)
    return out


def _pivot_path_floor(cc: CandidateCosts, num_layers: int, with_step: bool) -> float:
    """pivot_path_floor, computed."""
    c = cc.cand
    total = num_layers // c.vpp
    ranges = chunk_ranges(cc, num_layers)
    if any(lo > hi for lo, hi in ranges):
        return math.inf
    terms = PivotTerms(cc, total, ranges[0][0])
    limits = [total] * c.pp  # the most chunks ranks 0..k may use: the later ranks need their fewest
    for k in range(c.pp - 2, -1, -1):
        limits[k] = limits[k + 1] - ranges[k + 1][0]
    best, spare = np.full(total + 1, np.inf), np.empty(total + 1)  # spare: the next rank's, filled anew each time
    best[0] = 0.0
    used: np.ndarray | None = None  # the chunk counts the ranks before k can have used, where no range
    first, rows = 0, 1  # else their range
    windows = {"bwd": 0.0, "fwd": 0.0}  # fixed windows of the ranks before k, for with_step
    for k, (lo, hi) in enumerate(ranges):
        if used is not None:  # only where some path is infinite: the targets are no range, scatter them
            value = np.maximum(best[used][:, None], _with_step(terms.paths(k, lo, hi, used), cc, k, lo, hi, used,
                                                               windows, with_step))
            target = used[:, None] + np.arange(lo, hi + 1)[None, :]
            ok = target <= limits[k]
            best = np.full(total + 1, np.inf)
            np.minimum.at(best, target[ok], value[ok])
            used = np.flatnonzero(np.isfinite(best))
            continue
        # value[u, j]: the largest pivot so far after giving lo + j chunks to rank k having used first + u before
        # it, written to the cells so that row u starts u further along a row of `width`: the targets of row u are
        # first + lo + u + j, so the least value of each target is the least of a column read with that width
        cols = hi - lo + 1
        width = rows + cols - 1
        cells = np.empty(rows * (width + 1))
        cells.fill(np.inf)
        value = cells.reshape(rows, width + 1)[:, :cols]
        terms.paths(k, lo, hi, slice(first, first + rows), out=value)
        if with_step:
            _with_step(value, cc, k, lo, hi, np.arange(first, first + rows), windows, with_step)
        np.maximum(best[first:first + rows][:, None], value, out=value)
        least = cells[:rows * width].reshape(rows, width).min(axis=0)
        first += lo
        rows = max(0, min(width, limits[k] - first + 1))
        best, spare = spare, best
        best.fill(np.inf)
        best[first:first + rows] = least[:rows]
        if not rows:
            return math.inf
        if not least[:rows].max() < math.inf:  # some path infinite (or NaN): no range left
            used = np.flatnonzero(np.isfinite(best))
    return float(best[total]) + (cc.tied_sync_s if with_step else 0.0)


def _with_step(pivot: np.ndarray, cc: CandidateCosts, k: int, lo: int, hi: int, used: np.ndarray,
               windows: dict[str, float], with_step: bool) -> np.ndarray:
    """pivot_path_floor's paths of rank k, plus (with_step, in place) what its stage adds to the step."""
    if with_step:
        np.add(pivot, _sync_and_adam(cc, k, np.arange(lo, hi + 1), used, windows), out=pivot)
    return pivot


class PivotTerms:
    """The terms of every rank's pivot paths (pivot_path_floor) that do not depend on the chunks used before
    it, for every chunk count 0..total: one call per term for all ranks rather than one per rank. They are
    kept with the axis a rank's step broadcasts them along ([k, 1, n] for rank k's own chunks, [k, u, 1] for
    those used before it), so that a step takes each as one view."""

    def __init__(self, cc: CandidateCosts, total: int, first_lo: int) -> None:
        """`first_lo`: rank 0's fewest chunks (ZB-H1's paths end with rank 0's last W at that count)."""
        c = cc.cand
        v, m = c.vpp, c.num_microbatches
        f_l, b_l, w_l = cc.layer_fbw
        r = pivot_share(cc)
        chunks = np.arange(total + 1)
        a = chunks * (v * (f_l + b_l + w_l))  # n chunks' worth of layers on a rank, every pass
        times, before = [], []  # per rank: its fixed time, that of the ranks before it
        acc = 0.0
        for s in cc.stages:
            times.append(s.time_s)
            before.append(acc)
            acc += s.time_s
        self.own = (m * (a[None, :] + np.array(times)[:, None]))[:, None, :]  # [k, 1, n]: m * t_k
        self.earlier = (r * (a[None, :] + np.array(before)[:, None]))[:, :, None]  # [k, u, 1]: r * S_k
        self.zb = c.schedule == "zb-h1"
        if self.zb:  # the path leaving after rank k's last B (pivot_path_floor)
            w_fix = np.array([s.chunk_fixed[0][2] for s in cc.stages])
            drains = np.array([min(k + 1, m) for k in range(c.pp)])
            self.drain = self.own - (drains[:, None] * ((chunks * v * w_l)[None, :] + w_fix[:, None]))[:, None, :]
            self.fb = (chunks * v * (f_l + b_l))[:, None]  # [u, 1]: the F and B chains of the layers before rank k
            self.fb_fixed, self.w0 = [], []  # per rank: the F and B fixed terms before it, rank 0's last W
            acc, w0 = 0.0, 0.0
            for k, s in enumerate(cc.stages):
                f_fix, b_fix, w_fix_k = s.chunk_fixed[0]
                self.fb_fixed.append(acc)
                self.w0.append(w0)
                acc += f_fix + b_fix
                if k == 0:
                    w0 = first_lo * v * w_l + w_fix_k

    def paths(self, k: int, lo: int, hi: int, used: slice | np.ndarray, out: np.ndarray | None = None
              ) -> np.ndarray:
        """[u, j]: the longest pivot path of rank k holding lo + j chunks after used[u] on the ranks before it
        (`used`: the counts, or their range); into `out` if given."""
        pivot = np.add(self.own[k, :, lo:hi + 1], self.earlier[k, used], out=out)
        if self.zb:
            chain = self.drain[k, :, lo:hi + 1] + self.fb[used]
            chain += self.fb_fixed[k]
            chain += self.w0[k]
            np.maximum(pivot, chain, out=pivot)
        return pivot


def _sync_and_adam(cc: CandidateCosts, k: int, n: np.ndarray, used: np.ndarray, windows: dict[str, float]
                   ) -> np.ndarray:
    """[u, j]: what stage k holding n[j] chunks after used[u] on the ranks before it adds to the step at the
    least: its exposed data-parallel syncs (the fluid terms of partition_terms.dp_sync: its buckets' communication
    less its own window and the windows of the stages before it), at the bucket that hides the most, and its
    Adam step. `windows` holds the fixed windows of the ranks before k and takes stage k's."""
    c, s = cc.cand, cc.stages[k]
    v, lp = c.vpp, cc.layer.params
    exposed: np.ndarray | float = 0.0
    if cc.syncs:
        total: np.ndarray | float = 0.0  # [b, u, j], every bucket at once
        for sync in cc.syncs:
            own, slack = fluid_syncs(cc, k, sync, n, used, windows)
            total = total + np.maximum(0.0, own[:, None, :] - slack[None, :, None])
        exposed = total.min(axis=0)
    for name in windows:
        windows[name] += window_s(cc, k, 0, name)
    return exposed + ((n * v * lp + s.vocab_params) * cc.adam_s_per_param)[None, :]


def fluid_syncs(cc: CandidateCosts, k: int, sync: Sync, n: np.ndarray, used: np.ndarray,
                windows: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """(own[b, j], slack[u]) of one sync at every bucket cc.buckets[b]: the fluid term of partition_terms.dp_sync
    for stage k holding n[j] chunks (the communication of its parameters less its own window) and the windows of
    the stages before it holding used[u] chunks (`windows`: their fixed windows). Seconds per parameter are taken
    first, as partition_terms.dp_sync takes them, so every bound rounds the same way. A sync after the backward
    (Sync.whole): own[0, j] is the collective of the stage's whole buffer."""
    v, lp = cc.cand.vpp, cc.layer.params
    window = cc.layer_bwd_s if sync.window == "bwd" else cc.layer_fwd_s
    slack = used * v * window + windows[sync.window]
    if sync.whole:  # after the backward: the collective of the whole buffer, its own window hiding none of it
        nbytes = (n * v * lp + cc.stages[k].vocab_params) * sync.bytes_per_param
        return np.min([a + slope * nbytes for a, slope in sync.pieces], axis=0)[None, :], slack
    per_param = np.array(sync.per_bucket) / np.array(cc.buckets)
    own = ((n * v)[None, :] * (lp * per_param - window)[:, None] + (cc.stages[k].vocab_params * per_param)[:, None]
           - window_s(cc, k, 0, sync.window))
    return own, slack


def pivot_share(cc: CandidateCosts) -> float:
    """r of pivot_path_floor: the share of each earlier rank's time on the pivot path's forward and backward
    chains (see schedules.pipeline_lower_bound)."""
    c = cc.cand
    if c.schedule == "v-half" or c.pp == 1:
        return 0.0
    if c.schedule == "interleaved":
        return 1 / c.vpp
    if c.schedule == "zb-h1":
        f_l, b_l, w_l = cc.layer_fbw
        shares = [f_l / (f_l + b_l + w_l + max(cc.full_extra_s, 0.0)) if f_l > 0 else 0.0, 0.5]
        shares += [fb[0] / sum(fb) for s in cc.stages for fb in s.chunk_fixed if sum(fb) > 0]
        return min(shares)
    return 1.0
