"""Issue 16: the reproducers of the fuzz campaign, one per kind of failure it found, and the rough edges a new
user met; with issue 17's leftovers (bounded time, timings out of plan.json). Each runs through `main`, the entry
point a user runs, and holds the CLI contract (tests/test_fuzz.py checks it on generated cases)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from autotune.catalog import PROFILES_DIR, load_hardware, parse_json
from autotune.errors import SpecError
from autotune.fileio import json_depth
from autotune.specs.limits import INT_MAXIMA, MAX_JSON_DEPTH
from autotune.specs.profile import load_profile
from tests.test_fuzz import run

TINY = ("--model", "tiny-gpt", "--gpu", "h100-sxm")
SMALL_JOB = ("--gpus", "8", "--global-batch", "16", "--seq-len", "256")
PINS = ("--tp", "2", "--pp", "2")
MODEL = json.loads((PROFILES_DIR / "models" / "tiny-gpt.json").read_text())
HARDWARE = json.loads((PROFILES_DIR / "hardware" / "h100-sxm.json").read_text())
PROFILE_TEXT = (PROFILES_DIR / "measured" / "cpu-tiny-gpt.json").read_text()


def error_line(args: list[str], code: int = 1) -> str:
    got, out, err = run(args)
    assert got == code, (out, err)
    return next(line for line in err.splitlines() if line.startswith("error: "))


def estimate(*extra: str, model: str = "tiny-gpt", gpu: str = "h100-sxm") -> list[str]:
    return ["estimate", "--model", model, "--gpu", gpu, *SMALL_JOB, *PINS, *extra]


# --------------------------------------------------------------------------- UnicodeDecodeError, every loader
@pytest.mark.parametrize("kind", ["model", "hardware", "plan", "profile"])
def test_files_that_are_not_utf8_are_one_line(kind, tmp_path):
    path = tmp_path / f"{kind}.json"
    path.write_bytes(b'{"name": "caf\xe9"}')
    args = {"model": estimate(model=str(path)), "hardware": estimate(gpu=str(path)),
            "plan": ["estimate", *TINY, *SMALL_JOB, "--plan", str(path)],
            "profile": estimate("--profile", str(path))}[kind]
    assert f"{path}: not UTF-8 text (byte 13 is 0xe9); save the file as UTF-8" in error_line(args)


def test_a_runs_file_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_bytes(b"model,gpu\n\xff\xfe\n")
    assert "the runs file: not UTF-8 text" in error_line(["calibrate", str(path)])


def test_a_missing_runs_file_keeps_its_wording(tmp_path):
    assert "nope.csv: cannot read the runs file (No such file or directory)" in error_line(
        ["calibrate", str(tmp_path / "nope.csv")])


# ------------------------------------------------------------------------------- RecursionError, deep nesting
@pytest.mark.parametrize("kind", ["model", "profile", "stdin"])
def test_deeply_nested_json_is_refused_before_parsing(kind, tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    if kind == "stdin":
        code, _, err = run(["estimate", *TINY, *SMALL_JOB, "--plan", "-"], stdin=path.read_bytes())
        assert code == 1 and "nested 100000 levels deep, more than the maximum of 64" in err
        return
    args = estimate(model=str(path)) if kind == "model" else estimate("--profile", str(path))
    assert "nested 100000 levels deep, more than the maximum of 64; give a flatter document" in error_line(args)


def test_json_depth_counts_brackets_outside_strings_only():
    assert json_depth('{"a": [1, {"b": "[[[[{{"}]}') == 3
    assert json_depth("[]") == 1 and json_depth("7") == 0
    parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "x")  # the maximum itself is accepted
    with pytest.raises(SpecError, match="nested 65 levels deep"):
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "x")
    with pytest.raises(SpecError, match="x: NaN is not a JSON number"):
        parse_json('{"a": NaN}', "x")


# ------------------------------------------------------------------------------- NaN, infinity, huge numbers
@pytest.mark.parametrize("literal,message", [
    ("NaN", "NaN is not a JSON number; write a finite number"),
    ("Infinity", "Infinity is not a JSON number"),
    ("1e999", "the number 1e999 is out of range"),
    ("1" + "0" * 30, "hidden_size 1000000000000000000000000000000 exceeds the maximum of 262,144"),
    ("4.5", "hidden_size must be a whole number, got 4.5"),
    ("9" * 5001, "the number 99999999999999999999... (5,001 digits) is larger than any field takes"),
])
def test_nan_infinity_and_huge_sizes_stop_at_the_spec_boundary(literal, message, tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**MODEL, "hidden_size": "@@"}).replace('"@@"', literal))
    assert message in error_line(estimate(model=str(path)))


@pytest.mark.parametrize("key,value,message", [
    ("memory_GiB", 1e308, "memory_GiB 1e+308 exceeds the maximum of 65536"),
    ("bf16_TFLOPs", 1e-300, "bf16_TFLOPs 1e-300 is below the minimum of 0.01"),
    ("gpus_per_node", 2**40, "gpus_per_node 1099511627776 exceeds the maximum of 1,048,576"),
])
def test_hardware_figures_have_a_documented_range(key, value, message, tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({**HARDWARE, key: value}))
    assert message in error_line(estimate(gpu=str(path)))


def test_a_vocabulary_of_10_to_the_300_never_reaches_the_cost_model(tmp_path):
    """The campaign's overflow in ops._gemm / stage_params: exit 0 with inf, or OverflowError, before."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**MODEL, "vocab_size": 10**300}))
    assert f"exceeds the maximum of {INT_MAXIMA['vocab_size']:,}" in error_line(estimate(model=str(path)))


