"""`autotune plan --trainer T --out DIR` and `autotune emit` (../shared/CLI.md): launch configs from a plan,
round trips (also through a shell pipe), atomic writes, --strict, and the error path of every bad input.

Every error must be one `error: ...` line on stderr with exit 1, no traceback, and must leave --out as it was.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
from dataclasses import asdict, fields, replace
from pathlib import Path

import pytest

import autotune.fileio
from autotune.catalog import load_model, model_names
from autotune.cli import main
from autotune.cli.launch import document_reestimator
from autotune.emit.document import emit_input_from_document
from autotune.emit import TRAINERS, emit
from autotune.render.estimate import WRITTEN_WHEN_SET
from autotune.specs.model import ModelSpec
from autotune.specs.plan import even_split

REPO = Path(__file__).resolve().parent.parent
JOB = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
       "--time-limit", "20")
#: A pipeline plan (each trainer picks its own ZeRO stage: DeepSpeed runs 1 with a pipeline, Colossal-AI 0).
PIPE = (*JOB, "--pp", "2")
#: An interleaved plan: DeepSpeed has no interleaved schedule, so it warns.
INTERLEAVED = (*JOB, "--pp", "2", "--schedule", "interleaved", "--vpp", "2", "--cp", "1")


def _emitters_present() -> None:
    """The dispatcher imports all three emitter modules; skip only while one is not written yet."""
    for trainer in TRAINERS:
        pytest.importorskip(f"autotune.emit.{trainer}")


def _main(capsys, *args: str, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    """`autotune ...` through `main`, in-process: (exit code, stdout, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _ok(capsys, *args: str, **kw) -> tuple[str, str]:
    code, out, err = _main(capsys, *args, **kw)
    assert code == 0, err
    return out, err


def _one_error(code: int, out: str, err: str) -> str:
    """The contract of a failed command: exit 1, one `error:` line on stderr, no traceback."""
    assert code == 1, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err + out
    return lines[0]


def _listing(directory: Path) -> dict[str, bytes]:
    """Every file under a directory (hidden temporary files included) with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    """`plan --json` documents, computed once: the pipeline plan and the interleaved one."""
    from typer.testing import CliRunner

    from autotune.cli import app

    out = {}
    for name, args in (("pipe", PIPE), ("interleaved", INTERLEAVED)):
        result = CliRunner().invoke(app, ["plan", *args, "--json"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        out[name] = json.loads(result.stdout)
    return out


@pytest.fixture
def plan_file(docs, tmp_path) -> Path:
    path = tmp_path / "saved" / "plan.json"
    path.parent.mkdir()
    path.write_text(json.dumps(docs["pipe"]))
    return path


def _expected(trainer: str, doc: dict, fmt: str = "cli") -> dict[str, str]:
    """The emitter's files for a saved plan, re-estimating what the trainer runs as `autotune emit` does."""
    inp = emit_input_from_document(doc, "plan.json")
    reestimate, inp = document_reestimator(inp, doc)
    inp = replace(inp, reestimate=reestimate)
    return dict(emit(trainer, inp, torchtitan_format=fmt).files)


def _read(directory: Path) -> dict[str, str]:
    return {name: content.decode() for name, content in _listing(directory).items()}


# ------------------------------------------------------------------------------------------------ plan --json
def test_plan_json_carries_what_emit_needs(docs):
    doc = docs["pipe"]
    # every field, but the newer ones a model without them leaves out (earlier releases read the document)
    assert set(doc["model_spec"]) == {f.name for f in fields(ModelSpec)} - set(WRITTEN_WHEN_SET)
    assert doc["model_spec"]["name"] == "llama3-8b" and doc["model_spec"]["num_layers"] == 32
    assert {"model", "gpu", "gpus", "gpus_per_node", "global_batch", "seq_len", "dtype", "flash_attention",
            "fused_kernels"} <= doc["job"].keys()
    assert {"plan", "step_time_s", "mfu", "peak_memory_gib", "breakdown", "solver", "runners_up"} <= doc.keys()


@pytest.mark.parametrize("name", model_names())
def test_model_spec_round_trips(name):
    model = load_model(name)
    doc = {"plan": {"tp": 1, "pp": 1, "dp": 1, "mbs": 1, "num_microbatches": 8,
                    "layers_per_stage": list(even_split(model.num_layers, 1))},
           "model_spec": json.loads(json.dumps(asdict(model))), "step_time_s": 1.0, "peak_memory_gib": 10.0,
           "mfu": 0.5, "job": {"gpu": "h100-sxm", "gpus_per_node": 8, "global_batch": 8, "seq_len": 512}}
    assert emit_input_from_document(doc, "plan.json").model == model
    del doc["model_spec"]
    doc["job"]["model"] = name  # no model_spec: the catalog model named in job.model
    assert emit_input_from_document(doc, "plan.json").model == model


# ------------------------------------------------------------------------------------------------ plan --out
@pytest.mark.parametrize("trainer", TRAINERS)
def test_plan_out_writes_plan_json_and_the_launch_config(trainer, capsys, tmp_path):
    _emitters_present()
    out_dir = tmp_path / "run"
    out, _ = _ok(capsys, "plan", *PIPE, "--trainer", trainer, "--out", str(out_dir))
    written = _read(out_dir)
    saved = json.loads(written.pop("plan.json"))
    assert written == _expected(trainer, saved)
    for name in ["plan.json", *written]:
        assert f"wrote {out_dir / name}" in out
    assert "best plan:" in out and saved["plan"]["pp"] == 2


@pytest.mark.parametrize("trainer", TRAINERS)
def test_emit_from_plan_json_matches_plan_out_byte_for_byte(trainer, capsys, tmp_path):
    _emitters_present()
    _ok(capsys, "plan", *PIPE, "--trainer", trainer, "--out", str(tmp_path / "a"))
    _ok(capsys, "plan", *PIPE, "--trainer", trainer, "--out", str(tmp_path / "b"))
    for name in ("c", "d"):
        out, _ = _ok(capsys, "emit", "--plan", str(tmp_path / "a" / "plan.json"), "--trainer", trainer,
                     "--out", str(tmp_path / name))
        assert f"wrote {tmp_path / name}" in out
    a = _listing(tmp_path / "a")
    a.pop("plan.json")  # holds the solver's wall time, which differs between runs
    b = _listing(tmp_path / "b")
    b.pop("plan.json")
    assert a == b == _listing(tmp_path / "c") == _listing(tmp_path / "d")


def test_plan_json_with_out_adds_the_file_list(capsys, tmp_path, docs):
    _emitters_present()
    out, _ = _ok(capsys, "plan", *PIPE, "--json", "--trainer", "deepspeed", "--out", str(tmp_path))
    doc = json.loads(out)  # stdout stays one JSON object
    assert doc["files"] == [str(tmp_path / n) for n in ("plan.json", "ds_config.json", "ds_pipeline.json",
                                                         "launch_deepspeed.sh", "sbatch_deepspeed.sh")]
    assert doc["trainer"] == "deepspeed" and "model_spec" in doc
    assert "files" not in json.loads((tmp_path / "plan.json").read_text())


def test_plan_out_without_trainer_writes_plan_json_only(capsys, tmp_path):
    out, _ = _ok(capsys, "plan", *PIPE, "--out", str(tmp_path / "run"))
    assert list(_listing(tmp_path / "run")) == ["plan.json"] and "wrote" in out


# ------------------------------------------------------------------------------------------------ shell pipeline
@pytest.mark.parametrize("trainer", TRAINERS)
def test_round_trip_through_a_shell_pipe(trainer, tmp_path, docs):
    _emitters_present()
    exe = shlex.quote(sys.executable)
    out_dir = tmp_path / "out"
    script = (f"set -o pipefail; {exe} -m autotune plan {' '.join(PIPE)} --json | "
              f"{exe} -m autotune emit --trainer {trainer} --plan - --out {shlex.quote(str(out_dir))}")
    env = {k: v for k, v in os.environ.items() if k != "FORCE_COLOR"}
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert _read(out_dir) == _expected(trainer, docs["pipe"])


# ------------------------------------------------------------------------------------------------ output targets
@pytest.mark.parametrize("trainer,fmt", [("megatron", "cli"), ("torchtitan", "cli"), ("torchtitan", "toml"),
                                         ("deepspeed", "cli")])
def test_stdout_for_one_file_out_dir_for_several(trainer, fmt, capsys, monkeypatch, tmp_path, plan_file, docs):
    _emitters_present()
    expected = _expected(trainer, docs["pipe"], fmt)
    args = ("emit", "--plan", str(plan_file), "--trainer", trainer, "--torchtitan-format", fmt)
    monkeypatch.chdir(tmp_path)
    if len(expected) == 1:
        out, _ = _ok(capsys, *args)
        assert out == next(iter(expected.values()))
        _ok(capsys, *args, "--out", str(tmp_path / "single.cfg"))
        # the TOML's run line names the file it is (user-tester: it named torchtitan.toml, which was not written)
        target = str(tmp_path / "single.cfg")
        assert (tmp_path / "single.cfg").read_text() == out.replace("--job.config_file torchtitan.toml",
                                                                     f"--job.config_file {target}")
        assert fmt != "toml" or f"--job.config_file {target} " in (tmp_path / "single.cfg").read_text()
    else:
        message = _one_error(*_main(capsys, *args))
        assert f"writes {len(expected)} files" in message and "--out DIR" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved", *(["single.cfg"] if len(expected) == 1 else [])]
    if len(expected) == 1:  # a single file goes into an existing directory, or one named with a trailing /
        (tmp_path / "dir").mkdir()
        _ok(capsys, *args, "--out", str(tmp_path / "new") + "/")
        assert _read(tmp_path / "new") == expected
    _ok(capsys, *args, "--out", str(tmp_path / "dir"))
    assert _read(tmp_path / "dir") == expected


# ------------------------------------------------------------------------------------------------ --strict
def test_strict_turns_warnings_into_exit_1_and_writes_nothing(capsys, tmp_path, docs):
    _emitters_present()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(docs["interleaved"]))
    code, out, err = _main(capsys, "emit", "--plan", str(path), "--trainer", "deepspeed", "--strict",
                           "--out", str(tmp_path / "out"))
    lines = err.splitlines()
    assert code == 1 and out == "" and "Traceback" not in err
    assert lines[-1].startswith("error: --strict: deepspeed cannot express this plan exactly")
    assert lines[:-1] and all(line.startswith("warning: ") for line in lines[:-1])
    assert any("no interleaved schedule" in line for line in lines)
    assert not (tmp_path / "out").exists()
    _, err = _ok(capsys, "emit", "--plan", str(path), "--trainer", "deepspeed", "--out", str(tmp_path / "out"))
    assert err.splitlines() == lines[:-1]  # without --strict: the same warnings, and the files
    assert sorted(_listing(tmp_path / "out")) == ["ds_config.json", "ds_pipeline.json", "launch_deepspeed.sh",
                                                  "sbatch_deepspeed.sh"]


