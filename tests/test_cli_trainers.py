"""`plan --trainer T` / `scale --trainer T` restrict the search to what T runs; without --trainer the output says
which trainers run the winner and what the others get; an emitted file's header states the prediction for
exactly what it runs, equal to `autotune estimate` on that plan."""

from __future__ import annotations

import json
import re

import pytest

from autotune.catalog import load_model
from autotune.cli import main
from autotune.specs.plan import plan_from_dict
from autotune.specs.job import JobSpec
from autotune.specs.trainers import EMITTED_CAPS, TRAINER_CAPS, as_run, unsupported

JOB = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096")
PIPE = (*JOB, "--pp", "2,4")
MODEL = load_model("llama3-8b")
#: The predicted line of a header, in whatever comment syntax (#, JSON string).
PREDICTED = re.compile(r"predicted: step ([0-9.]+) s, peak memory ([0-9.]+) GiB per GPU, MFU ([0-9.]+)%")


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _json(capsys, *args: str) -> dict:
    code, out, err = _run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def _error(capsys, *args: str) -> str:
    code, out, err = _run(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 1 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), (code, out, err)
    return lines[0]


def _estimate(capsys, plan_file, kernels: str) -> tuple[str, str, str]:
    """`autotune estimate --plan FILE` figures as a header prints them."""
    doc = _json(capsys, "estimate", "--plan", str(plan_file), *JOB, "--kernels", kernels)
    return f"{doc['step_time_s']:.3f}", f"{doc['peak_memory_gib']:.1f}", f"{100 * doc['mfu']:.1f}"


@pytest.mark.parametrize("trainer", list(TRAINER_CAPS))
def test_trainer_alone_restricts_the_search_and_writes_nothing(capsys, tmp_path, monkeypatch, trainer):
    monkeypatch.chdir(tmp_path)
    doc = _json(capsys, "plan", *PIPE, "--trainer", trainer, "--top", "0")
    plan = plan_from_dict(doc["plan"], "plan")
    assert doc["trainer"] == trainer and "trainers" not in doc
    job = JobSpec(global_batch=64, seq_len=4096, trainer=trainer)
    assert unsupported(TRAINER_CAPS[trainer], plan, MODEL, job) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("trainer", ["megatron", "torchtitan", "deepspeed"])
def test_header_equals_estimate_with_no_downgrade_warning(capsys, tmp_path, trainer):
    code, _, err = _run(capsys, "plan", *PIPE, "--trainer", trainer, "--out", str(tmp_path), "--top", "0")
    assert code == 0, err
    assert [w for w in err.splitlines() if w.startswith("warning:") and "model llama3-8b" not in w] == []
    want = _estimate(capsys, tmp_path / "plan.json", trainer)
    headers = [f for f in tmp_path.iterdir() if f.name != "plan.json" and PREDICTED.search(f.read_text())]
    assert headers
    for f in headers:
        assert PREDICTED.search(f.read_text()).groups() == want, f.name


def test_header_of_a_downgraded_plan_is_re_estimated(capsys, tmp_path):
    """A zb-h1 plan (searched without --trainer) emitted for DeepSpeed runs as 1F1B: the header states the
    estimate of that 1F1B plan with DeepSpeed's kernels (what `check` predicts for the file), and names the plan
    as planned."""
    doc = _json(capsys, "plan", *JOB, "--pp", "4", "--schedule", "zb-h1", "--vocab", "ends", "--top", "0",
                "--out", str(tmp_path / "zb"))
    assert doc["trainer"] is None
    code, _, err = _run(capsys, "emit", "--plan", str(tmp_path / "zb" / "plan.json"), "--trainer", "deepspeed",
                        "--out", str(tmp_path / "ds"))
    assert code == 0 and "zero-bubble" in err
    plan = plan_from_dict(doc["plan"], "plan")
    runs, _ = as_run(EMITTED_CAPS["deepspeed"], plan, MODEL)
    assert runs.schedule == "1f1b" and runs != plan
    (tmp_path / "runs.json").write_text(json.dumps(runs.to_dict()))
    want = _estimate(capsys, tmp_path / "runs.json", "deepspeed")
    header = "\n".join(json.loads((tmp_path / "ds" / "ds_config.json").read_text())["_autotune"]["header"])
    assert PREDICTED.search(header).groups() == want
    assert "re-estimated for what deepspeed runs" in header and "planned: " in header and "zb-h1" in header


