"""`autotune scale` and autotune.search.scaling (paper 3 of ../shared/papers.md): the best plan at each GPU count,
time and cost to train, strategy changes and the diminishing-returns point; every derived number is checked
by hand from the returned plans.

Small sweeps (llama3-8b on 8-128 H100s) keep the whole file to a few seconds.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import typing
from dataclasses import replace

import pytest

import autotune.cli.scale
import autotune.search.scaling
from autotune.catalog import load_hardware, load_model
from autotune.errors import SolverLimitError, SpecError
from autotune.render.scale import SCALING_CSV_COLUMNS
from autotune.search.scaling import (
    DEFAULT_TRAIN_TOKENS,
    ScalingResult,
    available_cores,
    global_batch_for_tokens,
    scale,
    strategy_family,
)
from autotune.search.planner import search as real_search
from autotune.search.space import SearchSpace
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan

SIZES = (8, 16, 32, 64, 128)
SWEEP = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8,16,32,64,128", "--global-batch", "128",
         "--seq-len", "4096", "--time-limit", "20")
PRICE = 2.5


@pytest.fixture(scope="module")
def sweep() -> ScalingResult:
    model, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    return scale(model, hw, JobSpec(global_batch=128, seq_len=4096), SIZES, SearchSpace(), train_tokens=1e12,
                 price_per_gpu_hour=PRICE, efficiency_threshold=0.9, time_limit_s=20)


# ------------------------------------------------------------------------------------------------ library
def test_every_size_has_an_optimal_plan_on_its_gpus(sweep):
    assert [p.gpus for p in sweep.points] == list(SIZES)
    for p in sweep.points:
        assert p.status == "OPTIMAL" and p.reason == ""
        assert p.best.plan.num_gpus == p.gpus


def test_throughput_does_not_fall_as_gpus_grow(sweep):
    tput = [p.best.tokens_per_s for p in sweep.points]
    assert tput == sorted(tput)


def test_per_gpu_time_hours_and_cost_by_hand(sweep):
    for p in sweep.points:
        tps = p.best.tokens_per_s
        assert p.tokens_per_s_per_gpu == pytest.approx(tps / p.gpus)
        seconds = 1e12 / tps
        assert p.train_days == pytest.approx(seconds / 86400)
        assert p.gpu_hours == pytest.approx(p.gpus * p.train_days * 24)
        # dollars per million tokens: price x GPUs x hours per token x 1e6
        assert p.cost_per_million_tokens == pytest.approx(PRICE * p.gpus / tps / 3600 * 1e6)


def test_efficiency_strategy_change_and_knee_by_hand(sweep):
    pts = sweep.points
    assert pts[0].efficiency is None and not pts[0].strategy_change
    knee = None
    for prev, cur in itertools.pairwise(pts):
        eff = (cur.best.tokens_per_s / prev.best.tokens_per_s) / (cur.gpus / prev.gpus)
        assert cur.efficiency == pytest.approx(eff)
        assert cur.strategy_change == (strategy_family(cur.best.plan) != strategy_family(prev.best.plan))
        if knee is None and eff < 0.9:
            knee = prev.gpus
    assert sweep.knee_gpus == knee
    for p in pts:
        assert p.past_knee == (knee is not None and p.gpus > knee)


def test_sizes_searched_at_once_give_the_same_sweep(sweep):
    """Two processes (jobs=2) search the sizes at once; each search is deterministic, so the sweep is the same."""
    model, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    parallel = scale(model, hw, JobSpec(global_batch=128, seq_len=4096), SIZES, SearchSpace(), train_tokens=1e12,
                     price_per_gpu_hour=PRICE, efficiency_threshold=0.9, time_limit_s=20, jobs=2)
    assert [replace(p, wall_s=0.0) for p in parallel.points] == [replace(p, wall_s=0.0) for p in sweep.points]
    assert replace(parallel, points=()) == replace(sweep, points=())


def test_a_size_the_restricted_space_cannot_split_is_searched_in_the_fallback(sweep):
    """`scale --profile`: a profile's timed shapes (here tp 1, mbs 8 only) hold a plan at 8 GPUs and none at 128
    (dp 128 x mbs 8 > the batch), where the whole space is searched, as plan does, and the point says so."""
    model, hw, job = load_model("llama3-8b"), load_hardware("h100-sxm"), JobSpec(global_batch=128, seq_len=4096)
    timed = SearchSpace(tp=(1,), pp=(1,), cp=(1,), mbs=(8,))
    result = scale(model, hw, job, (8, 128), timed, fallback=SearchSpace(), time_limit_s=20)
    small, large = result.points
    assert not small.widened and (small.best.plan.tp, small.best.plan.mbs) == (1, 8)
    assert large.widened and large.status == "OPTIMAL" and large.best.plan == sweep.points[-1].best.plan
    assert scale(model, hw, job, (128,), timed, time_limit_s=20).points[0].best is None  # without, no plan


def test_cost_is_none_without_a_price():
    model, hw = load_model("llama3-8b"), load_hardware("h100-sxm")
    res = scale(model, hw, JobSpec(global_batch=64, seq_len=4096), (8,), SearchSpace(), time_limit_s=20)
    assert res.points[0].cost_per_million_tokens is None and res.train_tokens == DEFAULT_TRAIN_TOKENS


@pytest.mark.parametrize(("tp", "pp", "cp", "zero", "family"), [
    (1, 1, 1, 3, "dp FSDP (ZeRO-3)"), (1, 1, 1, 1, "dp (ZeRO-0/1/2)"), (8, 1, 1, 1, "tp"),
    (8, 4, 1, 1, "tp+pp"), (8, 4, 2, 1, "tp+pp+cp"), (2, 1, 1, 3, "tp+ZeRO-3")])
def test_strategy_family(tp, pp, cp, zero, family):
    plan = Plan(tp=tp, pp=pp, dp=2, cp=cp, mbs=1, num_microbatches=4, zero=zero, layers_per_stage=(8,) * pp)
    assert strategy_family(plan) == family


def test_expert_parallelism_is_a_strategy_axis():
    """gpt-oss-20b's tp1 pp1 dp512 ep8 read as 'dp (ZeRO-0/1/2)', so EP arriving or leaving marked no change
    (user-tester)."""
    plan = Plan(tp=1, pp=1, dp=512, cp=1, mbs=2, num_microbatches=1, ep=8, zero=1, layers_per_stage=(24,))
    assert strategy_family(plan) == "ep" and strategy_family(replace(plan, tp=2, ep=4)) == "tp+ep"


def test_tokens_per_step():
    assert global_batch_for_tokens(4 * 2**20, 8192) == 512
    with pytest.raises(SpecError, match="not a multiple of --seq-len"):
        global_batch_for_tokens(5000, 4096)


@pytest.mark.parametrize(("sizes", "kwargs", "match"), [
    ((0, 8), {}, "must be > 0"), ((16, 8), {}, "increasing"), ((8, 8), {}, "increasing"),
    ((8,), {"efficiency_threshold": 1.5}, r"\(0, 1\]"), ((8,), {"efficiency_threshold": 0.0}, r"\(0, 1\]"),
    ((8,), {"price_per_gpu_hour": 0.0}, "price"), ((8,), {"train_tokens": -1.0}, "train-tokens")])
def test_bad_sweeps_are_spec_errors(sizes, kwargs, match):
    with pytest.raises(SpecError, match=match):
        scale(load_model("llama3-8b"), load_hardware("h100-sxm"), JobSpec(global_batch=64, seq_len=4096), sizes,
              SearchSpace(), **kwargs)


# ------------------------------------------------------------------------------------------------ command line
def test_table_plot_and_marks(cli):
    result = cli("scale", *SWEEP, "--price-per-gpu-hour", "2")
    assert result.exit_code == 0, result.output
    out = result.output
    for header in ("GPUs", "strategy", "plan", "tokens/s", "MFU %", "tok/s/GPU", "scaling", "days", "GPU-hours",
                   "$/M tok"):
        assert header in out
    assert "tokens/s per GPU (bars)" in out and "★" in out
    for gpus in SIZES:
        assert any(line.strip().startswith(f"{gpus} |") for line in out.splitlines())


def test_a_piped_table_keeps_every_figure_whole(cli):
    """At the pipe's 120 characters a sweep with a price cut its last column ('$/M to', 67.02 of 67.027;
    user-tester): the plan column wraps between its words instead."""
    args = ("--model", "llama3-70b", "--gpu", "h100-sxm", "--seq-len", "8192", "--global-batch", "64", "--gpus",
            "8,16", "--price-per-gpu-hour", "200")
    out = cli("scale", *args).output
    csv_rows = csv.DictReader(io.StringIO(cli("scale", *args, "--csv").stdout))
    costs = [r for r in csv_rows if r["cost_per_million_tokens"]]
    assert "$/M tok" in out and costs
    rows = [line.split() for line in out.splitlines() if line.strip()]
    for r in costs:  # a row starts with its GPUs, after the marks if any
        assert any(r["gpus"] in cells[:2] and cells[-1] == f"{float(r['cost_per_million_tokens']):.3f}"
                   for cells in rows)


def test_json_keys(cli):
    result = cli("scale", *SWEEP, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {"model", "gpu", "global_batch", "seq_len", "train_tokens", "efficiency_threshold",
            "diminishing_returns_after_gpus", "points"} <= set(doc)
    assert [p["gpus"] for p in doc["points"]] == list(SIZES)
    assert {"status", "family", "strategy_change", "plan", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
            "scaling_efficiency", "past_diminishing_returns", "train_days", "gpu_hours",
            "cost_per_million_tokens"} <= set(doc["points"][0])


def test_csv_header_rows_and_bytes_are_stable(cli):
    first = cli("scale", *SWEEP, "--csv", "--price-per-gpu-hour", "2")
    second = cli("scale", *SWEEP, "--csv", "--price-per-gpu-hour", "2")
    assert first.exit_code == 0, first.output
    assert first.output == second.output
    rows = list(csv.reader(io.StringIO(first.output)))
    assert tuple(rows[0]) == SCALING_CSV_COLUMNS
    assert [int(r[0]) for r in rows[1:]] == list(SIZES)
    row = dict(zip(rows[0], rows[1]))
    assert row["status"] == "OPTIMAL" and float(row["cost_per_million_tokens"]) > 0
    # the whole plan, as --json gives it (layers per stage ';'-separated; ep and etp 1 where absent there)
    plan = json.loads(cli("scale", *SWEEP, "--json", "--price-per-gpu-hour", "2").output)["points"][0]["plan"]
    assert row["layers_per_stage"] == ";".join(map(str, plan["layers_per_stage"]))
    for key in ("tp_mode", "vocab", "bucket_size"):
        assert row[key] == str(plan[key])
    assert row["sequence_parallel"] == str(plan["sequence_parallel"]).lower()
    assert (row["ep"], row["etp"]) == (str(plan.get("ep", 1)), str(plan.get("etp", 1)))


def test_tokens_per_step_is_global_batch_times_seq_len(cli):
    by_batch = cli("scale", *SWEEP[:6], "--global-batch", "64", "--seq-len", "4096", "--csv", "--gpus", "8")
    by_tokens = cli("scale", *SWEEP[:6], "--tokens-per-step", str(64 * 4096), "--seq-len", "4096", "--csv",
                    "--gpus", "8")
    assert by_batch.exit_code == 0 and by_batch.output == by_tokens.output


@pytest.mark.parametrize("args", [
    ("--gpus", "0,8", "--global-batch", "64"), ("--gpus", "8", "--global-batch", "64", "--efficiency-threshold", "1.5"),
    ("--gpus", "8", "--tokens-per-step", "5000"), ("--gpus", "16,8", "--global-batch", "64"),
    ("--gpus", "8", "--global-batch", "64", "--tokens-per-step", str(64 * 4096)),
    ("--gpus", "8", "--global-batch", "64", "--price-per-gpu-hour", "0"),
    ("--gpus", "8", "--global-batch", "64", "--json", "--csv"), ("--gpus", "8,x", "--global-batch", "64"),
    ("--gpus", "8", "--global-batch", "64", "--zero", "7")])
def test_bad_input_exits_1_with_one_line(autotune_proc, args):
    proc = autotune_proc("scale", "--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "4096", *args)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == "" and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1


def test_no_size_fits_exits_2_with_every_row(autotune_proc):
    proc = autotune_proc("scale", "--model", "llama3-405b", "--gpu", "v100-32gb", "--gpus", "8,16",
                         "--global-batch", "64", "--seq-len", "4096", "--time-limit", "20", "--csv")
    assert proc.returncode == 2, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(r["gpus"], r["status"]) for r in rows] == [("8", "INFEASIBLE"), ("16", "INFEASIBLE")]
    assert all("no plan fits" in r["reason"] for r in rows)


def test_a_size_that_does_not_fit_is_a_row_and_exit_0(cli):
    result = cli("scale", "--model", "llama3-8b", "--gpu", "a100-40gb", "--gpus", "1,8", "--global-batch", "64",
                 "--seq-len", "4096", "--time-limit", "20")
    assert result.exit_code == 0, result.output
    assert "no plan (INFEASIBLE" in result.output and "1 GPUs, no plan (INFEASIBLE): no plan fits" in result.output


def test_a_batch_that_cannot_be_split_is_a_row(cli):
    result = cli("scale", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "4,8", "--global-batch", "4",
                 "--seq-len", "4096", "--tp", "1", "--pp", "1", "--cp", "1", "--time-limit", "20", "--json")
    assert result.exit_code == 0, result.output
    points = json.loads(result.output)["points"]
    assert points[0]["status"] == "OPTIMAL" and points[1]["status"] == "INFEASIBLE"
    assert "dp dividing the global batch 4" in points[1]["reason"]


def test_help(cli):
    result = cli("scale", "--help")
    assert result.exit_code == 0
    for flag in ("--gpus", "--tokens-per-step", "--train-tokens", "--price-per-gpu-hour", "--efficiency-threshold",
                 "--csv", "--json", "--time-limit"):
        assert flag in result.output


TINY_SWEEP = ("--model", "tiny-gpt", "--gpu", "h100-sxm", "--gpus", "1,2,4", "--global-batch", "8", "--seq-len",
              "512", "--json", "--no-timings")


def test_json_is_the_same_bytes_for_one_and_two_jobs(cli):
    """Sizes searched in one process or in two give the same document, byte for byte (wall times left out)."""
    serial, parallel = cli("scale", *TINY_SWEEP, "--jobs", "1"), cli("scale", *TINY_SWEEP, "--jobs", "2")
    assert serial.exit_code == 0 and parallel.exit_code == 0, serial.output + parallel.output
    assert [p["status"] for p in json.loads(serial.output)["points"]] == ["OPTIMAL"] * 3
    assert serial.stdout_bytes == parallel.stdout_bytes


def test_available_cores_is_the_affinity_set():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert available_cores() == expected >= 1


def test_jobs_default_to_the_available_cores(cli, monkeypatch):
    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs["jobs"])
        return real_scale(*args, **kwargs)

    real_scale = autotune.cli.scale.scale
    monkeypatch.setattr(autotune.cli.scale, "scale", recording)
    assert cli("scale", *TINY_SWEEP[:4], "--gpus", "1", "--global-batch", "8", "--seq-len", "512").exit_code == 0
    assert cli("scale", *TINY_SWEEP, "--jobs", "3").exit_code == 0
    assert seen == [available_cores(), 3]
    jobs = typing.get_type_hints(autotune.cli.scale.scale_command, include_extras=True)["jobs"].__metadata__[0]
    assert "default: the cores this process may use" in jobs.help and "--jobs" in cli("scale", "--help").output


def test_a_size_stopped_by_the_time_limit_is_shown_and_exits_3(cli, monkeypatch):
    def limited(*args, **kwargs):
        raise SolverLimitError("limit", replace(real_search(*args, **kwargs), status="FEASIBLE", gap=0.1))

    monkeypatch.setattr(autotune.search.scaling, "search", limited)
    result = cli("scale", *SWEEP[:4], "--gpus", "8", "--global-batch", "64", "--seq-len", "4096", "--csv")
    assert result.exit_code == 3
    assert next(csv.DictReader(io.StringIO(result.output)))["status"] == "FEASIBLE"
