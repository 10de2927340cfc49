"""`autotune plan` (../shared/CLI.md): the search from the command line, its pins, outputs and exit codes.

Small jobs (llama3-8b on 8-16 H100s) keep every search well under a second; each run still passes a
--time-limit so that a slow solve costs seconds, not the default minute.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import pytest

import autotune.cli.searching
from autotune.cli import main
from autotune.errors import SolverLimitError
from autotune.render.plan import search_progress
from autotune.search.planner import SearchProgress
from autotune.search.planner import search as real_search

SMALL = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
         "--time-limit", "20")
MEDIUM = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "128", "--seq-len",
          "4096", "--time-limit", "20")
CLI_MD_KEYS = {"plan", "step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "peak_memory_gib",
               "memory_per_stage_gib", "breakdown", "solver"}
SOLVER_KEYS = {"status", "wall_s", "candidates", "pruned_bound", "pruned_memory", "solved", "gap"}
STATS_LINE = re.compile(r"\d+ candidates, \d+ pruned by bound, \d+ by memory, \d+ CP-SAT solves, status OPTIMAL, "
                        r"[\d.]+ s")
# A plan a person might write for llama3-8b on 8 GPUs: all tensor parallel, 64 micro-batches of 1.
WORSE_PLAN = {"tp": 8, "pp": 1, "dp": 1, "mbs": 1, "num_microbatches": 64, "layers_per_stage": [32]}
# Data parallel with micro-batches of 8 sequences and no memory saver: the activations do not fit in 80 GB.
OOM_PLAN = {"tp": 1, "pp": 1, "dp": 8, "mbs": 8, "num_microbatches": 1, "layers_per_stage": [32]}


def _plan(cli, *args: str, input: str | None = None):
    result = cli("plan", *args, input=input)
    assert result.exit_code == 0, result.output
    return result


def _plan_json(cli, *args: str, input: str | None = None) -> dict:
    return json.loads(_plan(cli, *args, "--json", input=input).stdout)


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """`autotune plan ...` through `main`, in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(["plan", *args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# ------------------------------------------------------------------------------------------------ output
def test_human_output_has_plan_runners_up_and_stats(cli):
    result = _plan(cli, *SMALL, "--tp", "2", "--pp", "4", "--vocab", "ends,balanced")
    out = result.stdout
    assert "best plan: tp 2, pp 4, dp 1" in out
    assert re.search(r"layers per stage: E\+\d+ \| \d+ \| \d+ \| \d+\+H", out)  # where the vocabulary layers sit
    assert "Pipeline timeline" in out and re.search(r"rank  3 \|[FBw.]+\| idle", out)
    assert "Stages side by side" in out
    for phrase in ("step time", "tokens/s", "MFU", "peak memory", "of usable", "pipeline bubble",
                   "Runners-up", "slower by"):
        assert phrase in out
    assert STATS_LINE.search(out)
    assert max(len(line) for line in out.splitlines()) <= 120
    assert result.stderr == ""  # no progress display when stderr is not a terminal


def test_vocabulary_parallel_stages_are_labelled(cli):
    out = _plan(cli, *SMALL, "--tp", "2", "--pp", "4", "--vocab", "parallel").stdout
    assert "vocab parallel" in out and "layers per stage: 8+V/4 | 8+V/4 | 8+V/4 | 8+V/4" in out


def test_json_has_the_contract_keys(cli):
    doc = _plan_json(cli, *SMALL, "--tp", "2", "--pp", "4")
    assert CLI_MD_KEYS <= doc.keys() and {"stages", "runners_up"} <= doc.keys()
    assert SOLVER_KEYS <= doc["solver"].keys()
    assert doc["solver"]["status"] == "OPTIMAL" and doc["solver"]["gap"] == 0.0
    assert doc["solver"]["solved"] >= 1 and doc["solver"]["candidates"] >= doc["solver"]["solved"]
    assert len(doc["stages"]) == len(doc["memory_per_stage_gib"]) == 4
    assert doc["peak_memory_gib"] == max(doc["memory_per_stage_gib"]) <= doc["usable_memory_gib"]
    assert sum(doc["plan"]["layers_per_stage"]) == 32
    assert doc["runners_up"], "a free search over 8 GPUs has more than one strategy"
    for runner in doc["runners_up"]:
        assert {"plan", "step_time_s", "reason"} <= runner.keys()
        if runner["fits"]:
            assert runner["step_time_s"] >= doc["step_time_s"] and runner["reason"].startswith("slower by")
    assert "compare" not in doc


def test_json_is_byte_identical_across_runs_but_for_wall_time(cli):
    first = cli("plan", *SMALL, "--json").stdout
    second = cli("plan", *SMALL, "--json").stdout
    wall = re.compile(r'"wall_s": [\d.e+-]+')
    assert wall.sub("", first) == wall.sub("", second)
    json.loads(first)  # exactly one JSON object


def test_top_limits_the_runners_up(cli):
    assert _plan_json(cli, *SMALL, "--top", "0")["runners_up"] == []
    assert len(_plan_json(cli, *SMALL, "--top", "1")["runners_up"]) <= 2  # one slower plan + one that cannot fit


# ------------------------------------------------------------------------------------------------ pins
@pytest.mark.parametrize("pins, expected", [
    (("--tp", "2", "--pp", "2"), {"tp": 2, "pp": 2}),
    (("--tp", "2", "--pp", "2", "--recompute", "selective,full", "--zero", "1", "--no-sequence-parallel",
      "--schedule", "1f1b", "--mbs", "2"), {"tp": 2, "pp": 2, "zero": 1, "sequence_parallel": False,
                                           "schedule": "1f1b", "mbs": 2}),
    (("--tp", "2", "--pp", "4", "--vpp", "2", "--schedule", "interleaved"),
     {"tp": 2, "pp": 4, "vpp": 2, "schedule": "interleaved"}),
    (("--pp", "4", "--vocab", "ends"), {"pp": 4, "vocab": "ends", "layers_per_stage": [8, 8, 8, 8]}),
    (("--dp", "2", "--cp", "2"), {"dp": 2, "cp": 2}),
])
def test_pins_restrict_the_result(cli, pins, expected):
    plan = _plan_json(cli, *MEDIUM, *pins)["plan"]
    assert {k: plan[k] for k in expected} == expected
    if "--recompute" in pins:
        assert plan["recompute"] in ("selective", "full")


def test_layers_per_stage_pins_the_partition_and_sets_pp(cli):
    plan = _plan_json(cli, *SMALL, "--tp", "2", "--layers-per-stage", "15,17")["plan"]
    assert (plan["pp"], plan["layers_per_stage"], plan["vocab"]) == (2, [15, 17], "balanced")


def test_allow_idle_may_leave_gpus_unused(cli):
    doc = _plan_json(cli, *SMALL, "--gpus", "6", "--allow-idle")
    plan = doc["plan"]
    assert plan["tp"] * plan["pp"] * plan["dp"] * plan["cp"] <= 6


# ------------------------------------------------------------------------------------------------ --compare
def test_compare_with_a_worse_plan(cli, tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(WORSE_PLAN))
    out = _plan(cli, *SMALL, "--compare", str(path)).stdout
    assert "Compared with your plan" in out and "yours" in out
    assert re.search(r"the planner's plan is \d+\.\d% faster", out)
    doc = _plan_json(cli, *SMALL, "--compare", str(path))
    mine = doc["compare"]
    assert mine["plan"]["tp"] == 8 and mine["fits"] is True and mine["problem"] is None
    assert mine["step_time_s"] > doc["step_time_s"]
    assert mine["planner_faster_by_pct"] == pytest.approx(100 * (mine["step_time_s"] / doc["step_time_s"] - 1),
                                                          abs=1e-3)
    # --brief keeps it too, as its last line (user-tester: it was dropped without a word)
    last = _plan(cli, *SMALL, "--compare", str(path), "--brief").stdout.splitlines()[-1]
    assert last.startswith("compared=yes tp=8 ") and f"step_s={mine['step_time_s']:.4f}" in last


def test_compare_takes_a_plan_of_the_same_model_under_its_other_name(cli, tmp_path):
    """A plan made from a hub config.json compared under the catalog name of the same shape (user-tester: refused
    as another model); a model of another shape is still refused."""
    from autotune.errors import SpecError

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gemma3", "text_config": {
        "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
        "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}}))
    job = ("--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "16", "--seq-len", "4096", "--top", "0")
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(_plan_json(cli, "--model", str(config), *job)))
    mine = _plan_json(cli, "--model", "gemma3-27b", *job, "--compare", str(saved))["compare"]
    assert mine["fits"] is True and mine["planner_faster_by_pct"] == pytest.approx(0, abs=1e-6)
    # under --trainer megatron, which builds no window, the same model still (reviewer: refused as another)
    assert _plan_json(cli, "--model", "gemma3-27b", *job, "--trainer", "megatron", "--compare", str(saved))["compare"]
    with pytest.raises(SpecError, match="was planned with model .*config.json"):
        cli("plan", "--model", "llama3-8b", *job, "--compare", str(saved))


def test_compare_a_plan_that_does_not_fit_from_stdin(cli):
    out = _plan(cli, *SMALL, "--compare", "-", input=json.dumps(OOM_PLAN)).stdout
    assert "your plan does not fit: stage 0 needs" in out and "GiB" in out
    mine = _plan_json(cli, *SMALL, "--compare", "-", input=json.dumps(OOM_PLAN))["compare"]
    assert mine["fits"] is False and "stage 0" in mine["problem"]


def test_compare_a_plan_that_breaks_a_rule_is_exit_1(capsys, tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**WORSE_PLAN, "dp": 2, "num_microbatches": 32}))  # 16 GPUs, not 8
    code, out, err = _main(capsys, *SMALL, "--compare", str(path))
    assert code == 1 and out == ""
    assert err.startswith("error: --compare") and "--gpus is 8" in err


