"""--moe-dispatcher (issue 14): DeepEP's dispatch reaches the cost model from plan, estimate and scale, the
estimate JSON names it, the Megatron launch script carries it (flex dispatcher, deepep backend) and `check`
reads it back; a bad value, or DeepEP for a trainer autotune does not emit it for, is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

JOB = ("--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096")
PLAN = ("--tp", "1", "--pp", "1", "--ep", "16", "--zero", "1", "--mbs", "1", "--recompute", "full")


def _json(cli, *args: str) -> dict:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_deepep_is_faster_across_nodes_and_named_in_the_json(cli) -> None:
    alltoall = _json(cli, "estimate", *JOB, *PLAN)
    deepep = _json(cli, "estimate", *JOB, *PLAN, "--moe-dispatcher", "deepep")
    assert (alltoall["job"]["moe_dispatcher"], deepep["job"]["moe_dispatcher"]) == ("alltoall", "deepep")
    # ep 16 spans two nodes: DeepEP sends a token over the network once, not once per remote expert
    assert deepep["breakdown"]["tp_comm_s"] < 0.5 * alltoall["breakdown"]["tp_comm_s"]
    assert deepep["step_time_s"] < alltoall["step_time_s"]
    dense = _json(cli, "estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8",
                  "--seq-len", "4096", "--tp", "1", "--pp", "1")
    assert "moe_dispatcher" not in dense["job"]  # dense outputs are unchanged


def test_plan_and_scale_take_it(cli) -> None:
    plan = _json(cli, "plan", *JOB, "--ep", "16", "--moe-dispatcher", "deepep")
    assert plan["solver"]["status"] == "OPTIMAL" and plan["job"]["moe_dispatcher"] == "deepep"
    torchtitan = next(t for t in plan["trainers"] if t["trainer"] == "torchtitan")
    assert torchtitan["status"] != "RUNS"  # it runs NCCL all-to-alls: its own best plan, costed so
    scaled = _json(cli, "scale", *JOB, "--tp", "1", "--pp", "1", "--mbs", "1", "--moe-dispatcher", "deepep")
    assert scaled["points"][0]["status"] == "OPTIMAL"


def test_the_megatron_script_carries_it_and_check_reads_it_back(cli, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = cli("plan", *JOB, *PLAN, "--moe-dispatcher", "deepep", "--out", str(out), "--trainer", "megatron")
    assert result.exit_code == 0, result.output
    script = (out / "launch_megatron.sh").read_text()
    assert "--moe-token-dispatcher-type flex" in script and "--moe-flex-dispatcher-backend deepep" in script
    check = cli("check", str(out / "launch_megatron.sh"), "--gpu", "h100-sxm", "--gpus", "16", "--json")
    assert json.loads(check.stdout)["job"]["moe_dispatcher"] == "deepep"


@pytest.mark.parametrize(("extra", "words"), [
    (("--moe-dispatcher", "nccl"), "--moe-dispatcher must be one of alltoall, deepep"),
    (("--moe-dispatcher", "deepep", "--kernels", "torchtitan"), "--moe-dispatcher deepep"),
    # Megatron-Bridge turns DeepEP on only at compute capability 8.x/9.x and B200/B300
    (("--moe-dispatcher", "deepep", "--gpu", "v100-32gb"), "not v100-32gb (7.0); use --moe-dispatcher alltoall"),
    (("--moe-dispatcher", "deepep", "--gpu", "mi300x"), "not mi300x (gfx942)"),
    # its internode kernels take every 8 consecutive GPUs for one node's NVLink peers: ep 16 over 4-GPU nodes
    (("--moe-dispatcher", "deepep", "--gpus-per-node", "4"), "which nodes of 4 GPUs are not: DeepEP needs ep*etp of 2"),
])
def test_bad_dispatcher_is_a_one_line_error(extra, words, autotune_proc) -> None:
    proc = autotune_proc("estimate", *JOB, *PLAN, *extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr


def test_plan_keeps_deepep_groups_inside_nodes_of_four(cli, autotune_proc) -> None:
    """On 4-GPU nodes DeepEP runs only inside a node: the planner picks an ep*etp dividing 4 (pinning 8 leaves
    nothing, and the error names why)."""
    plan = _json(cli, "plan", *JOB, "--moe-dispatcher", "deepep", "--gpus-per-node", "4")
    assert plan["solver"]["status"] == "OPTIMAL"
    assert 4 % (plan["plan"]["ep"] * plan["plan"]["etp"]) == 0
    pinned = autotune_proc("plan", *JOB, "--moe-dispatcher", "deepep", "--gpus-per-node", "4", "--ep", "8", "--etp",
                           "1")
    assert pinned.returncode == 1 and "the deepep dispatcher needs ep*etp of 2, 4, 8 inside a node" in pinned.stderr


def test_check_names_the_scripts_flags_when_deepep_cannot_run(cli, autotune_proc, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = cli("plan", *JOB, *PLAN, "--moe-dispatcher", "deepep", "--out", str(out), "--trainer", "megatron")
    assert result.exit_code == 0, result.output
    script = out / "launch_megatron.sh"
    proc = autotune_proc("check", str(script), "--gpu", "v100-32gb", "--gpus", "16")
    assert proc.returncode == 1 and not proc.stdout, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(script) in lines[0] and "not v100-32gb (7.0)" in lines[0], proc.stderr
    assert lines[0].endswith("use --moe-token-dispatcher-type alltoall")