def test_nan_in_a_runs_file_and_huge_degrees_are_one_line(tmp_path):
    path = tmp_path / "runs.csv"
    header = "model,gpu,gpus,global_batch,seq_len,dtype,tp,pp,dp,cp,mbs,num_microbatches,schedule,vpp,recompute," \
             "zero,sequence_parallel,flash_attention,step_time_s"
    row = "tiny-gpt,h100-sxm,8,16,256,bf16,2,2,2,1,1,8,1f1b,1,none,1,true,true,{}"
    path.write_text("\n".join([header, row.format("nan"), row.format("0.1")]) + "\n")
    assert "step_time_s: must be > 0 and finite" in error_line(["calibrate", str(path)])
    path.write_text("\n".join([header, row.replace(",8,16,", ",99999999999999999999,16,").format("0.1"),
                               row.format("0.1")]) + "\n")
    assert "gpus: 99999999999999999999 exceeds the maximum of 1,048,576" in error_line(["calibrate", str(path)])


# ------------------------------------------------------------------------------- OSError: File name too long
@pytest.mark.parametrize("flag", ["--model", "--gpu"])
def test_a_very_long_name_is_the_name_rule_not_an_oserror(flag):
    args = estimate(**{flag[2:]: "n" * 5000})
    assert "is not a valid name: use 1 to 200 characters" in error_line(args)


# ------------------------------------------------------------------------------- profile larger than memory
def test_profile_shapes_larger_than_memory_are_refused_before_allocating(tmp_path, monkeypatch):
    monkeypatch.setattr("autotune.cli.profile.available_memory", lambda kind: 1 << 10)
    line = error_line(["profile", "--model", "llama3-405b", "--device", "cpu", "--seq-len", "8192", "--tp", "1",
                       "--mbs", "1", "--out", str(tmp_path / "p.json")])
    assert "needs about" in line and "but cpu has 9.54e-07 GiB free (no op fits); use a smaller --mbs or" in line
    assert not (tmp_path / "p.json").exists()


