"""--optimizer-states (bf16 Adam moments, Megatron's precision-aware optimizer): it reaches the estimate and the
plan search, the JSON names it, a saved plan is re-costed with it, the Megatron script carries it and `check`
reads it back; where it cannot run, a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

JOB = ("--model", "deepseek-v3", "--gpu", "h100-sxm", "--gpus", "1024", "--global-batch", "4096", "--seq-len", "4096")
#: Megatron-Bridge 0.3.1's DeepSeek-V3 recipe at 1024 GPUs (recipes/deepseek/deepseek_v3.py): tp 2, pp 16, ep 64,
#: selective recompute, the E+4 | 4 x 14 | 1 + MTP + loss layout, bf16 gradients and bf16 Adam moments
RECIPE = ("--tp", "2", "--pp", "16", "--ep", "64", "--etp", "1", "--mbs", "1", "--zero", "1", "--recompute",
          "selective", "--layers-per-stage", ",".join(["4"] * 15 + ["1"]), "--grad-reduce", "bf16")


def _json(cli, *args: str) -> dict:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_deepseek_v3_recipe_optimizer_terms_by_hand(cli) -> None:
    """The recipe's optimizer term under each state layout, by hand from megatron-core's distrib_optimizer.py with
    bf16 gradient buffers: fp32 states 12 bytes + an fp32 gradient copy 4 = 16 per parameter of the ZeRO shard;
    bf16 (Megatron-LM's default path) 2 (master remainder) + 2 + 2 = 6, no copy; bf16-moments (what the recipe
    runs: Megatron-Bridge's default fp8_recipe tensorwise) 4 + 2 + 2 + copy 4 = 12. Experts (ep 64: an
    expert-data-parallel group of 1) and the rest (dp 32) scale alike, so the ratios are exact: 6/16 and 12/16."""
    runs = {states: _json(cli, "estimate", *JOB, *RECIPE, "--optimizer-states", states)
            for states in ("fp32", "bf16", "bf16-moments")}
    optimizer = {k: doc["stages"][1]["memory_gib"]["optimizer"] for k, doc in runs.items()}  # four MoE layers
    assert optimizer["bf16"] / optimizer["fp32"] == pytest.approx(6 / 16, rel=1e-5)
    assert optimizer["bf16-moments"] / optimizer["fp32"] == pytest.approx(12 / 16, rel=1e-5)
    assert len({doc["step_time_s"] for doc in runs.values()}) == 1
    assert {k: doc["job"]["optimizer_states"] for k, doc in runs.items()} == {k: k for k in runs}


def test_a_saved_plan_keeps_it(cli, tmp_path: Path) -> None:
    doc = _json(cli, "estimate", *JOB, *RECIPE, "--optimizer-states", "bf16")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    again = _json(cli, "estimate", "--plan", str(path))
    assert (again["job"], again["peak_memory_gib"]) == (doc["job"], doc["peak_memory_gib"])


def test_plan_searches_zero_1_and_up_and_megatron_carries_it(cli, tmp_path: Path) -> None:
    job = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096")
    out = tmp_path / "run"
    result = cli("plan", *job, "--optimizer-states", "bf16", "--grad-reduce", "bf16", "--trainer", "megatron",
                 "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["solver"]["status"] == "OPTIMAL" and doc["plan"]["zero"] == 1
    assert all(r["plan"]["zero"] == 1 for r in doc["runners_up"])
    script = (out / "launch_megatron.sh").read_text()
    for flag in ("--use-precision-aware-optimizer", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16",
                 "--main-grads-dtype bf16", "--grad-reduce-in-bf16"):
        assert flag in script
    check = cli("check", str(out / "launch_megatron.sh"), "--gpu", "h100-sxm", "--gpus", "16", "--json")
    read = json.loads(check.stdout)["job"]
    assert (read["optimizer_states"], read["grad_reduce"]) == ("bf16", "bf16")


@pytest.mark.parametrize(("extra", "words"), [
    (("--optimizer-states", "fp8"), "--optimizer-states must be one of fp32, bf16, bf16-moments"),
    (("--optimizer-states", "bf16", "--kernels", "torchtitan"), "--optimizer-states bf16: torchtitan keeps fp32"),
    (("--optimizer-states", "bf16", "--zero", "0"), "use zero 1 or --optimizer-states fp32"),
    (("--optimizer-states", "bf16-moments", "--zero", "3"), "use zero 1 or --optimizer-states fp32"),
])
def test_bad_optimizer_states_are_one_line_errors(extra, words, autotune_proc) -> None:
    proc = autotune_proc("estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch",
                         "8", "--seq-len", "4096", "--tp", "2", "--pp", "1", *extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr


def test_estimate_defaults_to_the_distributed_optimizer_it_needs(cli) -> None:
    doc = _json(cli, "estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8",
                "--seq-len", "4096", "--tp", "2", "--pp", "1", "--optimizer-states", "bf16")
    assert doc["plan"]["zero"] == 1


def test_plan_for_a_trainer_without_it_is_refused(autotune_proc) -> None:
    job = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8", "--seq-len", "4096")
    proc = autotune_proc("plan", *job, "--optimizer-states", "bf16-moments", "--trainer", "deepspeed")
    assert proc.returncode == 1 and "deepspeed keeps fp32, bf16 Adam states" in proc.stderr
    proc = autotune_proc("plan", *job, "--optimizer-states", "bf16", "--trainer", "deepspeed", "--dtype", "fp16")
    assert proc.returncode == 1 and "DeepSpeed keeps 16-bit Adam states with bf16 training only" in proc.stderr


def test_deepspeed_plans_its_bf16_master_weights(cli, autotune_proc, tmp_path: Path) -> None:
    """DeepSpeed's bf16 master weights and moments (ZeRO 1-3): the plan keeps them, ds_config.json sets them and
    `check` reads them back as the same job and step time."""
    job = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096")
    doc = _json(cli, "plan", *job, "--optimizer-states", "bf16", "--trainer", "deepspeed", "--out", str(tmp_path))
    assert doc["job"]["optimizer_states"] == "bf16" and doc["plan"]["zero"] in (1, 2, 3)
    config = json.loads((tmp_path / "ds_config.json").read_text())
    assert config["bf16"]["bf16_optimizer_states"] is True
    proc = autotune_proc("check", str(tmp_path / "ds_config.json"), "--model", "llama3-8b", "--gpu", "h100-sxm",
                         "--gpus", "16", "--seq-len", "4096", "--json")
    assert proc.returncode == 0, proc.stderr
    read = json.loads(proc.stdout)
    assert read["job"]["optimizer_states"] == "bf16" and read["step_time_s"] == doc["step_time_s"]


def test_scale_takes_it(cli, autotune_proc) -> None:
    job = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8,16", "--global-batch", "64", "--seq-len", "4096")
    doc = _json(cli, "scale", *job, "--optimizer-states", "bf16", "--grad-reduce", "bf16")
    assert all(p["status"] == "OPTIMAL" and p["plan"]["zero"] == 1 for p in doc["points"])
    assert (doc["grad_reduce"], doc["optimizer_states"]) == ("bf16", "bf16")
    proc = autotune_proc("scale", *job, "--optimizer-states", "bf16", "--trainer", "torchtitan")
    assert proc.returncode == 1 and "torchtitan keeps fp32, bf16-moments Adam states" in proc.stderr


def test_emitting_for_a_trainer_without_it_says_what_its_config_keeps(cli, autotune_proc, tmp_path: Path) -> None:
    job = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096")
    doc = _json(cli, "plan", *job, "--optimizer-states", "bf16", "--grad-reduce", "bf16")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    proc = autotune_proc("emit", "--plan", str(path), "--trainer", "torchtitan", "--out", str(tmp_path / "tt"))
    assert proc.returncode == 0, proc.stderr
    assert ("warning: --grad-reduce bf16 (torchtitan's config keeps fp32) and --optimizer-states bf16 (torchtitan's "
            "config keeps fp32): the header's figures are re-estimated for what it runs (more memory than planned)"
            in proc.stderr)
    megatron = autotune_proc("emit", "--plan", str(path), "--trainer", "megatron", "--out", str(tmp_path / "mg"))
    assert megatron.returncode == 0 and "config keeps" not in megatron.stderr


def test_a_bad_value_in_a_plan_file_names_the_file(cli, tmp_path: Path) -> None:
    from autotune.errors import SpecError

    doc = _json(cli, "estimate", *JOB, *RECIPE, "--optimizer-states", "bf16")
    doc["job"]["optimizer_states"] = "fp8"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"plan.json: job.optimizer_states 'fp8' must be one of fp32, bf16"):
        cli("estimate", "--plan", str(path))


def test_vocab_parallel_with_bf16_states_warns_of_the_fork(cli, autotune_proc, tmp_path: Path) -> None:
    """A plan no trainer runs as planned (vocabulary parallelism needs the fork, which records no precision-aware
    optimizer): the Megatron script says so."""
    job = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096")
    doc = _json(cli, "estimate", *job, "--tp", "2", "--pp", "2", "--vocab", "parallel", "--optimizer-states", "bf16")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    proc = autotune_proc("emit", "--plan", str(path), "--trainer", "megatron", "--out", str(tmp_path / "mg"))
    assert proc.returncode == 0 and "do not record --use-precision-aware-optimizer" in proc.stderr, proc.stderr


def test_the_text_headers_name_the_state_precision(cli) -> None:
    job = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8", "--seq-len", "4096")
    for command, extra in (("estimate", ("--tp", "2", "--pp", "1")), ("plan", ()), ("scale", ())):
        result = cli(command, *job, *extra, "--optimizer-states", "bf16-moments", "--grad-reduce", "bf16")
        assert result.exit_code == 0, result.output
        assert "4096 tokens, bf16, bf16 gradients, bf16-moments Adam states" in result.output, command
    assert "Adam states" not in cli("estimate", *job, "--tp", "2", "--pp", "1").output


def test_a_torchtitan_fsdp_plan_emitted_for_megatron_keeps_fp32_states(cli, autotune_proc, tmp_path: Path) -> None:
    """torchtitan's bf16 moments under FSDP (zero 3), emitted for Megatron: Megatron FSDP keeps fp32 main weights and
    moments, so the script sets no precision-aware optimizer, emit says its figures are re-estimated for that, and
    `check` reads the script as the header costs it; --strict refuses."""
    job = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "256", "--seq-len", "4096")
    doc = _json(cli, "plan", *job, "--trainer", "torchtitan", "--optimizer-states", "bf16-moments", "--out",
                str(tmp_path / "tt"))
    assert doc["plan"]["zero"] == 3
    strict = autotune_proc("emit", "--plan", str(tmp_path / "tt" / "plan.json"), "--trainer", "megatron", "--out",
                           str(tmp_path / "strict"), "--strict")
    assert strict.returncode == 1 and not (tmp_path / "strict").exists()
    proc = autotune_proc("emit", "--plan", str(tmp_path / "tt" / "plan.json"), "--trainer", "megatron", "--out",
                         str(tmp_path / "mg"))
    assert proc.returncode == 0 and ("--optimizer-states bf16-moments (megatron's config keeps fp32): the header's "
                                     "figures are re-estimated for what it runs (more memory than planned)"
                                     in proc.stderr)
    script = (tmp_path / "mg" / "launch_megatron.sh").read_text()
    assert "--use-precision-aware-optimizer" not in script
    header = next(line for line in script.splitlines() if line.startswith("# predicted:"))
    check = autotune_proc("check", str(tmp_path / "mg" / "launch_megatron.sh"), "--gpu", "h100-sxm", "--gpus", "16",
                          "--json")
    assert check.returncode == 0, check.stderr
    assert f"peak memory {json.loads(check.stdout)['peak_memory_gib']:.1f} GiB" in header