def test_compare_a_document_of_another_job_is_refused(capsys, tmp_path):
    """A `plan --json` document records the job it was planned for: one of another sequence length (or model, GPU,
    batch) is refused, not costed for a job it was not made for (user-tester, 2026-11-25)."""
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"plan": WORSE_PLAN, "job": {"model": "llama3-8b", "gpu": "h100-sxm", "gpus": 8,
                                                            "seq_len": 8192}}))
    code, out, err = _main(capsys, *SMALL, "--compare", str(path))
    assert code == 1 and out == ""
    assert err.strip() == (f"error: {path} was planned with seq_len 8192, the command line gives --seq-len 4096; "
                           "compare a plan of the same job, or plan again")


def test_compare_a_document_of_other_kernels_says_how_it_is_costed(capsys, tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"plan": WORSE_PLAN, "job": {"model": "llama3-8b", "kernels": "deepspeed",
                                                            "grad_reduce": "bf16"}}))
    code, _, err = _main(capsys, *SMALL, "--compare", str(path))
    assert code == 0
    assert (f"warning: {path} was planned with kernels deepspeed, grad_reduce bf16; it is costed with this run's "
            "(kernels megatron, grad_reduce fp32): give the same settings to compare it as planned") in err


def test_compare_a_checked_config_without_torch_compile_says_how_it_is_costed(capsys, tmp_path):
    """check's document of a torchtitan config without torch.compile records fused_kernels false; compared under a
    compiled search it was costed fused without a word (user-tester: 5.200 s against check's 6.616 s)."""
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"plan": WORSE_PLAN, "job": {"model": "llama3-8b", "fused_kernels": False}}))
    code, _, err = _main(capsys, *SMALL, "--compare", str(path))
    assert code == 0
    assert (f"warning: {path} was planned with fused_kernels false; it is costed with this run's (fused_kernels "
            "true): give the same settings to compare it as planned") in err