def test_plan_strict_writes_nothing(capsys, tmp_path):
    """--trainer restricts the search to plans the trainer runs; what is left to warn about is the job
    (torchtitan trains in bf16, not fp16)."""
    _emitters_present()
    code, out, err = _main(capsys, "plan", *PIPE, "--dtype", "fp16", "--trainer", "torchtitan", "--strict",
                           "--out", str(tmp_path / "run"))
    assert code == 1 and out == "" and err.splitlines()[-1].startswith("error: --strict")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------ bad input
def test_strict_without_out_is_an_error(capsys):
    """--trainer alone restricts the search (tests/test_cli_trainers.py); --strict is about the written files."""
    message = _one_error(*_main(capsys, "plan", *PIPE, "--trainer", "megatron", "--strict"))
    assert "--strict and --torchtitan-format apply to the launch config written with --out DIR" in message


def _bad_docs(doc: dict) -> dict[str, tuple[dict | str, str]]:
    no_model = {k: v for k, v in doc.items() if k not in ("model_spec", "mfu")}
    no_model["job"] = {k: v for k, v in doc["job"].items() if k not in ("model", "gpu")}
    bad_layers = json.loads(json.dumps(doc))
    bad_layers["plan"]["layers_per_stage"] = [16, 15]
    bad_heads = json.loads(json.dumps(doc))
    bad_heads["model_spec"]["num_kv_heads"] = 3
    return {
        "missing": (no_model, "missing mfu, job.gpu, model_spec (or job.model)"),
        "layers": (bad_layers, "must be >= 0 and sum to num_layers 32"),
        "model": (bad_heads, "num_heads 32 must be a multiple of num_kv_heads 3"),
        "not-an-object": ([1, 2], "expected a JSON object"),
        "json": ("{not json", "invalid JSON"),
    }


