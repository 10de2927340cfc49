"""--attention-backend: which kernel PyTorch's SDPA runs the attention with. torchtitan asks for cuDNN first (its
attention module's sdpa_kernel priority), so its plans are costed with cuDNN's attention and the flag cannot say
otherwise under --trainer torchtitan; --kernels torchtitan alone prices an older torchtitan's FlashAttention-2 run.
The choice is recorded in the plan document and read back by estimate --plan and emit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.errors import SpecError
from autotune.specs.job import JobSpec
from autotune.specs.trainer_jobs import as_run_job

JOB = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8", "--seq-len", "32768",
       "--tp", "1", "--pp", "1", "--cp", "2", "--dp", "4", "--mbs", "1", "--zero", "3", "--recompute", "full")


def _estimate(cli, *args: str) -> dict:
    result = cli("estimate", *JOB, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cudnn_attention_is_faster_than_flash_by_the_measured_figures(cli) -> None:
    """At 32k tokens attention is most of the step: cuDNN's (hardware file attention 0.58) against
    FlashAttention-2's (attention_sdpa 0.33) must shorten it, and only the attention terms may differ."""
    flash = _estimate(cli, "--kernels", "torchtitan", "--attention-backend", "flash")
    cudnn = _estimate(cli, "--kernels", "torchtitan")
    assert cudnn["job"]["kernels"] == "torchtitan" and cudnn["job"]["attention_backend"] == "cudnn"
    assert flash["job"]["attention_backend"] == "flash"
    assert cudnn["step_time_s"] < 0.8 * flash["step_time_s"]
    assert cudnn["operators"]["attention"] < 0.65 * flash["operators"]["attention"]
    assert cudnn["operators"]["gemm"] == flash["operators"]["gemm"]


def test_the_document_records_the_backend_and_estimate_plan_reads_it(cli, tmp_path: Path) -> None:
    doc = _estimate(cli, "--kernels", "deepspeed", "--attention-backend", "cudnn")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    again = cli("estimate", "--plan", str(path), "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["step_time_s"] == doc["step_time_s"]
    assert json.loads(again.stdout)["job"]["attention_backend"] == "cudnn"
    doc["job"]["attention_backend"] = "xformers"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="job.attention_backend 'xformers' must be one of cudnn, flash"):
        cli("estimate", "--plan", str(path))


@pytest.mark.parametrize("args,message", [
    (("--kernels", "megatron", "--attention-backend", "flash"), "Megatron's attention is costed as Transformer "
                                                                 "Engine's fused (cuDNN) kernel"),
    (("--kernels", "torchtitan", "--attention-backend", "xformers"), "--attention-backend must be one of cudnn, "
                                                                     "flash, got 'xformers'"),
])
def test_a_backend_the_kernels_cannot_run_is_refused(cli, args, message) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        cli("estimate", *JOB, *args)


def test_torchtitan_plans_run_cudnn_so_flash_is_one_line_there(autotune_proc) -> None:
    result = autotune_proc("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch",
                           "64", "--seq-len", "4096", "--trainer", "torchtitan", "--attention-backend", "flash")
    assert result.returncode == 1 and not result.stdout
    assert result.stderr.count("\n") == 1 and "torchtitan asks SDPA for cuDNN attention first" in result.stderr


def test_colossalai_runs_flashattention_so_cudnn_is_refused_there(cli) -> None:
    with pytest.raises(SpecError, match="--attention-backend cudnn: colossalai calls FlashAttention-2 itself, so its "
                                        "config runs FlashAttention-2; leave the flag out"):
        cli("plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64",
            "--seq-len", "4096", "--trainer", "colossalai", "--attention-backend", "cudnn")


def test_as_run_keeps_deepspeeds_backend_and_gives_megatron_and_torchtitan_their_own() -> None:
    job = JobSpec(global_batch=8, seq_len=1024, trainer="deepspeed", attention_backend="cudnn")
    assert as_run_job(job, "deepspeed").attention_backend == "cudnn"
    assert as_run_job(JobSpec(global_batch=8, seq_len=1024, trainer="colossalai", attention_backend="flash"),
                      "megatron").runs_attention == "cudnn"
    titan = as_run_job(JobSpec(global_batch=8, seq_len=1024, trainer="deepspeed", attention_backend="flash"),
                       "torchtitan")
    assert titan.attention_backend is None and titan.runs_attention == "cudnn"
    colossal = as_run_job(JobSpec(global_batch=8, seq_len=1024, trainer="deepspeed", attention_backend="cudnn"),
                          "colossalai")
    assert colossal.attention_backend is None and colossal.runs_attention == "flash"


