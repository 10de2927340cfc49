"""The profile file format: round trip, deterministic bytes, and one-line errors naming file, line and field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.errors import SpecError
from autotune.specs.profile import (CollectiveFit, CommPoint, CommTier, Device, Libraries, OpPoint, Profile,
                                    dump_profile, key_lines, load_profile, write_profile)

REPO = Path(__file__).resolve().parents[2]


def sample() -> Profile:
    ops = (OpPoint(op="qkv_proj", tp=1, mbs=1, sp=False, flops=2.0e9, bytes=3.0e6, seconds=1.234567891e-3,
                   stdev_seconds=1e-5, repeats=5),
           OpPoint(op="input_norm", tp=2, mbs=2, sp=True, flops=5.0e5, bytes=2.6e5, seconds=4.0e-5,
                   stdev_seconds=0.0, repeats=5))
    tier = CommTier(backend="gloo", nproc=2, alpha_us=50.0, bandwidth_GBps=2.5, max_error_pct=12.5,
                    collectives={"all_reduce": CollectiveFit(alpha_us=40.0, bandwidth_GBps=2.0, max_error_pct=3.0)},
                    points=(CommPoint(collective="all_reduce", bytes=4096, seconds=1e-4, stdev_seconds=1e-6,
                                      repeats=5, fit_error_pct=-2.5),))
    return Profile(path="", created="2026-01-02", device=Device(kind="cpu", name="Test CPU", threads=1),
                   libraries=Libraries(torch="2.13.0", python="3.11.7", autotune="0.1.0"), model="tiny-gpt",
                   seq_len=256, dtype="bf16", ops=ops, comm={"intra_node": tier})


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.json"
    path.write_text(text)
    return path


def test_round_trip_and_deterministic_bytes(tmp_path):
    path = write_profile(sample(), tmp_path / "p.json")
    loaded = load_profile(path)
    assert loaded.path == str(path)
    assert dump_profile(loaded) == path.read_text()  # same bytes after a round trip
    assert loaded.ops[0].seconds == pytest.approx(1.23457e-3)  # 6 significant digits
    assert loaded.comm["intra_node"].collectives["all_reduce"].alpha_us == 40.0
    text = path.read_text()
    assert text.splitlines()[1] == '  "schema": "autotune-profile/1",'
    assert sum(1 for line in text.splitlines() if line.strip().startswith('{"op"')) == 2  # a point per line


def test_comm_only_profile_has_no_model(tmp_path):
    from dataclasses import replace
    p = replace(sample(), model=None, seq_len=None, dtype=None, ops=())
    assert load_profile(write_profile(p, tmp_path / "c.json")).model is None


def test_key_lines_find_nested_keys():
    text = '{\n "a": 1,\n "ops": [\n  {"op": "x"},\n  {"op": "y",\n   "tp": 2}\n ]\n}'
    lines = key_lines(text)
    assert lines[("a",)] == 2 and lines[("ops", 1, "op")] == 5 and lines[("ops", 1, "tp")] == 6


def _error(path: Path) -> str:
    with pytest.raises(SpecError) as exc:
        load_profile(path)
    message = str(exc.value)
    assert "\n" not in message
    return message


def _good_text() -> str:
    return dump_profile(sample())


def _line_of(text: str, needle: str, nth: int = 0) -> int:
    return [i for i, line in enumerate(text.splitlines(), 1) if needle in line][nth]


def test_corrupt_json_names_file_and_line(tmp_path):
    text = _good_text().replace('"dtype": "bf16",', '"dtype": "bf16"')
    message = _error(_write(tmp_path, text))
    assert re.match(rf"{re.escape(str(tmp_path / 'p.json'))}:{_line_of(text, 'dtype') + 1}: invalid JSON", message)
    assert "corrupt or truncated" in message and "autotune profile" in message


def test_truncated_file(tmp_path):
    text = _good_text()
    message = _error(_write(tmp_path, text[: len(text) // 2]))
    assert "invalid JSON" in message and "truncated" in message and "p.json:" in message


def test_wrong_schema_version(tmp_path):
    message = _error(_write(tmp_path, _good_text().replace("autotune-profile/1", "autotune-profile/9")))
    assert re.search(r"p\.json:2: schema: 'autotune-profile/9' is not a version", message)
    assert "re-run `autotune profile`" in message


def test_missing_field_names_the_object_and_the_field(tmp_path):
    text = _good_text()
    data = json.loads(text)
    del data["ops"][1]["seconds"]
    message = _error(_write(tmp_path, dump_profile_dict(data)))
    assert re.search(r"p\.json:\d+: ops\[1\]\.seconds: missing", message)
    assert f":{_line_of(dump_profile_dict(data), 'input_norm')}:" in message


def test_unknown_field(tmp_path):
    text = _good_text().replace('"threads": 1', '"threads": 1,\n    "cores": 4')
    message = _error(_write(tmp_path, text))
    assert f"p.json:{_line_of(text, 'cores')}: device.cores: unknown key" in message


def test_wrong_type_names_the_line_of_the_key(tmp_path):
    text = _good_text().replace('"seq_len": 256', '"seq_len": "256"')
    message = _error(_write(tmp_path, text))
    assert f"p.json:{_line_of(text, 'seq_len')}: seq_len: must be a whole number, got \"256\"" in message
    text = _good_text().replace('"repeats": 5, "fit_error_pct"', '"repeats": true, "fit_error_pct"')
    message = _error(_write(tmp_path, text))
    assert "comm.intra_node.points[0].repeats: must be a whole number" in message


def test_not_an_object(tmp_path):
    assert "p.json:1: <top>: must be a JSON object" in _error(_write(tmp_path, "[1, 2]"))


def dump_profile_dict(data: dict) -> str:
    """The writer's layout for a raw dict (a point per line), to edit files the way a user would."""
    from autotune.specs.profile import _render
    return _render(data, "") + "\n"


