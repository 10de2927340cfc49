"""`plan` and `scale` give the same answer whatever the machine is doing: run as a user runs them (a
subprocess), once unhurried and once beside a second process that keeps a CPU busy, they print the same
documents (but for wall-clock seconds); the deterministic --work-limit stops them at the same point every
time. A wall-clock --time-limit too small for any search says so (exit 3) and still returns a plan no slower
than the even split of its own strategy (issue 13: `scale` once returned [13,1,1,...,14] at 16384 GPUs)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.estimate import CostModel
from autotune.specs.job import JobSpec
from autotune.specs.plan import DEFAULT_BUCKET, Plan, even_split, plan_from_dict

SMALL = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--global-batch", "64", "--seq-len", "4096")
PLAN = ("plan", *SMALL, "--gpus", "16", "--json")
SCALE = ("scale", *SMALL, "--gpus", "8,16,32", "--json")
TINY = ("--time-limit", "0.001")


@contextmanager
def busy_cpu() -> Iterator[None]:
    """A second process spinning on a CPU while the block runs (this machine may have only two)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def _run(autotune_proc, *args: str) -> tuple[int, dict]:
    proc = autotune_proc(*args)
    assert proc.returncode in (0, 3), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _without_timings(doc: dict) -> dict:
    """The document as the answer: everything but the wall-clock seconds."""
    doc = json.loads(json.dumps(doc))
    doc.get("solver", {}).pop("wall_s", None)
    for point in doc.get("points", ()):
        point.pop("wall_s", None)
    return doc


