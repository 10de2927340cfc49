"""Issue 17: names checked where they enter, output paths that stay where they should, and bounded work.

The emitters' own quoting is tested in tests/emit/test_hostile_names.py; interrupts in tests/test_interrupts.py.
Every refusal here is the CLI contract's: exit 1, one `error: ...` line on stderr, no traceback.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.catalog import PROFILES_DIR, load_model
from autotune.cli import main
from autotune.errors import SpecError
from autotune.fileio import slug, write_file, write_files
from autotune.specs.limits import (
    MAX_GPUS,
    MAX_JSON_BYTES,
    MAX_PROFILE_BYTES,
    check_name,
)
from autotune.specs.profile import load_profile

REPO = Path(__file__).resolve().parent.parent
JOB = ("--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096")
PINNED = ("--tp", "2", "--pp", "2", "--cp", "1", "--mbs", "1", "--zero", "1", "--recompute", "selective",
          "--schedule", "1f1b", "--vocab", "ends", "--no-tp-overlap", "--sequence-parallel")
HOSTILE = {
    "newline": "evil\ntouch MARKER",
    "subshell": "$(touch MARKER)",
    "backticks": "`touch MARKER`",
    "quotes": "a'b\"c",
    "nul": "a\x00b",
    "space": "my model",
    "semicolon": "a;b",
    "dash-first": "-rf",
    "empty": "",
    "long": "x" * 201,
}


def _main(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _one_error(code: int, out: str, err: str) -> str:
    assert code == 1, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in out + err
    return lines[0]


@pytest.fixture(scope="module")
def plan_doc() -> dict:
    """A real `plan --json` document (through a process: module scope has no capsys)."""
    proc = subprocess.run([sys.executable, "-m", "autotune", "plan", "--model", "llama3-8b", *JOB, *PINNED, "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ------------------------------------------------------------------------------------------- names at the boundary
@pytest.mark.parametrize("name", ["llama3-8b", "h100-sxm", "gpt-145.6b", "/data/models/Llama-3_8B+x/config.json",
                                  "../configs/llama/config.json", "x" * 200])
def test_names_that_are_accepted(name):
    assert check_name(name, "name", "here") == name


@pytest.mark.parametrize("label", sorted(HOSTILE))
def test_hostile_names_are_refused_with_the_field_and_the_fix(label):
    with pytest.raises(SpecError) as exc:
        check_name(HOSTILE[label], "name", "model file m.json")
    message = str(exc.value)
    assert message.startswith("model file m.json: name ") and "A-Z a-z 0-9 . _ + - /" in message
    assert "\n" not in message and "\x00" not in message


def _model_file(tmp_path: Path, name: str) -> Path:
    data = json.loads((PROFILES_DIR / "models" / "llama3-8b.json").read_text())
    path = tmp_path / "model.json"
    path.write_text(json.dumps({**data, "name": name}))
    return path


def _hardware_file(tmp_path: Path, name: str) -> Path:
    data = json.loads((PROFILES_DIR / "hardware" / "h100-sxm.json").read_text())
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({**data, "name": name}))
    return path


@pytest.mark.parametrize("label", ["newline", "subshell", "nul"])
def test_model_and_hardware_files_with_hostile_names(label, tmp_path, capsys):
    model = _model_file(tmp_path, HOSTILE[label])
    message = _one_error(*_main(capsys, "estimate", "--model", str(model), *JOB, "--tp", "2", "--pp", "2"))
    assert f"{model}: name " in message and "is not a valid name" in message
    gpu = _hardware_file(tmp_path, HOSTILE[label])
    args = ("--model", "llama3-8b", "--gpu", str(gpu), *JOB[2:], "--tp", "2", "--pp", "2")
    message = _one_error(*_main(capsys, "estimate", *args))
    assert f"{gpu}: name " in message and "is not a valid name" in message


def test_a_model_path_outside_the_name_set_is_refused(tmp_path, capsys):
    """A config.json's path becomes the model's name: `$(...)` in a directory name is refused, not run."""
    directory = tmp_path / "$(touch MARKER)"
    directory.mkdir()
    config = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 512,
              "vocab_size": 1000, "model_type": "llama"}
    (directory / "config.json").write_text(json.dumps(config))
    message = _one_error(*_main(capsys, "plan", "--model", str(directory / "config.json"), *JOB, "--json"))
    assert message.startswith("error: --model: path ") and "change the name, or copy the file" in message
    assert not (tmp_path / "MARKER").exists() and not Path("MARKER").exists()


@pytest.mark.parametrize("where", ["job.gpu", "model_spec.name", "job.model"])
def test_plan_documents_with_hostile_names_are_refused_by_emit(where, plan_doc, tmp_path, capsys):
    """The campaign's reproducer: a plan.json someone sends, a newline in a name."""
    doc = json.loads(json.dumps(plan_doc))
    section, key = where.split(".")
    if where == "job.model":
        doc.pop("model_spec")
    doc[section][key] = "evil\ntouch MARKER"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    message = _one_error(*_main(capsys, "emit", "--plan", str(path), "--trainer", "megatron", "--out",
                                str(tmp_path / "out")))
    assert "is not a valid name" in message and "evil\\ntouch" in message  # shown escaped, on one line
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ output paths
def _special_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    server.close()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    return {"fifo": fifo, "socket": sock, "dangling link": dangling}