def test_cli_exits_1_with_one_line_and_no_traceback(tmp_path, autotune_proc):
    path = _write(tmp_path, _good_text()[:200])
    proc = autotune_proc("estimate", "--model", "tiny-gpt", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8",
                         "--seq-len", "256", "--tp", "1", "--pp", "1", "--profile", str(path))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert f"{path}:" in proc.stderr and "invalid JSON" in proc.stderr


def test_profile_for_another_model_is_an_error(tmp_path, autotune_proc):
    path = write_profile(sample(), tmp_path / "p.json")
    proc = autotune_proc("estimate", "--model", "gpt-1.7b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch",
                         "8", "--seq-len", "256", "--tp", "1", "--pp", "1", "--profile", str(path))
    assert proc.returncode == 1 and "measured for model 'tiny-gpt', not 'gpt-1.7b'" in proc.stderr
    assert "autotune profile --model gpt-1.7b" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_repeated_point_is_named(tmp_path):
    """Two times for one (op, tp, mbs, sp, cp), as merging profiles by hand gives: the lookup would keep one
    silently, so the reader names the second."""
    data = json.loads(_good_text())
    data["ops"].append({**data["ops"][0], "seconds": 100.0})
    message = _error(_write(tmp_path, json.dumps(data, indent=2)))
    assert f"ops[{len(data['ops']) - 1}]" in message and "repeats ops[0]" in message and "keep one" in message


def test_an_unknown_op_name_is_a_one_line_error_naming_it(tmp_path, autotune_proc):
    """A misspelt (hand-edited) op would never be looked up, so its shapes would silently cost by the roofline."""
    from dataclasses import replace
    p = sample()
    path = write_profile(replace(p, ops=(replace(p.ops[0], op="qkv_prj"), p.ops[1])), tmp_path / "p.json")
    proc = autotune_proc("estimate", "--model", "tiny-gpt", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch",
                         "8", "--seq-len", "256", "--tp", "1", "--pp", "1", "--profile", str(path))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "ops[0].op: 'qkv_prj' is not an op the cost model times for tiny-gpt" in proc.stderr
    assert "did you mean 'qkv_proj'?" in proc.stderr and "known ops: " in proc.stderr


def test_a_profile_without_ops_or_comm_is_a_one_line_error(tmp_path, autotune_proc):
    """No ops and no link tiers: the profile measures nothing and the plan would silently be the roofline."""
    from dataclasses import replace
    path = write_profile(replace(sample(), ops=(), comm={}), tmp_path / "p.json")
    proc = autotune_proc("plan", "--model", "tiny-gpt", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8",
                         "--seq-len", "256", "--profile", str(path))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"--profile {path}: the profile has no ops" in proc.stderr
    assert "run `autotune profile --model tiny-gpt" in proc.stderr
