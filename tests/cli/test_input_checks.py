"""Inputs a user gets wrong, found by trying the CLI as a new user would: each is a one-line error naming the flag
(or file) and the fix, never a silent default; and saved plans re-cost as they were planned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.errors import SpecError

DENSE = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64", "--seq-len", "8192")
MOE = ("--model", "mixtral-8x22b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "256", "--seq-len", "4096")


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_capacity_factor_must_be_positive(cli, value):
    """0 is JobSpec's dropless routing: given on the command line it is a mistake, not 'leave it out'."""
    with pytest.raises(SpecError, match=f"--moe-capacity-factor {value}: .* must be > 0"):
        cli("estimate", *MOE, "--tp", "1", "--pp", "4", "--ep", "8", "--moe-capacity-factor", value)


@pytest.mark.parametrize(("flags", "named"), [
    (("--moe-dispatcher", "deepep"), "--moe-dispatcher"),
    (("--moe-imbalance", "2"), "--moe-imbalance"),
    (("--moe-capacity-factor", "1.5", "--moe-pad-to-capacity"), "--moe-capacity-factor, --moe-pad-to-capacity"),
])
@pytest.mark.parametrize("command", ["plan", "estimate", "scale"])
def test_moe_settings_on_a_dense_model_are_refused(cli, command, flags, named):
    args = {"plan": DENSE, "estimate": (*DENSE, "--tp", "1", "--pp", "1"),
            "scale": tuple(a if a != "8" else "8,16" for a in DENSE)}[command]
    with pytest.raises(SpecError, match=f"^{named}: llama3-8b is dense"):
        cli(command, *args, *flags)


@pytest.mark.parametrize("value", ["-1", "0", "1e30", "nan"])
def test_train_tokens_are_checked_without_out_too(cli, value):
    with pytest.raises(SpecError, match=r"--train-tokens .*: must be a number of tokens > 0 and <= 1e\+16"):
        cli("plan", *DENSE, "--train-tokens", value)


def test_a_nan_price_is_refused(cli):
    with pytest.raises(SpecError, match="--price-per-gpu-hour must be a finite amount > 0, got nan"):
        cli("scale", *(a if a != "8" else "8,16" for a in DENSE), "--price-per-gpu-hour", "nan")


def test_a_bucket_beyond_any_model_is_refused(cli):
    with pytest.raises(SpecError, match="bucket_size 99999999999999999999 exceeds 1,048,576,000,000 parameters"):
        cli("estimate", *DENSE, "--tp", "1", "--pp", "1", "--bucket-size", "99999999999999999999")


def test_a_bucket_far_below_a_weight_matrix_is_said_costed_as_the_matrix(cli):
    """--bucket-size 1: the trainer never splits a tensor, so it runs (and is costed) as the smallest matrix; said,
    where the bucket was given; the same estimate without the flag says nothing."""
    given = cli("estimate", *DENSE, "--tp", "1", "--pp", "1", "--bucket-size", "1", "--brief")
    assert "warning: bucket 1 parameters is below llama3-8b's smallest weight matrix on a GPU (16,777,216)" in \
        given.stderr and "so it is costed as 16,777,216" in given.stderr
    assert "bucket" not in cli("estimate", *DENSE, "--tp", "1", "--pp", "1", "--brief").stderr


def test_kernels_errors_name_the_kernels_flag(cli):
    with pytest.raises(SpecError, match=r"^--kernels \(or --trainer\) must be one of"):
        cli("estimate", *DENSE, "--tp", "1", "--pp", "1", "--kernels", "foo")


def test_a_saved_plan_names_a_known_trainer(cli, tmp_path: Path):
    doc = {"plan": {"tp": 1, "pp": 1, "dp": 8, "mbs": 1, "num_microbatches": 8, "layers_per_stage": [32]},
           "trainer": "foo"}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="trainer must be one of megatron, .* or null, got 'foo'"):
        cli("estimate", "--plan", str(path), *DENSE)


def test_a_plan_across_nodes_re_costs_from_its_own_document(cli, tmp_path: Path):
    """plan --allow-cross-node-tp writes a tp wider than a node; estimate --plan and plan --compare take the saved
    plan's layout as given (as `check` takes a script's)."""
    job = ("--model", "gpt-39.1b", "--gpu", "h100-sxm", "--gpus", "32", "--global-batch", "64", "--seq-len", "2048")
    planned = cli("plan", *job, "--tp", "16", "--allow-cross-node-tp", "--json")
    assert planned.exit_code == 0, planned.output
    path = tmp_path / "plan.json"
    path.write_text(planned.output)
    again = cli("estimate", "--plan", str(path), "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["step_time_s"] == json.loads(planned.output)["step_time_s"]
    compared = cli("plan", *job, "--compare", str(path), "--brief", "--top", "0")
    assert compared.exit_code == 0, compared.output


def test_a_profile_without_the_plans_cp_says_to_measure_that_cp(cli):
    """cp 2 halves every op's tokens, below a cp-1 profile's range: the warning's command measures at cp 2
    (user-tester, 2026-11-25: it left --cp out)."""
    result = cli("estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64",
                 "--seq-len", "8192", "--tp", "1", "--pp", "1", "--cp", "2", "--profile",
                 "profiles/measured/h100-sxm-llama3-8b.torch-eager.json", "--brief")
    assert "measure them with `autotune profile --tp 1 --mbs 1 --cp 2`" in result.output, result.output
