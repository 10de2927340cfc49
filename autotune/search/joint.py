"""The pipeline and the data-parallel sync bounded together, as the CP-SAT relaxation sees them.

The relaxation's objective is max_k(pivot path_k) + the exposed syncs (each a maximum over the stages, for one
bucket shared by all) + the largest Adam step: a sum of maxima over the stages. A pipeline balances its stages
while the sync wants the first stages small (they have no earlier backward to hide behind), so the two pull
apart and max_k(path_k + sync_k) (pivots.pivot_path_floor with_step) falls well short of the sum. This bound
gets the sum: for a pipeline threshold T, a dynamic program over the ranks and the chunks used finds the least
sync (+ Adam) of any partition whose pivot paths all stay within T, for each bucket. Any partition has its
longest pivot path P in some interval (T_j, T_j+1] of a grid from the pivot floor to the best plan known, so
its step time is at least T_j + sync*(T_j+1); above the grid it cannot beat the best plan anyway. The planner
uses it before CP-SAT: candidates it lifts past the best plan need no solve.
"""

from __future__ import annotations

import math

import numpy as np

from autotune.search.pivots import PivotTerms, fluid_syncs, pivot_path_floor
from autotune.search.tables import CandidateCosts, chunk_ranges, window_s

#: Pipeline thresholds between the pivot floor and the best plan known: the bound is within (best - floor) / GRID
#: of what the grid would give with every threshold.
GRID = 12


def pipe_sync_floor(cc: CandidateCosts, num_layers: int, best_s: float) -> float:
    """A step time no partition of cc beats, or at least `best_s` when none can beat that (see the module)."""
    floor = pivot_path_floor(cc, num_layers)
    if not math.isfinite(best_s) or floor >= best_s or not math.isfinite(floor):
        return floor
    ranges = chunk_ranges(cc, num_layers)
    if any(lo > hi for lo, hi in ranges):
        return math.inf
    levels = np.append(floor + (best_s - floor) * np.arange(1, GRID + 1) / GRID, math.inf)  # the T_j+1
    least = _least_sync(cc, num_layers, ranges, levels)  # [j]: least sync + Adam with every path <= levels[j]
    below = np.append(floor + (best_s - floor) * np.arange(GRID) / GRID, best_s)  # the T_j
    return float(np.min(below + least)) + cc.tied_sync_s


def _least_sync(cc: CandidateCosts, num_layers: int, ranges: tuple[tuple[int, int], ...], levels: np.ndarray
                ) -> np.ndarray:
    """[j]: over every bucket and every partition whose pivot paths are all at most levels[j], the least
    max over stages of (exposed syncs + Adam step).

    A dynamic program over the ranks: best[b, j, u] is the least so far having used first + u chunks on the ranks
    before (only the counts they can reach: at least their fewest, leaving the later ranks theirs). A rank's step
    writes value[b, j, u, n] (n: its chunks from lo) to cells whose rows start u further along, as
    pivots.pivot_path_floor does, so that the targets u + n are columns and one min takes them all. The last rank
    has one target, every chunk: its step reads the diagonal u + n = total alone."""
    c = cc.cand
    total = num_layers // c.vpp
    rest = np.cumsum([lo for lo, _ in ranges][::-1])[::-1]
    nb = max(len(cc.buckets) if cc.syncs else 1, 1)
    best = np.zeros((nb, len(levels), 1))
    terms = PivotTerms(cc, total, ranges[0][0])
    windows = {"bwd": 0.0, "fwd": 0.0}
    first = 0  # the chunks best[..., 0] stands for
    for k, (lo, hi) in enumerate(ranges):
        rows, cols = best.shape[2], hi - lo + 1
        width = rows + cols - 1
        used = slice(first, first + rows)
        sync = _stage_sync(cc, k, np.arange(lo, hi + 1), np.arange(first, first + rows), windows)  # [bucket, u, n]
        barred = ~(terms.paths(k, lo, hi, used) <= levels[:, None, None])  # [level, u, n]: a pivot path above it
        if k == c.pp - 1:
            break
        least = _targets(best, sync, barred, rows, cols)
        first += lo
        cap = total - rest[k + 1]  # leave the later ranks their fewest
        best = least[..., :max(0, min(width, cap - first + 1))]
    return _last_rank(best, sync, barred, total - first - lo)


def _targets(best: np.ndarray, sync: np.ndarray, barred: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """[b, j, t]: the least value[b, j, u, n] = max(best[b, j, u], sync[b, u, n]) (inf where barred[j, u, n])
    over u + n = t: one shifted min per own count n. (Writing the values skewed, row u starting u further along,
    so that one min over rows takes every target, fills and reads rows x (rows + cols) cells for rows x cols
    values: slower for all but the squarest ranks. A min is exact, so either gives the same bound to the bit.)"""
    nb, nl, width = best.shape[0], best.shape[1], rows + cols - 1
    value = np.maximum(best[..., None], sync[:, None, :, :])
    np.copyto(value, np.inf, where=barred[None])
    least = np.full((nb, nl, width), np.inf)
    for n in range(cols):
        np.minimum(least[..., n:n + rows], value[..., n], out=least[..., n:n + rows])
    return least


def _last_rank(best: np.ndarray, sync: np.ndarray, barred: np.ndarray, left: int) -> np.ndarray:
    """_least_sync's last step: [j], the least over every bucket and every u of the last rank holding the
    `left` - u chunks the others leave it (best[b, j, u], sync[b, u, n] and barred[j, u, n] as there)."""
    u = np.arange(best.shape[2])
    n = left - u
    ok = (n >= 0) & (n < sync.shape[2])
    u, n = u[ok], n[ok]
    if not len(u):
        return np.full(best.shape[1], np.inf)
    value = np.maximum(best[:, :, u], sync[:, None, u, n])  # [bucket, level, d]: the pairs (u[d], n[d])
    np.copyto(value, np.inf, where=barred[None, :, u, n])
    return value.min(axis=2).min(axis=0)


def _stage_sync(cc: CandidateCosts, k: int, n: np.ndarray, used: np.ndarray, windows: dict[str, float]
                ) -> np.ndarray:
    """[bucket, u, j]: stage k's exposed syncs (partition_terms.dp_sync: the fluid term and the last bucket,
    less the windows of the stages before it) plus its Adam step, holding n[j] chunks after used[u] on the ranks
    before it. `windows` holds the fixed windows of the ranks before k and takes stage k's."""
    c, s = cc.cand, cc.stages[k]
    v, lp = c.vpp, cc.layer.params
    params = n * v * lp + s.vocab_params
    adam = (params * cc.adam_s_per_param)[None, :]
    if not cc.syncs:
        out = np.stack([np.zeros((len(used), 1)) + adam])
    else:  # every bucket at once: [bucket, u, j]
        total: np.ndarray | float = 0.0
        for sync in cc.syncs:
            own, slack = fluid_syncs(cc, k, sync, n, used, windows)
            if not sync.whole:  # else own is already the whole buffer's collective
                whole = np.min([pa + slope * sync.bytes_per_param * params for pa, slope in sync.pieces], axis=0)
                last = np.where(params[None, :] >= np.array(cc.buckets)[:, None],
                                np.array(sync.per_bucket)[:, None], whole[None, :])
                own = np.maximum(own, last)
            total = total + np.maximum(0.0, own[:, None, :] - slack[None, :, None])
        out = total + adam[None]
    for name in windows:
        windows[name] += window_s(cc, k, 0, name)
    return out
