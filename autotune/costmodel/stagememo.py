"""The stage costs a CostModel keeps between plans (stages.build_stages reads and fills them): per plan shape
(every field but the partition) its stages, for plans that differ only in their partition; and shared between
shapes that differ only in what they do not read, the stages' times and their state bytes (a sweep meets most
shapes once, but the same stage times under every ZeRO stage and schedule, the same bytes under every
recomputation)."""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter

from autotune.costmodel.pipeline import Ticks
from autotune.costmodel.stages import base_recompute
from autotune.specs.plan import Plan

#: Plan shapes (every field but the partition) whose stage costs CostModel keeps for other partitions
STAGE_MEMO_PLANS = 256
#: Plan shapes whose stage times, and whose state bytes, CostModel keeps for plans that differ elsewhere (a few
#: tuples per shape: a sweep returns to a shape thousands of plans later)
STAGE_PART_PLANS = 4096
#: The Plan fields a stage's cost depends on besides its own layer count and index: all but the partition
PLAN_SHAPE_FIELDS = tuple(f.name for f in fields(Plan) if f.name != "layers_per_stage")
_plan_shape = attrgetter(*PLAN_SHAPE_FIELDS)  # their values as a tuple, read in C
#: What stages.stage_times reads of a plan but its schedule and ZeRO stage (_time_shape)
_time_fields = attrgetter("tp", "cp", "mbs", "sequence_parallel", "tp_mode", "tp_overlap", "ep", "etp", "ep_overlap",
                          "vocab", "pp", "vpp", "dp", "recompute", "recompute_layers")
#: What stages.stage_state reads of a plan but its schedule (_state_shape)
_state_fields = attrgetter("tp", "cp", "mbs", "sequence_parallel", "tp_mode", "tp_overlap", "ep", "etp", "ep_overlap",
                           "vocab", "pp", "vpp", "dp", "zero")


def shape_memo(memos: tuple[dict, dict, dict], plan: Plan, ticks: Ticks, p2p_s: float,
               vp_comm: tuple[float, float]) -> dict:
    """The memo build_stages is handed for `plan`, from a CostModel's `memos` of shapes, stage times and state
    bytes. Keyed on what build_stages reads besides the partition: the costs it is handed follow from the
    plan's fields, but are keyed on too, so a memo never serves stages of other inputs."""
    shapes, times, states = memos
    shape = (*_plan_shape(plan), ticks, p2p_s, vp_comm)
    memo = shapes.get(shape)
    if memo is None:
        memo = _bounded_put(shapes, shape, {"times": _shared_part(times, (*_time_shape(plan), ticks, p2p_s, vp_comm)),
                                            "states": _shared_part(states, _state_shape(plan))}, STAGE_MEMO_PLANS)
    return memo


def _time_shape(plan: Plan) -> tuple:
    """The plan's fields a stage's times depend on. Of the schedule only whether it is v-half (chunks per rank,
    where the head sits: 1F1B, interleaved and ZB-H1 run the same stages in another order); ZeRO 0 and 1 move
    no traffic inside the step."""
    return (*_time_fields(plan), plan.schedule == "v-half", max(plan.zero, 1))


def _state_shape(plan: Plan) -> tuple:
    """The plan's fields a stage's state bytes depend on: not its recomputation, but for the base setting the
    vocabulary layers (with multi-token prediction) are costed at; of the schedule, as _time_shape."""
    return (*_state_fields(plan), plan.schedule == "v-half", base_recompute(plan))


def _shared_part(memo: dict, key: tuple) -> dict:
    """The dict of stage times or state bytes kept at `key`, a new one if none is."""
    part = memo.get(key)
    return _bounded_put(memo, key, {}, STAGE_PART_PLANS) if part is None else part


def _bounded_put(memo: dict, key: tuple, value: dict, bound: int) -> dict:
    """memo[key] = value, first dropping the oldest entry of a memo that holds `bound`."""
    if len(memo) >= bound:
        del memo[next(iter(memo))]
    memo[key] = value
    return value