def test_without_trainer_the_output_names_the_trainers_that_run_the_winner(capsys):
    doc = _json(capsys, "plan", *JOB, "--pp", "4", "--schedule", "zb-h1,1f1b", "--top", "0")
    assert doc["plan"]["schedule"] == "zb-h1" and doc["trainer"] is None
    fits = {f["trainer"]: f for f in doc["trainers"]}
    assert list(fits) == list(TRAINER_CAPS)
    for name, f in fits.items():
        assert not f["runs_best"] and any("zb-h1" in why for why in f["unsupported"])
        if f["status"] in ("OPTIMAL", "FEASIBLE"):  # the same as `plan --trainer T` with the same pins
            alone = _json(capsys, "plan", *JOB, "--pp", "4", "--schedule", "1f1b", "--top", "0", "--trainer", name)
            assert f["best"]["plan"] == alone["plan"] and f["best"]["step_time_s"] == alone["step_time_s"]
        else:
            assert f["status"] == "PINS" and f["note"]
    code, out, _ = _run(capsys, "plan", *JOB, "--pp", "4", "--schedule", "zb-h1,1f1b", "--top", "0")
    assert code == 0 and "runs the best plan as planned: no trainer" in out and "--fork" in out


def test_forks_are_searched_only_when_named(capsys):
    plain = _json(capsys, "plan", *JOB, "--pp", "4", "--trainer", "megatron", "--top", "0")
    assert plain["plan"]["vocab"] != "parallel" and plain["plan"]["schedule"] in ("1f1b", "interleaved")
    fork = _json(capsys, "plan", *JOB, "--pp", "4", "--vocab", "parallel", "--trainer", "megatron", "--fork",
                 "vocab-parallel", "--top", "0")
    assert fork["plan"]["vocab"] == "parallel" and fork["trainer"] == "megatron+vocab-parallel"
    assert "--trainer megatron runs ends,balanced" in _error(capsys, "plan", *JOB, "--vocab", "parallel",
                                                             "--trainer", "megatron")


@pytest.mark.parametrize("args,message", [
    (("--fork", "vocab-parallel"), "--fork vocab-parallel names a fork of a trainer; add --trainer megatron"),
    (("--trainer", "deepspeed", "--fork", "zero-bubble"), "--fork zero-bubble is a fork of megatron"),
    (("--trainer", "megatron", "--fork", "dualpipe"), "--fork 'dualpipe': unknown fork"),
    (("--trainer", "deepspeed", "--schedule", "interleaved"), "--schedule interleaved: --trainer deepspeed runs 1f1b"),
    (("--trainer", "torchtitan", "--cp", "2"), "--cp 2: --trainer torchtitan runs 1"),
    (("--trainer", "megatron", "--strict"), "--strict and --torchtitan-format apply to the launch config"),
])
def test_bad_trainer_options_are_one_line_errors(capsys, args, message):
    assert message in _error(capsys, "plan", *JOB, *args)


def test_scale_with_a_trainer(capsys):
    doc = _json(capsys, "scale", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8,16", "--global-batch",
                "64", "--seq-len", "4096", "--trainer", "deepspeed")
    plans = [plan_from_dict(p["plan"], "plan") for p in doc["points"] if p.get("plan")]
    assert plans
    job = JobSpec(global_batch=64, seq_len=4096, trainer="deepspeed")
    assert all(unsupported(TRAINER_CAPS["deepspeed"], p, MODEL, job) == [] for p in plans)


def test_help_documents_trainer_and_fork(capsys):
    code, out, _ = _run(capsys, "plan", "--help")
    assert code == 0 and "--fork" in out and "vocab-parallel" in out and "zero-bubble" in out


def test_torchtitan_plans_the_hub_config_of_a_model_it_ships(capsys, tmp_path):
    """Qwen3-30B-A3B's config.json is the catalog's qwen3-30b-a3b, which torchtitan ships: planned for it, not
    refused as a model torchtitan lacks."""
    from tests.costmodel.test_moe import HF, HUB_SETTINGS

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF["qwen3_moe"], **HUB_SETTINGS["qwen3_moe"]}))
    doc = _json(capsys, "plan", "--model", str(path), "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "512",
                "--seq-len", "4096", "--trainer", "torchtitan", "--top", "0")
    assert (doc["model_spec"]["name"], doc["model_spec"]["catalog_name"]) == (str(path), "qwen3-30b-a3b")
    assert doc["trainer"] == "torchtitan" and doc["job"]["model"] == str(path)
    doc["model_spec"]["num_layers"] = 40  # a saved plan naming a twin it is not: refused, not emitted as Qwen3
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    assert "catalog_name 'qwen3-30b-a3b' is not this model's catalog twin" in _error(
        capsys, "emit", "--plan", str(tmp_path / "plan.json"), "--trainer", "torchtitan")