def test_emit_warns_when_the_trainer_runs_another_attention_kernel(cli, tmp_path: Path) -> None:
    """A DeepSpeed plan costed with FlashAttention-2: torchtitan's config runs cuDNN (re-estimated, said), and
    DeepSpeed's own config cannot choose the kernel (said, with what `check` costs)."""
    doc = _estimate(cli, "--kernels", "deepspeed", "--attention-backend", "flash")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    titan = cli("emit", "--plan", str(path), "--trainer", "torchtitan", "--out", str(tmp_path / "tt"))
    assert titan.exit_code == 0, titan.output
    assert "costed with FlashAttention-2 attention; torchtitan's code runs cuDNN" in titan.output
    deepspeed = cli("emit", "--plan", str(path), "--trainer", "deepspeed", "--out", str(tmp_path / "ds"))
    assert deepspeed.exit_code == 0, deepspeed.output
    assert "which a DeepSpeed config cannot choose" in deepspeed.output


def test_a_document_without_the_key_is_recosted_with_cudnn_and_says_so(cli, tmp_path: Path) -> None:
    doc = _estimate(cli, "--kernels", "deepspeed")
    assert doc["job"]["attention_backend"] == "cudnn"  # recorded, the trainer's own resolved
    del doc["job"]["attention_backend"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    old = cli("estimate", "--plan", str(path), "--brief")
    assert old.exit_code == 0 and "records no job.attention_backend" in old.output
    assert "give --attention-backend flash to cost it as it was" in old.output
    pinned = cli("estimate", "--plan", str(path), "--brief", "--attention-backend", "flash")
    assert pinned.exit_code == 0 and "records no job.attention_backend" not in pinned.output


def test_scale_records_the_kernels_and_attention(cli) -> None:
    result = cli("scale", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64",
                 "--seq-len", "4096", "--trainer", "deepspeed", "--attention-backend", "flash", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["kernels"], doc["attention_backend"]) == ("deepspeed", "flash")


def test_unfused_attention_takes_no_attention_backend() -> None:
    with pytest.raises(SpecError, match="--attention-backend cudnn chooses a fused attention kernel, but "
                                        "--no-flash-attention costs unfused attention"):
        JobSpec(global_batch=8, seq_len=1024, trainer="deepspeed", attention_backend="cudnn", flash_attention=False)


def test_a_job_block_the_job_refuses_names_the_file(cli, tmp_path: Path) -> None:
    doc = _estimate(cli, "--kernels", "deepspeed")
    doc["job"]["kernels"], doc["job"]["attention_backend"] = "megatron", "flash"
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=re.escape(f"{path}: job.attention_backend flash: Megatron's")):
        cli("estimate", "--plan", str(path))  # the document's key, not a flag the command line never gave
    with pytest.raises(SpecError, match=re.escape(f"{path}: job: --attention-backend flash: Megatron's")):
        cli("emit", "--plan", str(path), "--trainer", "megatron", "--out", str(tmp_path / "out"))


def test_a_profile_records_its_attention_kernel_and_estimates_say_when_the_job_runs_another(cli, tmp_path) -> None:
    """The shipped long-context profiles were timed with cuDNN (`autotune profile --device cuda` records it): a
    Colossal-AI job (FlashAttention-2) costs its attention as measured and says so; a torchtitan one is quiet."""
    from autotune.catalog import PROFILES_DIR
    from autotune.specs.profile import load_profile

    path = PROFILES_DIR / "measured" / "h100-sxm-llama3-8b-s32768-cp1.torch-eager.json"
    assert load_profile(path).attention_backend == "cudnn"
    job = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8", "--seq-len", "32768",
           "--tp", "1", "--pp", "1", "--dp", "8", "--zero", "3", "--recompute", "full", "--profile", str(path),
           "--brief")
    colossal = cli("estimate", *job, "--kernels", "colossalai")
    assert colossal.exit_code == 0 and "timed attention with cuDNN, the job runs FlashAttention-2" in colossal.output
    titan = cli("estimate", *job, "--kernels", "torchtitan")
    assert titan.exit_code == 0 and "timed attention with" not in titan.output


def test_profile_on_a_cpu_takes_no_attention_backend(cli, tmp_path) -> None:
    pytest.importorskip("torch")
    with pytest.raises(SpecError, match="--attention-backend flash: cpu has no cuDNN or FlashAttention kernel"):
        cli("profile", "--model", "tiny-gpt", "--device", "cpu", "--attention-backend", "flash",
            "--out", str(tmp_path / "p.json"))
