"""A trainer that reduces gradients after the backward (DeepSpeed's pipeline engine or no ZeRO, Colossal-AI with a
pipeline) says so in `estimate`'s step breakdown, and `plan` and `estimate --plan` agree on such a plan."""

from __future__ import annotations

import json

ARGS = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096")


def test_the_breakdown_names_a_reduction_after_the_backward(cli):
    piped = cli("estimate", *ARGS, "--tp", "1", "--pp", "2", "--zero", "1", "--kernels", "deepspeed",
                "--grad-reduce", "bf16")
    flat = cli("estimate", *ARGS, "--tp", "1", "--pp", "1", "--zero", "1", "--kernels", "deepspeed",
               "--grad-reduce", "bf16")
    assert piped.exit_code == flat.exit_code == 0
    assert "data-parallel comm (after the backward)" in piped.output
    assert "data-parallel comm (exposed)" in flat.output and "after the backward" not in flat.output


def test_plan_and_estimate_agree_on_a_deepspeed_pipeline(cli, tmp_path):
    planned = cli("plan", *ARGS, "--trainer", "deepspeed", "--pp", "2", "--json")
    assert planned.exit_code == 0, planned.output
    doc = json.loads(planned.output)
    path = tmp_path / "plan.json"
    path.write_text(planned.output)
    again = cli("estimate", "--plan", str(path), "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["step_time_s"] == doc["step_time_s"]
    assert json.loads(again.output)["breakdown"]["dp_comm_exposed_s"] > 0