def test_out_that_is_not_a_regular_file_or_directory_is_refused(plan_doc, tmp_path, capsys):
    """--out on a FIFO, a socket, a dangling link (/dev/null is the same case; see the issue's report)."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan_doc))
    runs = tmp_path / "runs.csv"
    runs.write_text("model\n")
    for label, target in _special_files(tmp_path).items():
        before = os.lstat(target)
        for args in (("emit", "--plan", str(plan_path), "--trainer", "colossalai", "--out", str(target)),
                     ("emit", "--plan", str(plan_path), "--trainer", "deepspeed", "--out", str(target)),
                     ("calibrate", str(runs), "--out", str(target)),
                     ("profile", "--model", "tiny-gpt", "--out", str(target))):
            message = _one_error(*_main(capsys, *args))
            assert message == (f"error: --out {target}: exists and is not a regular file (a device, FIFO, socket or "
                               "broken link); refusing to replace it: choose another --out"), (label, args)
        message = _one_error(*_main(capsys, "plan", "--model", "llama3-8b", *JOB, *PINNED, "--out", str(target)))
        assert message == f"error: --out {target}: exists and is not a directory; give a directory"
        after = os.lstat(target)
        assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino


def test_write_files_refuses_special_targets_and_names_outside_the_directory(tmp_path):
    fifo = _special_files(tmp_path)["fifo"]
    with pytest.raises(SpecError, match="exists and is not a regular file"):
        write_file(fifo, "x")
    for name in ("../escape.txt", "/etc/escape.txt", "a/../../escape.txt", ""):
        with pytest.raises(SpecError, match="not a path inside it"):
            write_files(tmp_path / "out", [("ok.txt", "x"), (name, "y")])
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape.txt").exists()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("text,expected", [
    ("h100-sxm", "h100-sxm"), ("../../etc/passwd", "etc-passwd"), ("/abs/path/config.json", "abs-path-config.json"),
    ("..", "unnamed"), ("a\nb$(c)`d`'e\"", "a-b-c-d-e"), (".hidden", "hidden"), ("x" * 500, "x" * 100),
    ("a\x00b", "a-b"),
])
def test_slug(text, expected):
    assert slug(text) == expected
    assert "/" not in slug(text) and not slug(text).startswith(".")


def test_calibrate_default_name_is_a_slug_of_the_hardware_name(tmp_path, capsys, monkeypatch):
    """`calibrate` without --out names its file after the hardware file's "name": a slug, in the working
    directory, never a path taken from the file (the fit itself is stubbed: this is about the name)."""
    import autotune.cli.calibrate as cli_calibrate

    cal = SimpleNamespace(runs_file=SimpleNamespace(hw_raw={"name": "../../../tmp/evil"}), to_dict=lambda: {}, unfit=())
    monkeypatch.setattr(cli_calibrate, "fit_runs", lambda runs: cal)
    monkeypatch.setattr(cli_calibrate, "write_calibrated", lambda c, target: write_file(target, "{}\n"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "runs.csv").write_text("header\nrow\n")
    code, out, _ = _main(capsys, "calibrate", "runs.csv", "--json")
    assert code == 0 and json.loads(out)["out"] == "tmp-evil-calibrated.json"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["runs.csv", "tmp-evil-calibrated.json", "work"]


def test_profile_default_name_is_a_slug_of_the_model_name(tmp_path, capsys, monkeypatch):
    """`profile` without --out names its file after the model, whose name may be a config.json path."""
    pytest.importorskip("torch")
    import autotune.profiling.optimer as optimer
    from autotune.specs.profile import Device, Libraries, OpPoint, Profile

    def fake_profile(spec, **kw):
        point = OpPoint(op="input_norm", tp=1, cp=1, mbs=1, sp=False, flops=1.0, bytes=1.0, seconds=1e-6,
                        stdev_seconds=0.0, repeats=1)
        return Profile(path="", created="2026-01-02", device=Device(kind="cpu", name="cpu", threads=1),
                       libraries=Libraries(torch="x", python="x", autotune="x"), model=spec.name, seq_len=64,
                       dtype="bf16", ops=(point,), comm={})

    monkeypatch.setattr(optimer, "profile_model", fake_profile)
    config = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 512,
              "vocab_size": 1000, "model_type": "llama"}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, err = _main(capsys, "profile", "--model", "../m/config.json", "--device", "cpu", "--json")
    assert code == 0, err
    assert json.loads(out)["out"] == "cpu-m-config.json.json" and (work / "cpu-m-config.json.json").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["cpu-m-config.json.json"]


# ------------------------------------------------------------------------------------------------ bounded work
@pytest.mark.parametrize("args,expected", [
    (("--gpus", "1099511627776", "--global-batch", "1024"), "--gpus"),
    (("--gpus", "64", "--global-batch", "100000000"), "--global-batch 100000000 exceeds the maximum of 65,536"),
    (("--gpus", "64", "--global-batch", "1024", "--seq-len", "100000000"), "--seq-len 100000000 exceeds"),
])
def test_huge_sizes_return_at_once_with_one_line(args, expected):
    """The issue's commands: `plan --gpus 2^40 --time-limit 5` ran for 24 minutes, `--global-batch 1e8` 229 s."""
    args = ("--seq-len", "8192", *args) if "--seq-len" not in args else args
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "autotune", "plan", "--model", "llama3-8b", "--gpu", "h100-sxm",
                           *args, "--time-limit", "5"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 10
    _one_error(proc.returncode, proc.stdout, proc.stderr)
    assert expected in proc.stderr


