"""Context-parallel points in a profile: the file round trip (cp written only where it is not 1) and the lookup
(attention ops only at their own cp, token-only ops at any cp). Hand-made points, no torch."""

from __future__ import annotations

import pytest

from autotune.costmodel.measured import MeasuredOps
from autotune.costmodel.ops import Op
from autotune.specs.profile import Device, Libraries, OpPoint, Profile, dump_profile, load_profile


def _point(name: str, cp: int, flops: float, seconds: float) -> OpPoint:
    return OpPoint(op=name, tp=1, cp=cp, mbs=1, sp=False, flops=flops, bytes=1e6, seconds=seconds, stdev_seconds=0.0,
                   repeats=1)


POINTS = (_point("qkv_proj", 1, 4e9, 4e-3), _point("qkv_proj", 2, 2e9, 2e-3),
          _point("flash_attention", 1, 1e9, 1e-3), _point("flash_attention", 2, 1e9, 3e-3))
PROFILE = Profile(path="p.json", created="2026-01-01", device=Device(kind="cpu", name="Test CPU", threads=1),
                  libraries=Libraries(torch="t", python="p", autotune="a"), model="tiny-gpt", seq_len=256,
                  dtype="bf16", ops=POINTS, comm={})


def test_cp_is_written_only_where_it_is_not_1_and_read_back(tmp_path):
    text = dump_profile(PROFILE)
    lines = [line for line in text.splitlines() if '"op": ' in line]
    assert ['"cp"' in line for line in lines] == [False, True, False, True]
    path = tmp_path / "p.json"
    path.write_text(text)
    assert [p.cp for p in load_profile(path).ops] == [1, 2, 1, 2]


def test_attention_is_read_at_its_own_cp_and_gemms_at_any():
    m = MeasuredOps(PROFILE)
    attention = Op("flash_attention", "attention", 1e9, 1e6, "attention")
    assert m.seconds(attention, 1, 1) == pytest.approx(1e-3) and m.seconds(attention, 1, 2) == pytest.approx(3e-3)
    assert m.seconds(attention, 1, 4) is None  # cp 4 never measured: the roofline, not another cp's point
    gemm = Op("qkv_proj", "gemm", 2e9, 1e6, "gemm")
    assert m.seconds(gemm, 1, 1) == pytest.approx(2e-3) == m.seconds(gemm, 1, 4)  # the cp 2 point, at seq/2 tokens