def test_profile_leaves_ops_too_large_for_memory_untimed_and_names_them(tmp_path, monkeypatch):
    """A long sequence on one GPU: the loss over the whole vocabulary does not fit, the layer's ops do; the
    profile holds what fits and stderr names the rest, which estimates then charge by the roofline."""
    pytest.importorskip("torch")
    from autotune.catalog import load_model
    from autotune.profiling.optimer import enumerate_jobs

    jobs = enumerate_jobs(load_model("tiny-gpt"), 256, (1,), (1,))
    largest = max(j.op.bytes for j in jobs)
    monkeypatch.setattr("autotune.cli.profile.available_memory", lambda kind: int(largest) - 1)
    out = tmp_path / "p.json"
    code, stdout, err = run(["profile", "--model", "tiny-gpt", "--device", "cpu", "--seq-len", "256", "--tp", "1",
                             "--mbs", "1", "--repeats", "1", "--warmup", "0", "--json", "--out", str(out)])
    assert code == 0, err
    skipped = [j.op.name for j in jobs if j.op.bytes == largest]
    summary = json.loads(stdout)
    assert [s.split()[0] for s in summary["not_timed"]] == skipped
    assert summary["ops"] == len(jobs) - len(skipped)
    assert "not timed, too large for cpu's free memory: " + skipped[0] in err
    written = json.loads(out.read_text())
    timed = {o["op"] for o in written["ops"]}
    assert not timed & set(skipped) and len(timed) == len(jobs) - len(skipped)
    assert written["not_timed"] == summary["not_timed"]
    code, _, err = run(["estimate", "--model", "tiny-gpt", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8",
                        "--seq-len", "256", "--tp", "1", "--pp", "1", "--dp", "8", "--mbs", "1", "--profile", str(out),
                        "--brief"])
    assert code == 0
    assert f"left {', '.join(sorted(skipped))} untimed (too large for the memory of the device that measured it)" in err


def test_profile_refuses_an_unknown_backend_before_starting_torchrun():
    assert "--backend 'x': use gloo, or nccl with --device cuda" in error_line(
        ["profile", "--comm", "--device", "cpu", "--backend", "x"])


# ------------------------------------------------------------------------------- scale exit 2, --json parsing
def test_scale_with_no_fitting_size_says_why_in_one_line():
    code, out, err = run(["scale", "--model", "llama3-405b", "--gpu", "v100-32gb", "--gpus", "8,16",
                          "--global-batch", "16", "--seq-len", "8192", "--json"])
    assert code == 2 and json.loads(out)["points"]
    assert err.startswith("error: no GPU count of 8,16 has a plan that fits (at 16: no plan fits")


def test_json_output_never_holds_nan():
    code, out, _ = run(estimate("--json"))
    assert code == 0
    json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in --json"))


# ------------------------------------------------------------------------------- time limits (issue 17)
def test_estimate_has_a_time_limit():
    start = time.perf_counter()
    line = error_line(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch",
                       "32768", "--seq-len", "4096", "--tp", "1", "--pp", "8", "--time-limit", "0.5"], code=3)
    assert line == "error: estimate: --time-limit 0.5 s reached before it finished; raise --time-limit"
    assert time.perf_counter() - start < 5


def test_plan_time_limit_is_checked_before_any_work():
    assert "--time-limit must be > 0 seconds, got nan" in error_line(["plan", *TINY, *SMALL_JOB, "--time-limit",
                                                                      "nan"])


def test_no_timings_makes_plan_json_byte_identical(tmp_path):
    args = ["plan", *TINY, *SMALL_JOB, "--work-limit", "1", "--json", "--no-timings"]
    first, second = run(args)[1], run(args)[1]
    assert first == second and "wall_s" not in json.loads(first)["solver"]
    assert "wall_s" in json.loads(run(args[:-1])[1])["solver"]  # kept without --no-timings
    run(["plan", *TINY, *SMALL_JOB, "--work-limit", "1", "--out", str(tmp_path), "--brief"])
    assert "wall_s" not in json.loads((tmp_path / "plan.json").read_text())["solver"]


# ------------------------------------------------------------------------------- a newcomer's rough edges
def test_version():
    code, out, _ = run(["--version"])
    assert code == 0 and out.strip() == "autotune 0.1.0"


