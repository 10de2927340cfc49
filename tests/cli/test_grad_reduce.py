"""--grad-reduce (the gradient buffers' dtype) as each trainer's config runs it: Megatron keeps fp16 training's
buffers in fp16 unless told (--accumulate-allreduce-grads-in-fp32), DeepSpeed's config (no data_types) in the model
dtype, torchtitan's FSDP2 in fp32. The default is what the trainer's config runs; asking another is a one-line
error where the config cannot say it; the emitted config and `check` agree on it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.check.deepspeed_json import grad_reduce as deepspeed_grad_reduce
from autotune.check.megatron_precision import grad_reduce as megatron_grad_reduce
from autotune.costmodel.memory import state_bytes_per_param
from autotune.errors import SpecError
from autotune.specs.job import JobSpec
from autotune.specs.trainer_jobs import runs_grad_reduce

JOB = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096")


def _json(cli, *args: str) -> dict:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_fp16_buffers_are_two_bytes_with_an_fp32_copy_of_the_shard() -> None:
    """By hand: fp16 buffers 2 bytes; the distributed optimizer steps on an fp32 copy of its shard (4/d) beside
    12/d of master weights and moments (Megatron's distributed-optimizer docs), as for bf16 buffers."""
    job = JobSpec(global_batch=8, seq_len=2048, dtype="fp16", grad_reduce="fp16")
    assert job.grad_bytes == 2
    assert state_bytes_per_param(1, 8, job.state_bytes) == (2, 2, (12 + 4) / 8)
    fp32 = JobSpec(global_batch=8, seq_len=2048, dtype="fp16")
    assert state_bytes_per_param(1, 8, fp32.state_bytes) == (2, 4, 12 / 8)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_fp16_gradients_need_fp16_training(dtype: str) -> None:
    with pytest.raises(SpecError, match=f"--grad-reduce fp16 keeps fp16 training's gradients in fp16; with --dtype "
                                        f"{dtype} use --grad-reduce bf16"):
        JobSpec(global_batch=8, seq_len=2048, dtype=dtype, grad_reduce="fp16")


@pytest.mark.parametrize("trainer,dtype,asked,runs", [
    ("megatron", "bf16", None, "fp32"), ("megatron", "fp16", "fp16", "fp16"), ("megatron", "bf16", "bf16", "bf16"),
    ("torchtitan", "bf16", "bf16", "fp32"), ("deepspeed", "bf16", None, "bf16"), ("deepspeed", "fp8", "fp32", "bf16"),
    ("deepspeed", "fp16", None, "fp16"), ("colossalai", "bf16", None, "fp32"), (None, "fp16", None, "fp32"),
])
def test_what_each_trainers_config_runs(trainer, dtype, asked, runs) -> None:
    assert runs_grad_reduce(trainer, dtype, asked) == runs


@pytest.mark.parametrize("flags,expected", [
    ({"--fp16": True}, "fp16"),  # validate_args forces fp32 buffers for bf16 only
    ({"--fp16": True, "--accumulate-allreduce-grads-in-fp32": True}, "fp32"),
    ({"--fp16": True, "--grad-reduce-in-bf16": True}, "fp16"),  # acts in the bf16 branch only
    ({"--bf16": True}, "fp32"), ({"--bf16": True, "--grad-reduce-in-bf16": True}, "bf16"),
])
def test_megatron_flags_read_back(flags: dict, expected: str) -> None:
    assert megatron_grad_reduce(flags) == expected


@pytest.mark.parametrize("config,dtype,expected,noted", [
    ({}, "bf16", "bf16", False), ({}, "fp16", "fp16", False),
    ({"data_types": {"grad_accum_dtype": "fp32"}}, "bf16", "fp32", True),  # ZeRO 2: reduced in bf16, the default
    ({"data_types": {"grad_accum_dtype": "torch.float32"}, "communication_data_type": "fp32"}, "fp16", "fp32", False),
    ({"data_types": {"grad_accum_dtype": "half"}}, "fp16", "fp16", False),
    ({"communication_data_type": "fp32"}, "bf16", "bf16", True),
])
def test_deepspeed_config_read_back(config: dict, dtype: str, expected: str, noted: bool) -> None:
    notes: list[str] = []
    assert deepspeed_grad_reduce(config, dtype, 2, notes) == expected
    assert bool(notes) == noted


@pytest.mark.parametrize("config,zero,message", [
    ({"data_types": {"grad_accum_dtype": "nonsense"}}, 1, "data_types.grad_accum_dtype 'nonsense'"),
    ({"data_types": {"grad_accum_dtype": "fp16"}}, 1, "accumulates bf16 training's gradients in bf16 or fp32"),
    ({"data_types": {"grad_accum_dtype": "fp32"}}, 0, "fp32 gradient accumulation there (unsupported mix)"),
    ({"communication_data_type": "float32"}, 1, "communication_data_type 'float32': DeepSpeed takes one of"),
    ({"data_types": {"grad_accum_dtype": "fp32"}}, 1, "DeepSpeed runs its BF16_Optimizer there"),
])
def test_deepspeed_refusals_are_deepspeeds(config: dict, zero: int, message: str) -> None:
    """What DeepSpeed 0.19 itself refuses (runtime/config.py DtypeEnum and get_communication_data_type, engine.py's
    optimizer sanity check) is one line naming the key."""
    with pytest.raises(SpecError, match=re.escape(message)):
        deepspeed_grad_reduce(config, "bf16", zero, [])
    with pytest.raises(SpecError, match="^ds_config.json: "):  # named like the reader's other errors (user-tester)
        deepspeed_grad_reduce(config, "bf16", zero, [], "ds_config.json")


def test_the_default_is_the_trainers_own(cli) -> None:
    deepspeed = _json(cli, "plan", *JOB, "--trainer", "deepspeed")
    megatron = _json(cli, "plan", *JOB, "--trainer", "megatron")
    fp16 = _json(cli, "estimate", *JOB, "--dtype", "fp16", "--kernels", "deepspeed", "--tp", "1", "--pp", "1")
    assert (deepspeed["job"]["grad_reduce"], megatron["job"]["grad_reduce"], fp16["job"]["grad_reduce"]) == (
        "bf16", "fp32", "fp16")


@pytest.mark.parametrize("args,message", [
    (("--trainer", "deepspeed", "--grad-reduce", "fp32"),
     "--grad-reduce fp32: deepspeed's config keeps bf16 gradient buffers with --dtype bf16; use --grad-reduce bf16"),
    (("--trainer", "torchtitan", "--grad-reduce", "bf16"),
     "--grad-reduce bf16: torchtitan's config keeps fp32 gradient buffers with --dtype bf16; use --grad-reduce fp32"),
    (("--grad-reduce", "fp16"), "--grad-reduce fp16 keeps fp16 training's gradients in fp16; with --dtype bf16"),
])
def test_what_the_trainer_cannot_run_is_one_line(autotune_proc, args, message) -> None:
    proc = autotune_proc("plan", *JOB, *args)
    assert proc.returncode == 1 and proc.stdout == ""
    assert message in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_fp16_megatron_script_keeps_what_was_costed(cli, autotune_proc, tmp_path: Path) -> None:
    """fp32 buffers costed: the script asks for them; fp16 costed: it leaves Megatron's default. `check` reads each
    back as planned."""
    for grad, flag_expected in (("fp32", True), ("fp16", False)):
        out = tmp_path / grad
        doc = _json(cli, "plan", *JOB, "--dtype", "fp16", "--grad-reduce", grad, "--trainer", "megatron", "--out",
                    str(out))
        assert doc["job"]["grad_reduce"] == grad
        script = (out / "launch_megatron.sh").read_text()
        assert ("--accumulate-allreduce-grads-in-fp32" in script) == flag_expected
        proc = autotune_proc("check", str(out / "launch_megatron.sh"), "--gpu", "h100-sxm", "--gpus", "16", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["job"]["grad_reduce"] == grad


def test_an_older_document_is_recosted_as_recorded_with_a_warning(cli, autotune_proc, tmp_path: Path) -> None:
    """A DeepSpeed plan document costed with fp32 gradients (before DeepSpeed's config was costed in the model
    dtype) is re-costed as recorded, and a warning names what the config keeps."""
    doc = _json(cli, "plan", *JOB, "--trainer", "deepspeed")
    doc["job"]["grad_reduce"] = "fp32"
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    proc = autotune_proc("estimate", "--plan", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["job"]["grad_reduce"] == "fp32"
    assert (f"warning: {path}: costed with fp32 gradient buffers as its job.grad_reduce records; deepspeed's config "
            "keeps bf16 (set job.grad_reduce to bf16 in the file, or plan again, to cost that)") in proc.stderr
    megatron = _json(cli, "plan", *JOB, "--trainer", "megatron", "--kernels", "deepspeed")
    path.write_text(json.dumps(megatron))
    proc = autotune_proc("estimate", "--plan", str(path), "--json")
    assert proc.returncode == 0 and "gradient buffers" not in proc.stderr  # Megatron's config keeps what it records


def test_the_header_names_what_the_file_keeps(cli, tmp_path: Path) -> None:
    _json(cli, "plan", *JOB, "--trainer", "deepspeed", "--out", str(tmp_path))
    header = json.loads((tmp_path / "ds_config.json").read_text())["_autotune"]["header"]
    assert "global batch 64 x 4096 tokens, bf16, bf16 gradients" in header[1]


def test_the_toml_format_cannot_keep_bf16_moments(autotune_proc, tmp_path: Path) -> None:
    proc = autotune_proc("plan", *JOB, "--trainer", "torchtitan", "--torchtitan-format", "toml", "--optimizer-states",
                         "bf16-moments", "--out", str(tmp_path / "tt"))
    assert proc.returncode == 1 and not (tmp_path / "tt").exists()
    assert proc.stderr == ("error: --optimizer-states bf16-moments with --torchtitan-format toml: torchtitan 0.2.x "
                           "keeps fp32 Adam states; use the 0.3.0 overrides (--torchtitan-format cli) or "
                           "--optimizer-states fp32\n")