def test_compare_a_plan_routed_otherwise_says_how_it_is_costed(capsys, tmp_path):
    """A Mixtral plan priced at imbalance 1.5 with capacity 1.2 padded, compared under the defaults, was re-costed
    with dropless 1.25 routing without a word (user-tester)."""
    moe = ("--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "512", "--seq-len",
           "4096", "--top", "0")
    code, out, _ = _main(capsys, *moe, "--moe-imbalance", "1.5", "--moe-capacity-factor", "1.2",
                         "--moe-pad-to-capacity", "--json", "--no-timings")
    path = tmp_path / "mx.json"
    path.write_text(out)
    code, _, err = _main(capsys, *moe, "--compare", str(path), "--brief")
    assert code == 0 and (f"warning: {path} was planned with moe_imbalance 1.5, moe_capacity_factor 1.2, "
                          "moe_pad_to_capacity true; it is costed with this run's") in err
    code, out, _ = _main(capsys, *moe, "--json", "--no-timings")  # dropless: the document records no capacity
    path.write_text(out)
    code, _, err = _main(capsys, *moe, "--moe-capacity-factor", "1.0", "--compare", str(path), "--brief")
    assert code == 0 and f"warning: {path} was planned with moe_capacity_factor 0.0; it is costed" in err


# ------------------------------------------------------------------------------------------------ exit codes
ERROR_CASES = {
    "tp across nodes": (("--model", "gpt-7.5b", "--seq-len", "2048", "--tp", "16"), "pass --allow-cross-node-tp"),
    "sequence past learned positions": (("--model", "gpt-7.5b"), "exceeds the 2048 learned positions of gpt-7.5b"),
    "tp not dividing heads": (("--tp", "3"), "does not divide the 32 attention heads"),
    "time limit 0": (("--time-limit", "0"), "--time-limit must be > 0"),
    "layers sum": (("--layers-per-stage", "7,8,8,7"), "sums to 30"),
    "layers length": (("--pp", "2", "--layers-per-stage", "8,8,8,8"), "has 4 stages but --pp is 2"),
    "layers with pp list": (("--pp", "2,4", "--layers-per-stage", "8,8,8,8"), "--pp must be one value"),
    "uneven layers with vocab ends": (("--layers-per-stage", "15,17", "--vocab", "ends"), "--vocab balanced"),
    "layers vs vpp": (("--layers-per-stage", "9,7,9,7", "--vpp", "2"), "positive multiple of vpp"),
    "zero 2 with pp": (("--zero", "2", "--pp", "2"), "pipeline parallelism forbids"),
    "vpp with 1f1b": (("--vpp", "2", "--schedule", "1f1b"), "--schedule interleaved"),
    "pins together": (("--tp", "8", "--pp", "8"), "relax a pin"),
    "dp not dividing gpus": (("--dp", "3"), "--dp 3 does not divide --gpus 8"),
    "unknown schedule": (("--schedule", "gpipe"), "gpipe"),
    "negative top": (("--top", "-1"), "--top"),
    "ep on a dense model": (("--ep", "2"), "is dense (no experts); drop --ep"),
    "ep overlap on a dense model": (("--ep-overlap",), "which llama3-8b does not have (it is dense); drop "
                                                      "--ep-overlap"),
    "ep overlap at ep 1": (("--model", "mixtral-8x7b", "--ep", "1", "--ep-overlap"), "does not run at --ep 1"),
    "ep overlap with full recompute": (("--model", "mixtral-8x7b", "--ep-overlap", "--recompute", "full"),
                                       "--ep-overlap with --recompute full: megatron-core overlaps"),
    "ep overlap on 1f1b": (("--model", "mixtral-8x7b", "--ep-overlap", "--pp", "2", "--schedule", "1f1b"),
                           "--ep-overlap with --pp > 1 runs in the interleaved schedule"),
    "ep not dividing experts": (("--model", "mixtral-8x7b", "--ep", "3"),
                                "--ep 3 does not divide the 8 experts of mixtral-8x7b; use one of 1, 2, 4, 8"),
    "pipelined schedule on pp 1": (("--schedule", "zb-h1", "--pp", "1"), "needs --pp >= 2"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_contradictory_pins_are_one_line_exit_1(capsys, case):
    extra, fragment = ERROR_CASES[case]
    code, out, err = _main(capsys, *SMALL, *extra)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], err


def test_infeasible_is_exit_2_with_one_line(autotune_proc):
    proc = autotune_proc("plan", "--model", "llama3-405b", "--gpu", "v100-32gb", "--gpus", "8", "--global-batch",
                         "64", "--seq-len", "2048")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "GiB" in lines[0]


def test_infeasible_json_is_one_object_and_exit_2(autotune_proc, tmp_path):
    # CLI.md: --json prints exactly one object; a script piping it to jq reads the verdict, not an empty stream
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"tp": 8, "pp": 1, "dp": 1, "cp": 1, "mbs": 1, "num_microbatches": 64, "vpp": 1,
                                "schedule": "1f1b", "recompute": "full", "zero": 1, "sequence_parallel": True,
                                "vocab": "ends", "layers_per_stage": [126]}))
    proc = autotune_proc("plan", "--model", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch",
                         "64", "--seq-len", "8192", "--json", "--compare", str(mine))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["plan"] is None and doc["fits"] is False and doc["solver"]["status"] == "INFEASIBLE"
    assert doc["runners_up"] == [] and "855.7 GiB" in doc["reason"]
    assert doc["job"] == {"model": "llama3-405b", "gpu": "h100-sxm", "gpus": 8, "gpus_per_node": 8,
                          "global_batch": 64, "seq_len": 8192, "dtype": "bf16", "flash_attention": True,
                          "fused_kernels": True, "grad_reduce": "fp32", "optimizer_states": "fp32",
                          "kernels": "megatron"}
    assert doc["compare"]["fits"] is False and doc["compare"]["plan"]["tp"] == 8
    assert doc["compare"]["peak_memory_gib"] > 77.6  # a 405B model's Adam state alone is 567 GiB on 8 GPUs
    assert proc.stderr.strip().splitlines() == [f"error: {doc['reason']}"]