def test_brief_is_one_line_per_plan():
    code, out, _ = run(["plan", *TINY, *SMALL_JOB, "--work-limit", "1", "--brief", "--top", "0"])
    assert code == 0 and len(out.splitlines()) == 1 and out.startswith("tp=") and "fits=yes" in out
    code, out, _ = run(["plan", *TINY, *SMALL_JOB, "--work-limit", "1", "--brief", "--top", "2"])
    lines = out.splitlines()  # the best plan, then its runners-up, marked
    assert code == 0 and lines[0].startswith("tp=") and len(lines) >= 2
    assert [line.split()[0] for line in lines[1:]] == [f"runner_up={k}" for k in range(1, len(lines))]
    code, out, _ = run(estimate("--brief"))
    assert code == 0 and out.strip().startswith("tp=2 pp=2 dp=2 cp=1 mbs=1 microbatches=8 ")
    assert "recompute_layers" not in out
    code, out, _ = run(estimate("--brief", "--recompute", "full", "--recompute-layers", "1"))
    assert code == 0 and " recompute=full recompute_layers=1 zero=" in out  # partial full recompute is shown
    code, out, _ = run(["scale", *TINY, "--gpus", "1,2,4", "--global-batch", "16", "--seq-len", "256",
                        "--work-limit", "0.5", "--brief"])
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["gpus=1", "gpus=2", "gpus=4"]


def test_top_k_is_k_distinct_plans_that_fit():
    code, out, _ = run(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64",
                        "--seq-len", "4096", "--top", "3", "--json", "--no-timings"])
    doc = json.loads(out)
    assert code == 0 and len(doc["runners_up"]) == 3
    assert all(r["fits"] for r in doc["runners_up"])
    shapes = [json.dumps({k: v for k, v in r["plan"].items() if k not in ("layers_per_stage", "bucket_size")},
                         sort_keys=True) for r in doc["runners_up"]]
    assert len(set(shapes)) == 3


def test_gpu_counts_that_are_not_whole_nodes_are_refused():
    line = error_line(["plan", *TINY, "--gpus", "60", "--global-batch", "60", "--seq-len", "256"])
    assert line == ("error: --gpus 60 is 7.5 nodes of 8 GPUs (h100-sxm); use whole nodes (e.g. --gpus 56 or 64), "
                    "or give --gpus-per-node N if your nodes hold N GPUs")
    assert run(["estimate", *TINY, "--gpus", "60", "--global-batch", "60", "--seq-len", "256", "--tp", "1", "--pp",
                "1", "--gpus-per-node", "4", "--brief"])[0] == 0
    assert run(["estimate", *TINY, "--gpus", "4", "--global-batch", "8", "--seq-len", "256", "--tp", "1", "--pp",
                "1", "--brief"])[0] == 0  # part of one node


def test_a_hardware_file_without_sources_loads(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({k: v for k, v in HARDWARE.items() if k != "sources"}))
    assert load_hardware(str(path)).name == HARDWARE["name"]
    assert run(estimate("--brief", gpu=str(path)))[0] == 0


# ------------------------------------------------------------------------------- profiles
def _profile_with_comm(tmp_path: Path, kind: str, backend: str) -> Path:
    doc = json.loads(PROFILE_TEXT)
    doc["device"]["kind"] = kind
    point = {"collective": "all_reduce", "bytes": 4096, "seconds": 1e-4, "stdev_seconds": 0, "repeats": 1,
             "fit_error_pct": 0}
    doc["comm"] = {"intra_node": {"backend": backend, "nproc": 2, "alpha_us": 10, "bandwidth_GBps": 1,
                                  "max_error_pct": 1, "collectives": {}, "points": [point]}}
    path = tmp_path / "comm.json"
    path.write_text(json.dumps(doc))
    load_profile(path)
    return path


def test_a_comm_profile_from_a_cpu_is_refused_unless_forced(tmp_path):
    path = _profile_with_comm(tmp_path, "cpu", "gloo")
    line = error_line(estimate("--profile", str(path)))
    assert "were timed on cpu" in line and "over gloo, not on h100-sxm over nccl" in line and "--force-profile" in line
    assert run(estimate("--profile", str(path), "--force-profile", "--brief"))[0] == 0