def even_split_time(plan: Plan, cm: CostModel | None = None) -> float:
    """Step time of the even split of the plan's strategy, as a user would write it: the same degrees,
    micro-batching, schedule and savers, layers even over the stages, the least full recomputation that fits
    and Megatron's default bucket (cm: llama3-8b on H100s, global batch 64 x 4096, unless given)."""
    cm = cm or CostModel(load_model("llama3-8b"), load_hardware("h100-sxm"), JobSpec(global_batch=64, seq_len=4096))
    layers = tuple(plan.vpp * k for k in even_split(cm.model.num_layers // plan.vpp, plan.pp))
    even = replace(plan, layers_per_stage=layers, bucket_size=DEFAULT_BUCKET,
                   vocab="parallel" if plan.vocab == "parallel" else "ends")
    if plan.recompute == "selective":
        options = [even]
    else:
        options = [replace(even, recompute="none", recompute_layers=None)]
        options += [replace(even, recompute="full", recompute_layers=r) for r in range(1, max(layers) // plan.vpp)]
        options += [replace(even, recompute="full", recompute_layers=None)]
    fitting = [e for e in map(cm.estimate, options) if e.fits]
    assert fitting, plan
    return fitting[0].step_time_s


def test_plan_is_the_same_beside_a_busy_cpu(autotune_proc) -> None:
    code, calm = _run(autotune_proc, *PLAN)
    with busy_cpu():
        busy_code, loaded = _run(autotune_proc, *PLAN)
    assert code == busy_code == 0 and calm["solver"]["status"] == "OPTIMAL"
    assert _without_timings(calm) == _without_timings(loaded)


def test_a_work_limit_stops_the_search_at_the_same_point(autotune_proc) -> None:
    """llama3-70b on 64 GPUs needs about 30 solves (0.003 s of CP-SAT deterministic time) to prove its plan."""
    args = ("plan", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "128",
            "--seq-len", "4096", "--top", "0", "--json", "--work-limit", "0.001")
    code, calm = _run(autotune_proc, *args)
    with busy_cpu():
        busy_code, loaded = _run(autotune_proc, *args)
    assert code == busy_code == 3
    assert calm["solver"]["status"] == "FEASIBLE" and calm["solver"]["limit"] == "work"
    assert _without_timings(calm) == _without_timings(loaded)
    model, hw = load_model("llama3-70b"), load_hardware("h100-sxm")
    even = even_split_time(plan_from_dict(calm["plan"], "plan"), CostModel(model, hw, JobSpec(global_batch=128,
                                                                                             seq_len=4096)))
    assert calm["step_time_s"] <= even * (1 + 1e-9)


def test_a_tiny_time_limit_says_so_and_is_no_worse_than_the_even_split(autotune_proc) -> None:
    _, calm = _run(autotune_proc, *PLAN)
    with busy_cpu():
        code, hurried = _run(autotune_proc, *PLAN, *TINY)
    assert code == 3 and hurried["solver"]["limit"] == "time"
    assert hurried["step_time_s"] >= calm["step_time_s"] * (1 - 1e-9)
    assert hurried["step_time_s"] <= even_split_time(plan_from_dict(hurried["plan"], "plan")) * (1 + 1e-9)


def test_scale_is_the_same_beside_a_busy_cpu(autotune_proc) -> None:
    code, calm = _run(autotune_proc, *SCALE)
    with busy_cpu():
        busy_code, loaded = _run(autotune_proc, *SCALE)
    assert code == busy_code == 0
    assert _without_timings(calm) == _without_timings(loaded)


def test_scale_under_a_tiny_time_limit_has_a_plan_per_size_no_worse_than_the_even_split(autotune_proc) -> None:
    _, calm = _run(autotune_proc, *SCALE)
    code, hurried = _run(autotune_proc, *SCALE, *TINY)
    assert code in (0, 3)
    if code == 0:  # every size proven before the limit (these need no CP-SAT solve): the unhurried answer
        assert [p["plan"] for p in hurried["points"]] == [p["plan"] for p in calm["points"]]
    for fast, point in zip(calm["points"], hurried["points"]):
        assert point["status"] in ("OPTIMAL", "FEASIBLE") and point["plan"] is not None
        assert point["step_time_s"] >= fast["step_time_s"] * (1 - 1e-6)
        assert point["step_time_s"] <= even_split_time(plan_from_dict(point["plan"], "plan")) * (1 + 1e-6)


def test_a_struck_clock_bounds_only_the_blocks_it_needs(monkeypatch) -> None:
    """When the wall clock strikes before the candidates are bounded, the search bounds the next block only while
    no plan is known, instead of sharpening every candidate one by one (Qwen3-30B-A3B on 128 H100s with
    --time-limit 1 took 35 s that way): the plan comes from the first block, and the unexplored candidates keep the
    trivial bound 0, so the status is FEASIBLE with the whole step as the gap."""
    import autotune.search.planner as planner
    from autotune.search.space import SearchSpace

    blocks = []
    real = planner.coarse_bounds
    monkeypatch.setattr(planner, "coarse_bounds", lambda cm, cands, memo: blocks.append(len(cands))
                        or real(cm, cands, memo))
    res = planner.search(load_model("llama3-8b"), load_hardware("h100-sxm"), JobSpec(global_batch=512, seq_len=4096),
                         64, SearchSpace(), time_limit_s=1e-9, top_k=0)
    assert res.status == "FEASIBLE" and res.gap == 1.0 and res.limit == "time"
    assert res.stats.candidates > 4 * planner.COARSE_BLOCK and len(blocks) == 1


def test_an_unproven_plan_says_so_in_brief_and_json(autotune_proc) -> None:
    """--brief ends the best plan's line with status=, and a limit that stopped the proof is one warning line on
    stderr in --brief and --json too (the tables say it in text), beside exit 3."""
    args = ("plan", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "128",
            "--seq-len", "4096", "--top", "0", "--work-limit", "0.001")
    for mode in ("--brief", "--json"):
        proc = autotune_proc(*args, mode)
        assert proc.returncode == 3
        assert proc.stderr.splitlines() == ["warning: --work-limit reached before the search finished: the optimum "
                                            "may be up to " + proc.stderr.split("up to ")[1].split("%")[0]
                                            + "% faster; raise --work-limit to prove it"], proc.stderr
    assert autotune_proc(*args, "--brief").stdout.rstrip().endswith("status=FEASIBLE")
    proven = autotune_proc(*args[:-2], "--brief")
    assert proven.returncode == 0 and proven.stderr == "" and proven.stdout.rstrip().endswith("status=OPTIMAL")


def test_scale_says_its_unproven_sizes_on_stderr_in_every_format(autotune_proc) -> None:
    args = ("scale", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64,128", "--global-batch", "128",
            "--seq-len", "4096", "--work-limit", "0.0001", "--jobs", "1")
    for mode in ("--brief", "--json", "--csv"):
        proc = autotune_proc(*args, mode)
        assert proc.returncode == 3 and "GPUs: --work-limit or --time-limit stopped the search" in proc.stderr, mode
