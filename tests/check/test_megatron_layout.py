"""--pipeline-model-parallel-layout read back (check/megatron_layout.py): refused exactly where megatron-core's own
validate_layer_layout refuses it (megatron-core 0.16, on CPU), with the MTP rules."""

from __future__ import annotations

import pytest

from autotune.check.megatron_layout import check_layout, layout_issue, parse_layout
from autotune.errors import SpecError

#: (layout, pp, decoder layers, mtp layers): the DeepSeek-V3 shapes Megatron-Bridge uses and the mistakes a hand
#: edit makes (dropped or moved m, m before t, E or L moved, split m)
LAYOUTS = [
    ("Et*6|t*8|t*8|t*6mL", 4, 28, 1),                 # emitted
    ("Et*6|t*8|t*8|t*6L", 4, 28, 1),                  # m dropped, --mtp-num-layers kept
    ("Et*6|t*8|t*8|t*6mL", 4, 28, 0),                 # m kept, flag dropped
    ("Et*6|t*8|t*8|t*6mL", 4, 28, 2),                 # one m for two modules
    ("Et*6|t*8|t*8|mt*6L", 4, 28, 1),                 # m before decoder layers
    ("Et*6|t*8|t*8|t*6Lm", 4, 28, 1),                 # m after L
    ("t*6|Et*8|t*8|t*6mL", 4, 28, 1),                 # E not first
    ("Et*6|t*8|t*8m|t*6L", 4, 28, 1),                 # m on an earlier rank, decoder layers after it
    ("Et*7|t*7|t*7|t*7|m|L", 3, 28, 1),               # standalone MTP: its own stage (vpp 2)
    ("Et*4|(t*4|)*14t,mL", 16, 61, 1),                # Megatron-Bridge pp 16
    ("Et|(tt|)*30mL", 16, 61, 1),                     # Megatron-Bridge pp 16 x vp 2 (as a string)
    ("Et|(tt|)*29tm|tL", 16, 61, 1),                  # m in a rank's first chunk
    ("Et*4|t*4m|t*4m|L", 2, 12, 2),                   # m split over two stages
    ("Et*4|t*4|t*4|mmL", 2, 12, 2),                   # two modules together
]


def _megatron_refuses(layout: str, pp: int, layers: int, mtp: int) -> bool:
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    try:
        PipelineParallelLayerLayout(layout, pp).validate_layer_layout(layers, mtp or None)
    except AssertionError:
        return True
    return False


@pytest.mark.parametrize(("layout", "pp", "layers", "mtp"), LAYOUTS)
def test_refused_exactly_where_megatron_core_refuses(layout: str, pp: int, layers: int, mtp: int) -> None:
    pytest.importorskip("megatron.core")
    assert sum(parse_layout(layout)) == layers
    assert bool(layout_issue(layout, pp, mtp)) == _megatron_refuses(layout, pp, layers, mtp), layout_issue(
        layout, pp, mtp)


#: layouts megatron-core's parser itself refuses (parse_str_to_list: one pass per repeat pattern, then only
#: E, t, L, m and | are layers), and the same shapes written as it reads them
PARSED = [
    ("Et*4 | t*4L", 2, False),         # a space
    ("((t*2)*2|)*2", 2, False),        # nested groups are not unrolled
    ("E(t*2)*2|t*4L", 2, True),
    ("Et*3,t|t*4,L", 2, True),         # cosmetic commas
    ("Ex*4|t*4L", 2, False),           # not a layer
]


@pytest.mark.parametrize(("layout", "pp", "accepted"), PARSED)
def test_read_as_megatron_core_reads_it(layout: str, pp: int, accepted: bool) -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    try:
        expected = [sum(1 for x in stage if x.name == "decoder")
                    for stage in PipelineParallelLayerLayout.parse_str_to_list(layout)]
    except AssertionError:
        expected = None
    assert (expected is not None) == accepted
    if accepted:
        assert parse_layout(layout) == expected
    else:
        with pytest.raises(SpecError, match="is not a layer"):
            parse_layout(layout)


def test_a_huge_repeat_is_refused_before_it_is_unrolled() -> None:
    with pytest.raises(SpecError, match="unrolls to more than"):
        parse_layout("E(t*4|)*999999999L")


def test_a_refusal_is_one_line_naming_the_rule() -> None:
    with pytest.raises(SpecError, match=r"holds 0 MTP layer\(s\) m, but --mtp-num-layers is 1") as err:
        check_layout("Et*6|t*8|t*8|t*6L", 4, 1, [])
    assert "\n" not in str(err.value)


def test_standalone_mtp_is_noted() -> None:
    notes: list[str] = []
    check_layout("Et*7|t*7|t*7|t*7|m|L", 3, 1, notes)
    assert any("standalone MTP" in n for n in notes)
    notes.clear()
    check_layout("Et*4|(t*4|)*14t,mL", 16, 1, notes)
    assert notes == []
