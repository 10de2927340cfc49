"""Pipeline schedules: step time from per-stage times, and how many micro-batches each stage holds.

With per-micro-batch stage times t_i (forward + backward + point-to-point), 1F1B spends one pass through
every stage filling and draining the pipeline and m-1 passes of the slowest stage in steady state:
T = (m-1)*max(t) + sum(t) (the form Alpa and PipeDream use; (m+p-1)*t for equal stages, Narayanan et al.
2021). Interleaving v model chunks per rank shrinks the fill/drain pass by v: T = m*max(t) + (sum(t)-max(t))/v,
which is (m + (p-1)/v)*t for equal stages, Narayanan et al.'s interleaved bubble.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.costmodel.memory import in_flight_1f1b, in_flight_chunks_interleaved


def pipeline_time(stage_times: Sequence[float], num_microbatches: int, vpp: int = 1) -> float:
    """Time from the first forward to the last backward of one step."""
    slowest = max(stage_times)
    return num_microbatches * slowest + (sum(stage_times) - slowest) / vpp


def bubble_time(stage_times: Sequence[float], num_microbatches: int, vpp: int = 1) -> float:
    """Idle time of the slowest stage: pipeline time minus its own busy time."""
    return pipeline_time(stage_times, num_microbatches, vpp) - num_microbatches * max(stage_times)


def activation_multiplier(schedule: str, stage: int, pp: int, vpp: int, num_microbatches: int) -> tuple[int, int]:
    """Stage activations held at peak, as a fraction (numerator, denominator) of one micro-batch's worth of
    the stage's layers: (p - i, 1) for 1F1B, (chunks in flight, v) for interleaved."""
    if schedule == "interleaved":
        return in_flight_chunks_interleaved(stage, pp, vpp, num_microbatches), vpp
    return in_flight_1f1b(stage, pp, num_microbatches), 1
