"""Issue 16: the fuzz campaign, in `make test`. Hypothesis generates invocations of every command (valid, invalid
and extreme option values) and corrupted input files (truncated, not UTF-8, deeply nested, huge numbers, NaN,
wrong types, hostile names), drives them through `autotune.cli.main` in-process (the entry point a user runs,
under typer's CliRunner isolation), and checks the CLI contract on each one:

- the exit status is 0, 1, 2 or 3 and no exception escapes `main` (no traceback, in the output or anywhere);
- a failure (1, 2) prints exactly one `error:` line on stderr, and stderr holds nothing but `error:`/`warning:`
  lines; a success prints no `error:` line;
- with `--json`, stdout is exactly one JSON object, with no NaN or infinity;
- each case returns within its time limit.

Fixed seed (derandomize) and fixed budgets: the same cases on every run, about 2,300 in all, most of them cheap
validation failures and `estimate` calls on small models (the `plan`/`scale` cases use tiny-gpt and a small
--work-limit). Regressions found by the campaign of the issue are pinned one by one in tests/test_hardening.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autotune.catalog import PROFILES_DIR
from autotune.cli import main
from autotune.emit import TRAINERS

#: Generated cases per test; their sum is the campaign's size (at least 2,000, issue 16).
BUDGET = {"estimate": 850, "model_file": 200, "hardware_file": 200, "profile_file": 150, "emit": 400,
          "calibrate": 120, "profile": 80, "plan": 100, "scale": 40, "misc": 40, "hf_config": 120}
#: Wall-clock bound of one case, seconds: far above what any takes (the slowest, a plan, takes about 1 s), far
#: below the minutes the campaign's runaway calls took.
CASE_LIMIT_S = 30.0
_RUN = {"cases": 0}
_RUNNER = CliRunner()


def fuzz(name: str):
    return settings(max_examples=BUDGET[name], derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def _reject_constant(name: str) -> None:
    raise AssertionError(f"--json printed {name}, which is not JSON")


def run(args: list[str], stdin: bytes | None = None) -> tuple[int, str, str]:
    """One case through `main`, with the contract checked; returns (exit status, stdout, stderr)."""
    _RUN["cases"] += 1
    with _RUNNER.isolation(input=stdin) as streams:
        start = time.perf_counter()
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code
        else:
            raise AssertionError(f"main returned without SystemExit: {args}")
        elapsed = time.perf_counter() - start
        out = streams[0].getvalue().decode(errors="replace")
        err = streams[1].getvalue().decode(errors="replace")
    shown = f"args={args!r}\nexit={code}\nstdout={out[-2000:]}\nstderr={err[-2000:]}"
    assert code in (0, 1, 2, 3), shown
    assert "Traceback" not in out + err, shown
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert all(line.startswith(("error: ", "warning: ")) for line in lines), shown
    if code in (1, 2):
        assert len(errors) == 1, shown
    else:
        assert len(errors) <= (1 if code == 3 else 0), shown
    if "--json" in args and (code == 0 or out.strip()):
        doc = json.loads(out, parse_constant=_reject_constant)  # one document: trailing text is an error
        assert isinstance(doc, dict), shown
    assert elapsed < CASE_LIMIT_S, shown
    return code, out, err


# ------------------------------------------------------------------------------------------------- values
HOSTILE = ["evil\nname", "$(touch MARKER)", "`id`", "a'b\"c", "../../etc/passwd", "x" * 5000, "-rf", "",
           "a\x00b", "ünïcode"]
MODELS = ["tiny-gpt", "bert-large", "gpt-1.7b", "llama3-8b", "llama9-1t", *HOSTILE]
GPUS = ["h100-sxm", "a100-80gb", "v100-32gb", "mi300x", "b200", "tpu-v9", *HOSTILE]
COUNTS = ["1", "2", "4", "8", "16", "32", "60", "3", "0", "-8", "1099511627776", "1e3", "x", ""]
BATCHES = ["1", "8", "16", "64", "512", "0", "-1", "100000000", "65537", "nan", "abc"]
SEQS = ["128", "1024", "4096", "0", "-1", "1048577", "33554432", "1e9", "x"]
DEGREES = ["1", "2", "4", "8", "3", "0", "-1", "1,2", "x", "", "1099511627776", "99999999999999999999999"]
OPTIONS = {
    "--dp": DEGREES, "--cp": DEGREES, "--mbs": ["1", "2", "4", "0", "65537", "x"],
    "--vpp": ["1", "2", "3", "0", "2000"], "--schedule": ["1f1b", "interleaved", "zb-h1", "v-half", "gpipe", "x"],
    "--recompute": ["none", "selective", "full", "some"], "--zero": ["0", "1", "2", "3", "4", "-1"],
    "--vocab": ["ends", "balanced", "parallel", "middle"], "--tp-mode": ["1d", "2d", "2.5d", "3d", "4d"],
    "--layers-per-stage": ["1,1", "2,2", "4", "0,4", "3,1", "x", "99999999,1"],
    "--num-microbatches": ["1", "8", "0", "-1", "999999999"], "--bucket-size": ["1", "0", "-5", "1000000000000"],
    "--dtype": ["bf16", "fp16", "fp8", "int4"], "--gpus-per-node": ["1", "4", "8", "0", "1099511627776"],
    "--grad-reduce": ["fp32", "bf16", "fp64"], "--kernels": ["megatron", "torchtitan", "deepspeed", "colossalai", "x"],
    "--recompute-layers": ["1", "0", "-1", "1000"],
}
FLAGS = ["--no-flash-attention", "--unfused", "--sequence-parallel", "--no-sequence-parallel", "--tp-overlap",
         "--allow-cross-node-tp", "--ops"]
OUTPUTS = [[], ["--json"], ["--brief"], ["--json", "--brief"]]


@st.composite
def options(draw, names: list[str], probability: float = 0.25) -> list[str]:
    args: list[str] = []
    for name in names:
        if draw(st.floats(0, 1)) < probability:
            args += [name, draw(st.sampled_from(OPTIONS[name]))]
    return args


def _job(draw, models: list[str] = MODELS) -> list[str]:
    return ["--model", draw(st.sampled_from(models)), "--gpu", draw(st.sampled_from(GPUS)),
            "--gpus", draw(st.sampled_from(COUNTS)), "--global-batch", draw(st.sampled_from(BATCHES)),
            "--seq-len", draw(st.sampled_from(SEQS))]


# -------------------------------------------------------------------------------------------- estimate
@fuzz("estimate")
@given(data=st.data())
def test_fuzz_estimate_options(data):
    draw = data.draw
    args = ["estimate", *_job(draw), "--tp", draw(st.sampled_from(DEGREES)), "--pp", draw(st.sampled_from(DEGREES))]
    args += draw(options(list(OPTIONS)))
    args += draw(st.lists(st.sampled_from(FLAGS), max_size=2, unique=True))
    args += draw(st.sampled_from(OUTPUTS)) + ["--time-limit", draw(st.sampled_from(["20", "0", "-1", "nan"]))]
    run(args)


# ------------------------------------------------------------------------------------------- input files
BAD_VALUES = ["NaN", "Infinity", "-Infinity", "1e999", "1" + "0" * 400, "-1", "0", "0.5", "true", "null", '"x"',
              "[]", "{}", '"evil\\nname"', '"' + "y" * 300 + '"', "18446744073709551617", "1e-300"]


@st.composite
def corrupted(draw, text: str) -> bytes:
    """A JSON file's text, broken one way: a value replaced, truncated, bytes that are not UTF-8, nested deep,
    a key added or dropped."""
    kind = draw(st.sampled_from(["value", "value", "value", "truncate", "bytes", "nest", "key", "drop", "empty"]))
    if kind == "value":
        doc = json.loads(text)
        keys = [k for k, v in doc.items() if not isinstance(v, (dict, list))]
        key = draw(st.sampled_from(keys))
        doc[key] = "@@"
        return json.dumps(doc).replace('"@@"', draw(st.sampled_from(BAD_VALUES))).encode()
    raw = text.encode()
    if kind == "truncate":
        return raw[:draw(st.integers(0, len(raw) - 1))]
    if kind == "bytes":
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\x00", b"\xed\xa0\x80"])) + raw[at:]
    if kind == "nest":
        depth = draw(st.sampled_from([65, 1000, 100_000]))
        return b"[" * depth + raw + b"]" * depth
    if kind == "key":
        return raw[:-1] + b', "' + draw(st.sampled_from([b"hiden_size", b"sources", b"x"])) + b'": 1}'
    if kind == "drop":
        doc = json.loads(text)
        doc.pop(draw(st.sampled_from(sorted(doc))))
        return json.dumps(doc).encode()
    return b""


MODEL_TEXT = (PROFILES_DIR / "models" / "tiny-gpt.json").read_text()
HARDWARE_TEXT = (PROFILES_DIR / "hardware" / "h100-sxm.json").read_text()
PROFILE_TEXT = (PROFILES_DIR / "measured" / "cpu-tiny-gpt.json").read_text()
SMALL_JOB = ["--gpus", "8", "--global-batch", "16", "--seq-len", "256", "--tp", "2", "--pp", "2"]


@fuzz("model_file")
@given(data=st.data())
def test_fuzz_model_files(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "model.json"
    path.write_bytes(data.draw(corrupted(MODEL_TEXT)))
    run(["estimate", "--model", str(path), "--gpu", "h100-sxm", *SMALL_JOB, *data.draw(st.sampled_from(OUTPUTS))])


#: A Llama-style Hugging Face config.json (with MoE keys), which `--model PATH` reads as well as autotune's format.
HF_TEXT = json.dumps({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                      "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1024, "hidden_act": "silu",
                      "max_position_embeddings": 2048, "tie_word_embeddings": False, "rope_theta": 10000.0,
                      "head_dim": 64, "attention_bias": False, "num_local_experts": 4, "num_experts_per_tok": 2})


@fuzz("hf_config")
@given(data=st.data())
def test_fuzz_hugging_face_configs(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_bytes(data.draw(corrupted(HF_TEXT)))
    run(["estimate", "--model", str(path), "--gpu", "h100-sxm", *SMALL_JOB, *data.draw(st.sampled_from(OUTPUTS))])


@fuzz("hardware_file")
@given(data=st.data())
def test_fuzz_hardware_files(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("h") / "gpu.json"
    path.write_bytes(data.draw(corrupted(HARDWARE_TEXT)))
    run(["estimate", "--model", "tiny-gpt", "--gpu", str(path), *SMALL_JOB, *data.draw(st.sampled_from(OUTPUTS))])


@fuzz("profile_file")
@given(data=st.data())
def test_fuzz_profile_files(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("p") / "profile.json"
    path.write_bytes(data.draw(corrupted(PROFILE_TEXT)))
    run(["estimate", "--model", "tiny-gpt", "--gpu", "h100-sxm", *SMALL_JOB, "--profile", str(path),
         *data.draw(st.sampled_from(OUTPUTS))])


# ------------------------------------------------------------------------------------------------- emit
@pytest.fixture(scope="module")
def plan_text(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("plan")
    code, _, _ = run(["plan", "--model", "tiny-gpt", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                      "--seq-len", "256", "--work-limit", "1", "--out", str(out), "--brief"])
    assert code == 0
    return (out / "plan.json").read_text()


@st.composite
def corrupted_plan(draw, text: str) -> bytes:
    """plan.json broken in a nested place (a value of the plan, the job or the model) or as a whole file."""
    doc = json.loads(text)
    section = draw(st.sampled_from(["plan", "job", "model", "whole"]))
    part = doc.get(section)
    scalars = sorted(k for k, v in part.items() if not isinstance(v, (dict, list))) if isinstance(part, dict) else []
    if not scalars:
        return draw(corrupted(text))
    part[draw(st.sampled_from(scalars))] = "@@"
    return json.dumps(doc).replace('"@@"', draw(st.sampled_from(BAD_VALUES)), 1).encode()


@fuzz("emit")
@given(data=st.data())
def test_fuzz_emit_plan_documents(data, plan_text, tmp_path_factory):
    draw = data.draw
    raw = draw(corrupted_plan(plan_text))
    folder = tmp_path_factory.mktemp("e")
    path = folder / "plan.json"
    path.write_bytes(raw)
    args = ["emit", "--plan", str(path), "--trainer", draw(st.sampled_from([*TRAINERS, "nemo"]))]
    args += draw(st.sampled_from([[], ["--out", str(folder / "out")], ["--strict", "--out", str(folder / "o2")],
                                  ["--torchtitan-format", "toml", "--out", str(folder / "o3")],
                                  ["--model", "tiny-gpt"], ["--out", "/dev/null"]]))
    run(args)


# --------------------------------------------------------------------------------------------- calibrate
RUN_ROW = {"model": "tiny-gpt", "gpu": "h100-sxm", "gpus": "8", "global_batch": "16", "seq_len": "256",
           "dtype": "bf16", "tp": "2", "pp": "2", "dp": "2", "cp": "1", "mbs": "1", "num_microbatches": "8",
           "schedule": "1f1b", "vpp": "1", "recompute": "none", "zero": "1", "sequence_parallel": "true",
           "flash_attention": "true", "step_time_s": "0.01"}
CELLS = ["nan", "inf", "-inf", "-1", "0", "1e400", "x", "", "99999999999999999999", "1099511627776", "3",
         "../../x", "evil name", "0.00001"]


@fuzz("calibrate")
@given(data=st.data())
def test_fuzz_calibrate_runs_files(data, tmp_path_factory):
    draw = data.draw
    rows = []
    for index in range(draw(st.integers(0, 4))):
        row = dict(RUN_ROW, step_time_s=str(0.01 * (1 + index)))
        for key in draw(st.lists(st.sampled_from(sorted(RUN_ROW)), max_size=2)):
            row[key] = draw(st.sampled_from(CELLS))
        rows.append(",".join(row.values()))
    text = "\n".join([",".join(RUN_ROW), *rows]) + "\n"
    raw = text.encode()
    damage = draw(st.sampled_from(["none", "none", "truncate", "bytes", "header"]))
    if damage == "truncate":
        raw = raw[:draw(st.integers(0, len(raw)))]
    elif damage == "bytes":
        raw = raw[:10] + b"\xff\xfe" + raw[10:]
    elif damage == "header":
        raw = raw.replace(b"step_time_s", b"step_time")
    folder = tmp_path_factory.mktemp("c")
    (folder / "runs.csv").write_bytes(raw)
    run(["calibrate", str(folder / "runs.csv"), "--out", str(folder / "cal.json"), "--time-limit", "20",
         *draw(st.sampled_from([[], ["--json"]]))])


# ---------------------------------------------------------------------------------------------- profile
PROFILE_POISON = [["--seq-len", "0"], ["--seq-len", "2097152"], ["--mbs", "0"], ["--mbs", "x"], ["--tp", "0"],
                  ["--tp", "3"], ["--repeats", "0"], ["--repeats", "1001"], ["--device", "tpu"],
                  ["--out", "/dev/null"], ["--model", "llama9-1t"], ["--model", "x" * 300], ["--mbs", "32768"],
                  ["--nproc", "1"], ["--warmup", "-1"], ["--dtype", "fp8"], ["--threads", "0"],
                  ["--min-bytes", "0"], ["--tier", "x", "--comm"], ["--backend", "x", "--comm"],
                  ["--cp", "0"], ["--cp", "x"], ["--seq-len", "64", "--cp", "1,3"]]


@fuzz("profile")
@given(data=st.data())
def test_fuzz_profile_arguments(data, tmp_path_factory):
    """Argument validation of `profile`: every case carries one bad value, so nothing is timed."""
    draw = data.draw
    args = ["profile", "--model", draw(st.sampled_from(["tiny-gpt", "bert-large"])), "--device", "cpu",
            "--repeats", "1", "--warmup", "0", "--tp", "1", "--mbs", "1", "--seq-len", "64",
            "--out", str(tmp_path_factory.mktemp("pr") / "p.json")]
    args += draw(st.sampled_from(PROFILE_POISON)) + draw(st.sampled_from([[], ["--json"]]))
    code, _, _ = run(args)
    assert code != 0


# ----------------------------------------------------------------------------------------- plan, scale
PLAN_PINS = {"--tp": ["1", "2", "1,2", "0", "x"], "--pp": ["1", "2", "1,2", "3"], "--mbs": ["1", "2", "0"],
             "--schedule": ["1f1b", "interleaved,1f1b", "x"], "--recompute": ["none", "full"],
             "--zero": ["0", "1", "0,1"], "--top": ["0", "1", "3", "101", "-1"],
             "--time-limit": ["30", "0", "nan", "inf"], "--work-limit": ["0.3", "0", "-1"]}


@fuzz("plan")
@given(data=st.data())
def test_fuzz_plan(data, tmp_path_factory):
    draw = data.draw
    args = ["plan", "--model", "tiny-gpt", "--gpu", draw(st.sampled_from(["h100-sxm", "a100-80gb", "x" * 300])),
            "--gpus", draw(st.sampled_from(["1", "2", "4", "8", "12", "0"])),
            "--global-batch", draw(st.sampled_from(["8", "16", "7", "0"])),
            "--seq-len", draw(st.sampled_from(["128", "256", "0"])), "--work-limit", "0.3"]
    for flag, values in PLAN_PINS.items():
        if draw(st.floats(0, 1)) < 0.2:
            args += [flag, draw(st.sampled_from(values))]
    args += draw(st.sampled_from([[], ["--json"], ["--brief"], ["--json", "--no-timings"],
                                  ["--out", str(tmp_path_factory.mktemp("o")), "--trainer", "megatron"]]))
    run(args)


@fuzz("scale")
@given(data=st.data())
def test_fuzz_scale(data):
    draw = data.draw
    args = ["scale", "--model", draw(st.sampled_from(["tiny-gpt", "llama3-405b"])), "--gpu", "h100-sxm",
            "--gpus", draw(st.sampled_from(["1,2", "2,4", "8", "4,2", "0", "1,x", "60", "8,16"])),
            "--seq-len", draw(st.sampled_from(["128", "8192"])), "--work-limit", "0.3",
            *draw(st.sampled_from([["--global-batch", "8"], ["--global-batch", "16"], ["--tokens-per-step", "100"],
                                   []]))]
    args += draw(st.sampled_from([[], ["--json"], ["--csv"], ["--brief"], ["--json", "--csv"],
                                  ["--json", "--no-timings"]]))
    run(args)


@fuzz("misc")
@given(args=st.sampled_from([["--version"], ["models", "--json"], ["hardware", "--json"], ["models"], ["hardware"],
                        ["nope"], ["plan"], ["estimate", "--help"], ["--help"], ["plan", "--model"],
                        ["emit", "--plan", "-", "--trainer", "megatron"], ["estimate", "--plan", "-", "--model",
                                                                          "tiny-gpt", "--gpu", "h100-sxm",
                                                                          "--gpus", "8", "--global-batch", "8",
                                                                          "--seq-len", "128"]]),
       stdin=st.sampled_from([b"", b"[" * 100_000, b"{\"plan\": NaN}", b"\xff\xfe", b"{}"]))
def test_fuzz_misc_commands_and_stdin(args, stdin):
    run(args, stdin=stdin)


def test_the_campaign_ran_at_least_2000_cases(request):
    """Counted over this module's fuzz tests, when all of them ran (a -k selection skips the count)."""
    fuzz_tests = [item for item in request.session.items if item.name.startswith("test_fuzz_")]
    if len(fuzz_tests) < len(BUDGET):
        pytest.skip("only some fuzz tests were selected")
    assert sum(BUDGET.values()) >= 2000
    assert _RUN["cases"] >= 2000, _RUN