def test_plan_and_estimate_say_how_many_ops_came_from_the_profile():
    shipped = str(PROFILES_DIR / "measured" / "cpu-tiny-gpt.json")
    code, out, _ = run(["plan", *TINY, *SMALL_JOB, "--work-limit", "1", "--profile", shipped, "--json"])
    costs = json.loads(out)["op_costs"]
    assert code == 0 and costs["source"] == shipped and costs["measured_ops"] + costs["roofline_ops"] > 0
    # the job's 256 tokens against the profile's 1024: the warning names the sequence length, what differs
    code, _, err = run(estimate("--profile", shipped, "--mbs", "1", "--cp", "2", "--brief"))
    assert code == 0 and f"warning: --profile {shipped} was measured at --seq-len 1024, the job runs 256" in err
    assert "autotune profile --seq-len 256 --tp 2 --mbs 1" in err
    code, _, err = run([*estimate("--profile", shipped, "--mbs", "1", "--cp", "2", "--brief"), "--seq-len", "1024"])
    assert code == 0 and "warning: the plan's shapes (tp 2, mbs 1, cp 2) are outside --profile" in err


def test_a_hugging_face_config_with_a_list_for_hidden_act_is_one_line(tmp_path):
    """Found by tests/test_fuzz.py: an unhashable value reached a dictionary lookup (TypeError)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                "intermediate_size": 128, "vocab_size": 256, "hidden_act": []}))
    assert "hidden_act [] is not supported" in error_line(estimate(model=str(path)))


def test_a_json_file_with_a_byte_order_mark_reads(tmp_path):
    """Some editors start UTF-8 files with a byte-order mark, which JSON itself does not allow: read past it."""
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
                                                   "num_attention_heads": 4, "intermediate_size": 512,
                                                   "vocab_size": 1000}).encode())
    code, out, err = run(estimate("--brief", model=str(path)))
    assert code == 0 and out.startswith("tp="), err


def test_ops_timed_at_the_plans_shapes_as_another_kernel_are_named_so():
    """The shipped torch-eager 8B profile timed cross_entropy at tp 1, mbs 1, cp 1, but Megatron's fused loss moves
    other bytes, so those two ops fall back to the roofline: the warning said the plan's shapes were outside the
    profile and to measure them again (user-tester); it names the other kernel now."""
    shipped = str(PROFILES_DIR / "measured" / "h100-sxm-llama3-8b.torch-eager.json")
    code, _, err = run(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch",
                        "512", "--seq-len", "8192", "--tp", "1", "--pp", "1", "--zero", "2", "--profile", shipped,
                        "--brief"])
    assert code == 0 and f"--profile {shipped} timed cross_entropy, cross_entropy_bwd at the plan's shapes (tp 1, " \
        "mbs 1, cp 1), but as another kernel" in err and "are outside" not in err


@pytest.mark.parametrize(("args", "advice"), [
    # weights, gradients and Adam alone overshoot: a shorter sequence cannot help (user-tester); bf16 Adam states
    # can (tp8 pp8 at 75.8 GiB)
    (("--model", "llama3.1-405b", "--gpus", "64", "--global-batch", "64", "--seq-len", "8192"),
     "GPU: add GPUs, or --optimizer-states bf16 (bf16 Adam moments and master remainders: half the optimizer state)"),
    (("--model", "llama3.1-405b", "--gpus", "16", "--global-batch", "64", "--seq-len", "8192"), "GPU: add GPUs"),
    # activations past the overshoot: it can
    (("--model", "llama3-8b", "--gpus", "8", "--global-batch", "8", "--seq-len", "262144", "--recompute", "none"),
     "GPU: add GPUs, allow --recompute full, or a shorter --seq-len"),
    # Adam's fp32 state overshoots by less than half of it: Megatron's bf16 states fit (tp1 pp16 ep8, 74 GiB)
    (("--model", "deepseek-v3", "--gpus", "128", "--global-batch", "1024", "--seq-len", "1024"),
     "GPU: add GPUs, or --optimizer-states bf16 (bf16 Adam moments and master remainders: half the optimizer state)"),
])
def test_no_plan_fits_suggests_only_fixes_that_can_close_the_gap(args, advice):
    code, _, err = run(["plan", "--gpu", "h100-sxm", *args])
    assert code == 2 and err.strip().endswith(advice), err