@pytest.mark.parametrize("case", ["missing", "layers", "model", "not-an-object", "json"])
@pytest.mark.parametrize("source", ["file", "stdin"])
def test_bad_plan_documents(case, source, capsys, monkeypatch, tmp_path, docs):
    doc, expected = _bad_docs(docs["pipe"])[case]
    text = doc if isinstance(doc, str) else json.dumps(doc)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    if source == "file":
        (tmp_path / "plan.json").write_text(text)
        code, out, err = _main(capsys, "emit", "--plan", str(tmp_path / "plan.json"), "--trainer", "deepspeed",
                               "--out", str(out_dir))
    else:
        code, out, err = _main(capsys, "emit", "--plan", "-", "--trainer", "deepspeed", "--out", str(out_dir),
                               stdin=text, monkeypatch=monkeypatch)
    assert expected in _one_error(code, out, err)
    assert _listing(out_dir) == {"keep.txt": b"mine"}


def test_plan_for_another_model(capsys, plan_file, tmp_path):
    message = _one_error(*_main(capsys, "emit", "--plan", str(plan_file), "--trainer", "deepspeed",
                                "--model", "llama2-7b", "--out", str(tmp_path / "out")))
    assert message == f"error: {plan_file} is for model llama3-8b, not llama2-7b; drop --model or plan for llama2-7b"
    assert not (tmp_path / "out").exists()
    _emitters_present()
    _ok(capsys, "emit", "--plan", str(plan_file), "--trainer", "deepspeed", "--model", "llama3-8b",
        "--out", str(tmp_path / "out"))


