"""Closed forms of the pipeline schedules: what the simulation in pipeline.py must reproduce for equal
stages, and the bounds for unequal ones that the planner prunes with.

For equal stages of F + B seconds per micro-batch (B including W unless the schedule splits it):
  1f1b         (m + p - 1) * (F + B)                      Narayanan et al. 2021
  interleaved  (m + (p - 1)/v) * (F + B)                  Narayanan et al. 2021, v chunks per rank
  zb-h1        m * (F + B + W) + (p - 1) * (F + B - W)     Qi et al. 2024 (W <= min(F, B))
For unequal stages no closed form is exact: step time is a longest path (pipeline.py). Any one path is a
lower bound, and the planner's bounds use the one that runs the forward of the first micro-batch down to the
last rank, every pass of that rank, and the backward of the last micro-batch back up:
  1f1b, interleaved:  T >= m * t_last + sum_{i < last} t_i / v   and  T >= m * max_i t_i
"""

from __future__ import annotations


def equal_stage_time(schedule: str, pp: int, vpp: int, m: int, f: float, b: float, w: float = 0.0) -> float:
    """Pipeline time of equal stages (per rank and micro-batch: f forward, b backward, w weight gradient)."""
    if schedule == "interleaved":
        return (m + (pp - 1) / vpp) * (f + b + w)
    if schedule == "zb-h1":
        return m * (f + b + w) + (pp - 1) * (f + b - w)
    return (m + pp - 1) * (f + b + w)


def pipeline_lower_bound(schedule: str, m: int, vpp: int, t_max: float, t_last: float, work: float) -> float:
    """A pipeline time no partition beats, from lower bounds on the slowest rank's time (t_max), the last
    rank's (t_last) and the total work per micro-batch (work >= sum of rank times)."""
    bound = m * t_max
    if schedule in ("1f1b", "interleaved"):
        if m * vpp >= 2:  # the last-rank path: (m - 1/v)*t_last + (work - t_last)/v, increasing in both
            bound = max(bound, (m - 2 / vpp) * t_last + work / vpp)
        else:
            bound = max(bound, work)
    return bound
