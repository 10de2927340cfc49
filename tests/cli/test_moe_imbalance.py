"""--moe-imbalance (issue 14): the busiest expert's tokens over the mean reach the cost model from plan, estimate
and scale; below 1.0 (or not a number) it is a one-line error naming the flag; --help documents it."""

from __future__ import annotations

import json

import pytest

from autotune.cli.options import DEFAULT_MOE_IMBALANCE, build_job
from autotune.errors import SpecError
from autotune.specs.job import JobSpec

JOB = ("--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096")
PLAN = ("--tp", "1", "--pp", "1", "--zero", "3", "--recompute", "full")


def _json(cli, *args: str) -> dict:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_default_is_the_jobspec_default() -> None:
    assert DEFAULT_MOE_IMBALANCE == JobSpec(global_batch=1, seq_len=1).moe_imbalance
    assert build_job(8, 128, "bf16", False, False).moe_imbalance == DEFAULT_MOE_IMBALANCE
    assert build_job(8, 128, "bf16", False, False, moe_imbalance=1.0).moe_imbalance == 1.0


def test_an_imbalance_past_what_top_k_allows_is_refused(cli) -> None:
    """A token's top-k experts are distinct, so no expert gets more than E/k times the mean (Mixtral 8/2 = 4):
    --moe-imbalance 64 priced 221 s and 1.5 TB a GPU (user-tester); 4 is the most a Mixtral run can see."""
    args = ("estimate", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "512",
            "--seq-len", "4096", *PLAN, "--ep", "8")
    with pytest.raises(SpecError, match=r"--moe-imbalance 4.5: mixtral-8x7b's busiest expert gets at most every "
                                        r"token, 8 experts / top-2 = 4 times the mean; give at most 4"):
        cli(*args, "--moe-imbalance", "4.5")
    assert _json(cli, *args, "--moe-imbalance", "4")["step_time_s"] > 0
    # a bound that is no round number is named rounded down, so the value named is taken (reviewer: 8 / top-3)
    from autotune.cli.options import check_moe_flags
    from autotune.catalog import load_model
    from dataclasses import replace
    model = replace(load_model("mixtral-8x7b"), moe_top_k=3)
    with pytest.raises(SpecError, match=r"= 2.66667 times the mean; give at most 2.6666$"):
        check_moe_flags(model, 3.0, "alltoall", None, False)
    check_moe_flags(model, 2.6666, "alltoall", None, False)


def test_estimate_step_time_grows_with_the_imbalance(cli) -> None:
    times = [_json(cli, "estimate", *JOB, *PLAN, "--ep", "8", "--moe-imbalance", x)["step_time_s"]
             for x in ("1.0", "1.25", "2")]
    assert times[0] < times[1] < times[2]
    default = _json(cli, "estimate", *JOB, *PLAN, "--ep", "8")["step_time_s"]
    assert default == times[1]  # 1.25 is the default


def test_plan_and_scale_take_it(cli) -> None:
    balanced = _json(cli, "plan", *JOB, *PLAN, "--ep", "8", "--moe-imbalance", "1.0")
    routed = _json(cli, "plan", *JOB, *PLAN, "--ep", "8")
    assert balanced["step_time_s"] < routed["step_time_s"]
    scaled = _json(cli, "scale", *JOB, *PLAN, "--mbs", "1", "--moe-imbalance", "1.0")
    assert scaled["points"][0]["status"] == "OPTIMAL"


@pytest.mark.parametrize("value", ["0.5", "0.999", "nan", "65"])
def test_out_of_range_is_a_one_line_error(value: str, autotune_proc) -> None:
    proc = autotune_proc("estimate", *JOB, *PLAN, "--ep", "8", "--moe-imbalance", value)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--moe-imbalance" in lines[0] and ">= 1.0" in lines[0], proc.stderr
    with pytest.raises(SpecError, match="--moe-imbalance"):
        build_job(8, 128, "bf16", False, False, moe_imbalance=float(value))


@pytest.mark.parametrize("command", ["plan", "estimate", "scale"])
def test_help_documents_it(command: str, cli) -> None:
    result = cli(command, "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())
    assert "--moe-imbalance" in text and "busiest expert" in text


def test_a_saved_moe_plan_keeps_its_routing_imbalance(tmp_path) -> None:
    """plan.json records the job's MoE imbalance and emit reads it back: re-emitting gives the same bytes (the
    stored predictions match the plan, nothing to re-estimate), where the default 1.25 was assumed before."""
    from autotune.cli import app
    from typer.testing import CliRunner

    runner = CliRunner()
    args = ["--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len",
            "4096", "--moe-imbalance", "1.0", "--trainer", "megatron", "--top", "0"]
    assert runner.invoke(app, ["plan", *args, "--out", str(tmp_path / "p")]).exit_code == 0
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert doc["job"]["moe_imbalance"] == 1.0
    again = runner.invoke(app, ["emit", "--plan", str(tmp_path / "p" / "plan.json"), "--trainer", "megatron",
                                "--out", str(tmp_path / "e")])
    assert again.exit_code == 0 and "stored predictions" not in again.stderr
    assert (tmp_path / "e" / "launch_megatron.sh").read_text() == (tmp_path / "p" / "launch_megatron.sh").read_text()


def test_a_document_past_what_top_k_allows_is_refused_naming_its_key(tmp_path) -> None:
    """A plan document's job.moe_imbalance meets the rule the flag does (E/k), in estimate --plan and emit, and
    the message names the file and its key, not a flag nobody gave (user-tester)."""
    from autotune.cli import app
    from typer.testing import CliRunner

    runner = CliRunner()
    args = ["--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len",
            "4096", "--top", "0", "--json", "--no-timings"]
    done = runner.invoke(app, ["plan", *args])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    doc["job"]["moe_imbalance"] = 6.0
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    expected = (f"{path}: job.moe_imbalance 6: mixtral-8x7b's busiest expert gets at most every token, 8 experts "
                "/ top-2 = 4 times the mean; give at most 4")
    for command in (["estimate", "--plan", str(path)], ["emit", "--plan", str(path), "--trainer", "megatron",
                                                        "--out", str(tmp_path / "e")]):
        with pytest.raises(SpecError) as err:
            runner.invoke(app, command, catch_exceptions=False)
        assert str(err.value) == expected
    assert not (tmp_path / "e").exists()
    # a flag given beside the document is checked as the flag (and then refused for differing from it)
    with pytest.raises(SpecError, match=r"^--moe-imbalance 5: "):
        runner.invoke(app, ["estimate", "--plan", str(path), "--moe-imbalance", "5"], catch_exceptions=False)