@pytest.mark.parametrize("args,expected", [
    (("--trainer", "nemo"), "--trainer 'nemo': unknown trainer; use one of megatron, torchtitan, "
                            "deepspeed, colossalai"),
    (("--trainer", "torchtitan", "--torchtitan-format", "yaml"), "--torchtitan-format 'yaml'"),
])
def test_bad_options(args, expected, capsys, plan_file, tmp_path):
    message = _one_error(*_main(capsys, "emit", "--plan", str(plan_file), *args, "--out", str(tmp_path / "o")))
    assert expected in message and not (tmp_path / "o").exists()


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_plan_file(what, capsys, tmp_path):
    path = tmp_path / ("nope.json" if what == "missing" else "")
    message = _one_error(*_main(capsys, "emit", "--plan", str(path), "--trainer", "deepspeed"))
    assert "cannot read" in message


def test_emit_needs_plan_and_trainer(capsys):
    assert "--plan" in _one_error(*_main(capsys, "emit", "--trainer", "deepspeed"))


# ------------------------------------------------------------------------------------------------ atomic writes
def test_out_pointing_at_a_file(capsys, plan_file, tmp_path):
    _emitters_present()
    target = tmp_path / "taken"
    target.write_text("mine")
    message = _one_error(*_main(capsys, "emit", "--plan", str(plan_file), "--trainer", "deepspeed",
                                "--out", str(target)))
    assert "exists and is not a directory" in message and target.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved", "taken"]


def test_a_directory_in_place_of_an_output_file(capsys, plan_file, tmp_path):
    _emitters_present()
    (tmp_path / "out" / "ds_pipeline.json").mkdir(parents=True)
    message = _one_error(*_main(capsys, "emit", "--plan", str(plan_file), "--trainer", "deepspeed",
                                "--out", str(tmp_path / "out")))
    assert "is a directory" in message
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["ds_pipeline.json"]


@pytest.mark.parametrize("fail_on", ["fsync", "replace"])
def test_failure_mid_write_leaves_no_partial_files(fail_on, capsys, monkeypatch, tmp_path):
    """An I/O error after the first file is staged (fsync of the second) or at the first move: nothing of the
    new files is left, not even temporary files, and the directory's earlier content is untouched."""
    _emitters_present()
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    (out_dir / "plan.json").write_text("old")
    real = getattr(os, fail_on)
    calls = []
    fail_at = 2 if fail_on == "fsync" else 1  # the second file's fsync, or the first move

    def flaky(*args):
        calls.append(args)
        if len(calls) == fail_at:
            raise OSError(28, "No space left on device")
        return real(*args)

    monkeypatch.setattr(autotune.fileio.os, fail_on, flaky)
    code, out, err = _main(capsys, "plan", *PIPE, "--trainer", "deepspeed", "--out", str(out_dir))
    assert "No space left on device" in _one_error(code, out, err)
    assert _listing(out_dir) == {"plan.json": b"old"}