def test_tiny_time_limit_is_exit_3(capsys):
    # The enumeration alone outlasts 1 ms, so today no plan exists when the limit strikes: exit 3 with a one-line
    # message. Were a plan found first, it would be printed (status FEASIBLE) and the exit code still 3.
    code, out, err = _main(capsys, "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "1024", "--global-batch",
                           "1024", "--seq-len", "8192", "--time-limit", "0.001")
    assert code == 3
    if out:
        assert "best plan found (not proven optimal)" in out and "status FEASIBLE" in out
    else:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "--time-limit" in lines[0]


def _feasible(*args, **kwargs):
    """The planner's real result, relabelled as if its time limit had struck before the proof."""
    return replace(real_search(*args, **kwargs), status="FEASIBLE", gap=0.05)


def test_feasible_result_prints_the_plan_and_exits_3(cli, monkeypatch):
    monkeypatch.setattr(autotune.cli.searching, "search", _feasible)
    result = cli("plan", *SMALL)
    assert result.exit_code == 3
    assert "best plan found (not proven optimal)" in result.stdout
    assert "status FEASIBLE" in result.stdout and "gap 5.0%" in result.stdout
    result = cli("plan", *SMALL, "--json")
    assert result.exit_code == 3
    solver = json.loads(result.stdout)["solver"]
    assert (solver["status"], solver["gap"]) == ("FEASIBLE", 0.05)


