"""Closed forms of the pipeline schedules: what the simulation in pipeline.py must reproduce for equal
stages, and the bounds for unequal ones that the planner prunes with.

For equal stages of F + B seconds per micro-batch (B including W unless the schedule splits it):
  1f1b         (m + p - 1) * (F + B)                      Narayanan et al. 2021
  interleaved  (m + (p - 1)/v) * (F + B)                  Narayanan et al. 2021, v chunks per rank
  zb-h1        m * (F + B + W) + (p - 1) * (F + B - W)     Qi et al. 2024 (W <= min(F, B))
For unequal stages no closed form is exact: step time is a longest path (pipeline.py). Any one path is a
lower bound; the planner's bounds (pipeline_lower_bound) use the paths that run the forward of the first
micro-batch down to a rank, every pass of that rank, and the backward of the last micro-batch back up.
"""

from __future__ import annotations

from autotune.specs.job import JobSpec
from autotune.specs.overlap import overlaps_p2p


def equal_stage_time(schedule: str, pp: int, vpp: int, m: int, f: float, b: float, w: float = 0.0) -> float:
    """Pipeline time of equal stages (per rank and micro-batch: f forward, b backward, w weight gradient)."""
    if schedule == "interleaved":
        return (m + (pp - 1) / vpp) * (f + b + w)
    if schedule == "zb-h1":
        return m * (f + b + w) + (pp - 1) * (f + b - w)
    return (m + pp - 1) * (f + b + w)


def pipeline_lower_bound(schedule: str, m: int, vpp: int, pp: int, t_max: float, t_last: float, work: float,
                         path_share: float = 1.0) -> float:
    """A pipeline time no partition beats, from lower bounds on the slowest rank's time (t_max), the last
    rank's (t_last) and the total work per micro-batch (work = sum of rank times).

    For 1F1B-like schedules every rank k has a path: the first micro-batch's forward down to k, all of k's
    passes, the last micro-batch's backward back up: T >= m*t_k + r*sum_{i<k} t_i, where r is the share of a
    rank's time those chains carry (1/v interleaved; ZB-H1 may end a rank on deferred W passes, so only the
    forward chain counts: F/(F+B+W), `path_share`).
    For the last rank that is (m - r)*t_last + r*work. The partition minimizing the largest of them over all
    k sets t_k = (T - r*S_k)/m, shrinking geometrically: T >= r*work / (1 - (1 - r/m)^p), about half of
    1F1B's bubble for any partition."""
    bound = m * t_max
    if schedule == "v-half" or pp == 1:
        return bound
    r = 1 / vpp if schedule == "interleaved" else (path_share if schedule == "zb-h1" else 1.0)
    return max(bound, (m - r) * t_last + r * work, r * work / (1 - (1 - r / m) ** pp))


def exposed_p2p_share(job: JobSpec, schedule: str, pp: int, vpp: int, m: int) -> float:
    """Share of a rank's pipeline sends and receives that hold up its passes. Where the trainer overlaps them
    (overlap.overlaps_p2p: Megatron's interleaved schedule) only the warm-up forwards and the cool-down
    backwards still wait on theirs: megatron-core posts them without overlap_p2p_comm unless
    overlap_p2p_comm_warmup_flush is set, and rank r warms up 2(p - r - 1) + (v - 1)p of its m*v forward passes
    (0.16 pipeline_parallel/schedules.py, get_pp_rank_microbatches with its default group of p). Rank 0's share,
    the largest, stands for every rank; the cross-rank latency of the hidden sends is left out (one hop per
    stage boundary of the fill: 14 x 0.8 ms of a 10 s Llama 3.1 70B step at pp 8)."""
    if pp == 1 or not overlaps_p2p(job, schedule, vpp):
        return 1.0
    return min(m * vpp, 2 * (pp - 1) + (vpp - 1) * pp) / (m * vpp)