def test_deepspeed_pipelines_run_zero_1(capsys):
    """Without ZeRO a DeepSpeed pipeline runs its BF16_Optimizer (a second gradient buffer, master weights sharded,
    weights gathered after the step), which autotune does not cost: its pipelines are planned with ZeRO 1, and a
    pin to ZeRO 0 says so in one line."""
    assert _error(capsys, "plan", *JOB, "--pp", "2", "--zero", "0", "--trainer", "deepspeed") == (
        "error: --zero 0 with --pp 2: --trainer deepspeed runs ZeRO 1 with a pipeline; pin --zero 1 or drop --zero")
    assert _json(capsys, "plan", *JOB, "--pp", "2", "--trainer", "deepspeed")["plan"]["zero"] == 1
    zero0 = plan_from_dict(_json(capsys, "plan", *JOB, "--pp", "2", "--zero", "0")["plan"], "plan")
    assert zero0.zero == 0 and as_run(TRAINER_CAPS["deepspeed"], zero0, MODEL)[0].zero == 1  # what it emits


def test_a_trainer_without_sliding_windows_is_planned_as_it_runs(capsys, tmp_path):
    """Gemma 3's 1024-token windows on 52 of 62 layers: Megatron's config builds none, so `plan --trainer megatron`
    searches the full-attention model its config runs and says so; the header, `check` and `estimate --plan`
    then give the plan's own figures, and `check` finds nothing faster. Without --trainer the windowed plan
    wins and Megatron's row says why it does not run it. torchtitan keeps the window (its own models)."""
    job = ("--model", "gemma3-27b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "8", "--seq-len",
           "32768", "--top", "0")
    code, out, err = _run(capsys, "plan", *job, "--trainer", "megatron", "--brief")
    assert code == 0 and "megatron's config builds no sliding window, so its 52 windowed layers are planned as " \
                         "full attention over 32768 tokens" in err
    step = float(re.search(r"step_s=([0-9.]+)", out).group(1))
    code, out, err = _run(capsys, "plan", *job, "--trainer", "megatron", "--out", str(tmp_path), "--brief")
    assert code == 0 and "so they run full attention over 32768 tokens, as the plan was searched for megatron" in err
    # the document keeps the model as given and the trainer it was searched for, which re-costing applies
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert (doc["model_spec"]["sliding_window"], doc["trainer"]) == (1024, "megatron")
    text = (tmp_path / "launch_megatron.sh").read_text()
    assert float(PREDICTED.search(text).group(1)) == pytest.approx(step, abs=5e-4) and "re-estimated" not in text
    again = _json(capsys, "estimate", "--plan", str(tmp_path / "plan.json"))
    assert again["step_time_s"] == pytest.approx(step, abs=1e-4)
    # compared in a search without --trainer (the window built), the plan is costed so, and that is said
    code, _, err = _run(capsys, "plan", *job, "--compare", str(tmp_path / "plan.json"))
    assert code == 0 and "was searched for megatron, whose config builds no sliding window" in err
    code, _, err = _run(capsys, "plan", *job, "--trainer", "megatron", "--compare", str(tmp_path / "plan.json"))
    assert code == 0 and "was searched for megatron" not in err
    check = _json(capsys, "check", str(tmp_path / "launch_megatron.sh"), "--gpu", "h100-sxm", "--gpus", "16")
    assert check["step_time_s"] == pytest.approx(step, abs=1e-4)
    assert check["check"]["best"]["step_time_s"] >= check["step_time_s"] * (1 - 1e-9)
    windowed = _json(capsys, "plan", *job)
    megatron = {f["trainer"]: f for f in windowed["trainers"]}["megatron"]
    assert any("sliding window: megatron's config builds none" in why for why in megatron["unsupported"])
    assert megatron["best"]["step_time_s"] == pytest.approx(step, abs=1e-4) and windowed["step_time_s"] < step
    assert _json(capsys, "plan", *job, "--trainer", "torchtitan")["model_spec"]["sliding_window"] == 1024


@pytest.mark.parametrize("command", ["plan", "scale"])
def test_a_capacity_factor_a_dropless_trainer_cannot_set_is_refused(capsys, command):
    """plan --trainer torchtitan --moe-capacity-factor priced token dropping torchtitan never does (its emitted
    file, re-estimated dropless, said 11% slower; user-tester): refused, with where dropping is costed."""
    moe = ("--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "512", "--seq-len",
           "4096", "--moe-capacity-factor", "1.0")
    line = _error(capsys, command, *moe, "--trainer", "torchtitan")
    assert "--moe-capacity-factor 1: torchtitan's MoE routes every token (dropless)" in line
    assert "--kernels torchtitan and no --trainer" in line