def test_solver_limit_error_carrying_a_result_prints_it(cli, monkeypatch):
    def limited(*args, **kwargs):
        raise SolverLimitError("time limit", result=_feasible(*args, **kwargs))

    monkeypatch.setattr(autotune.cli.searching, "search", limited)
    result = cli("plan", *SMALL, "--json")
    assert result.exit_code == 3
    assert json.loads(result.stdout)["solver"]["status"] == "FEASIBLE"


# ------------------------------------------------------------------------------------------------ progress
class _Tty:
    """A stand-in stderr that says it is a terminal."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_progress_is_silent_unless_stderr_is_a_terminal(monkeypatch):
    with search_progress(True) as progress:  # pytest's stderr is not a terminal
        assert progress is None
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    with search_progress(False) as progress:  # --json
        assert progress is None
    with search_progress(True) as progress:  # a search done within a second shows nothing
        assert progress is not None
        progress(SearchProgress(1848, 3, 1.5, 1.2))
    assert not tty.text
    with search_progress(True, delay_s=0.0) as progress:
        progress(SearchProgress(1848, 0, math.inf, 1.0))
        progress(SearchProgress(1848, 3, 1.5, 1.2))
    assert "20.0%" in tty.text  # the bar drew (and cleared) itself on stderr, with the gap


def test_vocabulary_parallel_pin_on_a_tied_model_names_the_reason(capsys):
    code, out, err = _main(capsys, "--model", "gpt3-175b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch",
                           "32", "--seq-len", "2048", "--vocab", "parallel")
    assert code == 1 and out == "" and "ties them" in err and len(err.strip().splitlines()) == 1
