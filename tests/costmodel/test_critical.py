"""critical_paths (many tables at once, in numpy) against critical_path (one table, makespan's loop), which
tests/costmodel/test_schedules.py pins to the pass-by-pass walk."""

import random

import pytest

from autotune.costmodel import critical, pipeline


def _tables(rng: random.Random, pp: int, chunks: int, n: int, integer: bool):
    def one():
        if integer:  # the planner's solver units: small integers, where ties are the rule
            return tuple(tuple(tuple(rng.randint(0, 3) for _ in range(3)) for _ in range(chunks)) for _ in range(pp))
        return tuple(tuple((rng.uniform(0.2, 3), rng.uniform(0.2, 4), rng.uniform(0.1, 2)) for _ in range(chunks))
                     for _ in range(pp))
    return [one() for _ in range(n)]


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "interleaved", "v-half"])
@pytest.mark.parametrize("integer", [False, True])
def test_each_column_is_critical_path_of_its_table_to_the_bit(schedule, integer):
    rng = random.Random(11 + sum(map(ord, schedule)) + integer)
    for _ in range(25):
        pp = rng.randint(1, 6)
        v = {"interleaved": rng.randint(2, 3), "v-half": 2}.get(schedule, 1)
        m = pp * rng.randint(1, 4) if schedule == "interleaved" else rng.randint(1, 3 * pp)
        tables = _tables(rng, pp, v, rng.randint(1, 7), integer)
        ticks = pipeline._ticks(schedule, tables[0], None)
        got = critical.critical_paths(schedule, pp, v, m, tables, ticks)
        want = [critical.critical_path(schedule, pp, v, m, table, ticks) for table in tables]
        assert got == want  # the same lengths and the same passes on each path
        if integer:  # exact: integers stay integers
            assert all(type(total) is int for total, _ in got)
        else:
            assert [repr(total) for total, _ in got] == [repr(total) for total, _ in want]


def test_no_tables_no_paths():
    assert critical.critical_paths("1f1b", 2, 1, 4, [], pipeline.UNIT_TICKS) == []


def test_v_half_needs_its_order_given():
    """v-half's order follows its durations: tables sharing one graph must be told which order."""
    table = (((1.0, 2.0, 1.0), (1.0, 2.0, 1.0)),) * 2
    with pytest.raises(ValueError, match="needs the ticks"):
        critical.critical_paths("v-half", 2, 2, 4, [table], None)