def test_failed_write_removes_the_directories_it_created(monkeypatch, tmp_path):
    monkeypatch.setattr(autotune.fileio.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(13, "denied")))
    with pytest.raises(autotune.fileio.SpecError, match="cannot write"):
        autotune.fileio.write_files(tmp_path / "a" / "b", [("x.txt", "1"), ("sub/y.txt", "2")])
    assert list(tmp_path.iterdir()) == []


def test_written_files_have_ordinary_permissions(tmp_path):
    (path,) = autotune.fileio.write_files(tmp_path, [("x.txt", "1\n")])
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask and path.read_text() == "1\n"


def test_estimate_json_is_a_plan_document_too(capsys, monkeypatch, tmp_path):
    _emitters_present()
    out, _ = _ok(capsys, "estimate", *JOB[:-2], "--tp", "2", "--pp", "2", "--json")
    _ok(capsys, "emit", "--plan", "-", "--trainer", "deepspeed", "--out", str(tmp_path), stdin=out,
        monkeypatch=monkeypatch)
    assert sorted(_listing(tmp_path)) == ["ds_config.json", "ds_pipeline.json", "launch_deepspeed.sh",
                                          "sbatch_deepspeed.sh"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_out_dir(capsys, plan_file, tmp_path):
    _emitters_present()
    out_dir = tmp_path / "ro"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    out_dir.chmod(0o555)
    try:
        message = _one_error(*_main(capsys, "emit", "--plan", str(plan_file), "--trainer", "deepspeed",
                                    "--out", str(out_dir)))
    finally:
        out_dir.chmod(0o755)
    assert "Permission denied" in message and _listing(out_dir) == {"keep.txt": b"mine"}


def test_a_config_its_trainer_runs_out_of_memory_says_so(autotune_proc, tmp_path):
    """A plan whose config another trainer runs differently (Colossal-AI: no context parallelism, no ZeRO with a
    pipeline) may not fit as that trainer runs it: a warning names the predicted peak, and --strict writes nothing."""
    job = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len", "8192"]
    doc = tmp_path / "plan.json"
    planned = autotune_proc("plan", *job, "--cp", "2", "--tp", "2", "--pp", "2", "--zero", "1", "--json",
                            "--no-timings")
    assert planned.returncode == 0, planned.stderr
    doc.write_text(planned.stdout)
    proc = autotune_proc("emit", "--plan", str(doc), "--trainer", "colossalai", "--out", str(tmp_path / "c"))
    assert proc.returncode == 0 and "it will run out of memory (plan with --trainer colossalai)" in proc.stderr
    strict = autotune_proc("emit", "--plan", str(doc), "--trainer", "colossalai", "--strict", "--out",
                           str(tmp_path / "s"))
    assert strict.returncode == 1 and not (tmp_path / "s").exists()
    fits = autotune_proc("emit", "--plan", str(doc), "--trainer", "megatron", "--out", str(tmp_path / "m"))
    assert fits.returncode == 0 and "run out of memory" not in fits.stderr


@pytest.mark.parametrize(("edit", "message", "estimate_message"), [
    (lambda doc: doc["job"].update(gpus=doc["job"]["gpus"] * 2), "job.gpus 32 but the plan's tp*pp*dp*cp = 16",
     "16 GPUs, but --gpus is 32"),
    (lambda doc: doc["job"].update(model="llama3-70b"), "job.model 'llama3-70b' is not model_spec's name", None),
])
def test_emit_refuses_a_hand_edited_document_as_estimate_does(autotune_proc, tmp_path, edit, message,
                                                              estimate_message):
    planned = autotune_proc("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch",
                            "64", "--seq-len", "4096", "--json", "--no-timings")
    doc = json.loads(planned.stdout)
    edit(doc)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    for args, words in ((("emit", "--plan", str(path), "--trainer", "megatron", "--out", str(tmp_path / "m")),
                         message), (("estimate", "--plan", str(path)), estimate_message or message)):
        proc = autotune_proc(*args)
        assert proc.returncode == 1 and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("trainer", TRAINERS)
def test_emit_warns_once_that_the_config_drops_gemma2s_logit_soft_caps(trainer, capsys, tmp_path):
    """Gemma 2 caps its attention scores and final logits; no emitted config sets that (megatron-core 0.16 has no
    option), so `emit` says so on stderr, once, for every trainer (Megatron's from its emitter, the others' from
    the dispatcher)."""
    _emitters_present()
    _ok(capsys, "plan", "--model", "gemma2-9b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64",
        "--seq-len", "4096", "--time-limit", "20", "--out", str(tmp_path / "p"))
    _, err = _ok(capsys, "emit", "--plan", str(tmp_path / "p" / "plan.json"), "--trainer", trainer, "--out",
                 str(tmp_path / "run"))
    lines = [line for line in err.splitlines() if "soft-capping" in line]
    if trainer == "torchtitan":  # among what torchtitan's llama3 lacks
        assert len(lines) == 1 and "this model has geglu MLP, head_dim 256 != dim / heads, logit soft-capping, " \
            "which needs a model of its own" in lines[0]
        return
    why = ("megatron-core 0.16 has no soft-cap option and Megatron-LM no flag for it" if trainer == "megatron"
           else f"the {trainer} config has no setting for it")
    assert lines == [
        f"warning: gemma2-9b: its logit soft-capping (attention scores 50, final logits 30) is not in the {trainer} "
        f"config ({why}), so the run trains without it: same cost as predicted, but not the published model's logits"]


def test_emit_from_a_document_of_an_unknown_gpu_says_its_figures_are_unchecked(capsys, tmp_path):
    """A plan document whose job.gpu autotune cannot load (a hardware file that moved, a hand edit) is emitted with
    its stored predictions, and stderr says they were not re-checked (user-tester, 2026-11-25)."""
    _emitters_present()
    _ok(capsys, "plan", *PIPE, "--trainer", "megatron", "--out", str(tmp_path / "a"))
    doc = json.loads((tmp_path / "a" / "plan.json").read_text())
    doc["job"]["gpu"] = "nosuchgpu"
    (tmp_path / "edited.json").write_text(json.dumps(doc))
    _, err = _ok(capsys, "emit", "--plan", str(tmp_path / "edited.json"), "--trainer", "megatron", "--out",
                 str(tmp_path / "b"))
    assert "warning: --plan: its job.gpu 'nosuchgpu' cannot be costed" in err
    assert "the files state the document's stored predictions, unchecked" in err


def test_out_named_like_a_file_for_several_files_says_it_is_a_directory(autotune_proc, tmp_path):
    """--out run.sh where Megatron writes two files: a directory of that name, said on stderr (user-tester)."""
    doc = tmp_path / "plan.json"
    planned = autotune_proc("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch",
                            "64", "--seq-len", "4096", "--top", "0", "--json")
    doc.write_text(planned.stdout)
    proc = autotune_proc("emit", "--plan", str(doc), "--trainer", "megatron", "--out", str(tmp_path / "run.sh"))
    assert proc.returncode == 0 and "megatron writes 2 files, so" in proc.stderr
    assert (tmp_path / "run.sh" / "launch_megatron.sh").is_file()


def test_an_unwritable_out_is_refused_before_the_search(capsys, tmp_path, monkeypatch):
    """`plan --out` under a folder it cannot write ran the whole search before 'Permission denied' (user-tester):
    the nearest existing folder is checked first (os.access, stubbed here so that root sees it too)."""
    import autotune.fileio as fileio

    locked = tmp_path / "ro"
    locked.mkdir()
    monkeypatch.setattr(fileio.os, "access", lambda p, mode: os.path.abspath(p) != str(locked))
    searched = []
    monkeypatch.setattr("autotune.cli.plan.check_train_tokens", lambda *a: searched.append(a))
    message = _one_error(*_main(capsys, "plan", *JOB, "--out", str(locked / "run")))
    assert f"--out {locked / 'run'}: {locked} is not writable (Permission denied)" in message and not searched
    assert not (locked / "run").exists()


def test_a_reused_out_directory_names_the_launch_files_this_plan_did_not_write(capsys, tmp_path):
    """plan --trainer megatron --out D, then --trainer deepspeed --out D, left launch_megatron.sh beside a plan.json
    recording deepspeed, without a word (user-tester). Now a warning names them; a fresh directory gets none."""
    _emitters_present()
    out = tmp_path / "run"
    _, err = _ok(capsys, "plan", *JOB, "--trainer", "megatron", "--out", str(out))
    assert "earlier run" not in err
    _, err = _ok(capsys, "plan", *JOB, "--trainer", "deepspeed", "--out", str(out))
    assert (f"warning: --out {out}: launch_megatron.sh, sbatch_megatron.sh from an earlier run sit beside this "
            "plan.json") in err