def test_scale_gpu_list_has_the_same_maximum(capsys):
    message = _one_error(*_main(capsys, "scale", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus",
                                f"64,{MAX_GPUS + 1}", "--global-batch", "64", "--seq-len", "4096"))
    assert f"every value must be <= {MAX_GPUS:,}" in message


def test_estimate_refuses_a_schedule_too_long_to_simulate(capsys):
    message = _one_error(*_main(capsys, "estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                                "--global-batch", "65536", "--seq-len", "4096", "--tp", "1", "--pp", "8",
                                "--schedule", "v-half"))
    assert "65536 micro-batches x pp 8 x vpp 2 = 1,048,576 pipeline passes exceed the maximum" in message


def test_plan_documents_with_huge_degrees_are_refused(plan_doc, tmp_path, capsys):
    doc = json.loads(json.dumps(plan_doc))
    doc["plan"]["dp"] = 2**40
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    message = _one_error(*_main(capsys, "emit", "--plan", str(path), "--trainer", "deepspeed"))
    assert "dp 1099511627776 exceeds the maximum of 1,048,576" in message


@pytest.mark.parametrize("content,expected", [
    ("[" * 100_000, "nested 100000 levels deep, more than the maximum of 64"),
    ('{"n": ' + "9" * 5000 + "}", "(5,000 digits) is larger than any field takes"),
    ('{"a": "\xff"}', "not UTF-8 text (byte 7 is 0xff)"),
])
def test_malformed_json_inputs_are_one_line(content, expected, tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_bytes(content.encode("latin-1"))
    message = _one_error(*_main(capsys, "estimate", "--model", str(path), *JOB, "--tp", "2", "--pp", "2"))
    assert expected in message


def test_oversized_json_and_profile_files_are_refused_without_reading_them(tmp_path, capsys):
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:  # sparse: the size is what counts
        handle.truncate(max(MAX_JSON_BYTES, MAX_PROFILE_BYTES) + 1)
    message = _one_error(*_main(capsys, "estimate", "--model", str(big), *JOB, "--tp", "2", "--pp", "2"))
    assert f"larger than the maximum of {MAX_JSON_BYTES:,} bytes" in message
    with pytest.raises(SpecError, match=f"larger than the maximum of {MAX_PROFILE_BYTES:,} bytes"):
        load_profile(big)
    message = _one_error(*_main(capsys, "plan", "--model", "llama3-8b", *JOB, "--profile", str(big)))
    assert "larger than the maximum" in message


def test_oversized_plan_on_stdin_is_refused():
    proc = subprocess.run([sys.executable, "-m", "autotune", "emit", "--plan", "-", "--trainer", "deepspeed"],
                          cwd=REPO, input=" " * (MAX_JSON_BYTES + 1), capture_output=True, text=True, timeout=60)
    _one_error(proc.returncode, proc.stdout, proc.stderr)
    assert "more than the maximum" in proc.stderr


def test_catalog_still_loads():
    """Every shipped model and GPU name is a valid name."""
    from autotune.catalog import hardware_names, load_hardware, model_names

    for name in model_names():
        assert load_model(name).name == name
    for name in hardware_names():
        load_hardware(name)
