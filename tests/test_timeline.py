"""The text pictures of a pipeline: bars and the schedule chart, on the hand timeline of test_schedules."""

from __future__ import annotations

from autotune.costmodel import pipeline
from autotune.render.timeline import bar, schedule_chart


def test_bar_fills_to_the_share_and_marks_overflow():
    assert bar(5, 10, 10) == "#####----- "
    assert bar(15, 10, 4) == "####>"


def test_chart_of_the_two_stage_1f1b_hand_timeline():
    """p = 2, m = 4, f = 1, b = 2: stage 0 runs 12 of 15 time units, stage 1 too (idle 20% each); with one
    cell per unit the rows are the hand timeline of test_schedules.test_two_stage_1f1b_by_hand."""
    tl = pipeline.simulate("1f1b", 2, 1, 4, (((1, 2, 0),), ((1, 2, 0),)))
    lines = schedule_chart(tl, 2, width=15)
    assert lines[0] == "rank  0 |FF..BBFBBFBB.BB| idle 20.0%"
    assert lines[1] == "rank  1 |.FBBFBBFBBFBB..| idle 20.0%"
    assert lines[2].strip().endswith("0 ms")  # the scale line: 15 units of a second end at 15000 ms
