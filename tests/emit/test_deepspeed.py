"""The DeepSpeed emitter: golden files, DeepSpeed's own config parser on every emitted config, the engine's
rules, the partition DeepSpeed computes, the refusals and the warnings.

DeepSpeed 0.19.8 (CPU, `make trainers`) parses each ds_config.json with `DeepSpeedConfig(path, mpu=stub)`;
see deepspeed_validate.py for what is stubbed and which engine rules are mirrored.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed is installed by `make trainers`")

from pydantic import ValidationError  # noqa: E402

from autotune.emit import EmitInput, emit  # noqa: E402
from autotune.emit.deepspeed import (CONFIG_FILE, PIPELINE_FILE, REFUSES_PP_WITH_CP,  # noqa: E402
                                     DeepSpeedPlanError, deepspeed_split, dump, emit_deepspeed)
from autotune.errors import AutotuneError  # noqa: E402

from . import deepspeed_validate as dsv  # noqa: E402
from .scenarios import GOLDEN, planner_scenarios  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _files(inp: EmitInput) -> dict[str, str]:
    return dict(emit_deepspeed(inp).files)


def _config(inp: EmitInput) -> dict:
    return json.loads(_files(inp)[CONFIG_FILE])


def _with_plan(inp: EmitInput, **changes) -> EmitInput:
    return replace(inp, plan=replace(inp.plan, **changes))


# ------------------------------------------------------------------------------------------------ golden files
@pytest.mark.parametrize("scenario", sorted(GOLDEN))
def test_golden(scenario, check_golden):
    check_golden(emit_deepspeed(GOLDEN[scenario]), "deepspeed", scenario)


@pytest.mark.parametrize("scenario", sorted(GOLDEN))
def test_deepspeed_accepts_golden(scenario, tmp_path):
    inp = GOLDEN[scenario]
    got = dsv.validate(_files(inp), tmp_path)
    plan = inp.plan
    assert (got["dp"], got["micro_batch"], got["grad_accum"]) == (plan.dp, plan.mbs, plan.num_microbatches)
    assert got["train_batch_size"] == inp.job.global_batch and got["zero"] == plan.zero
    assert (got["bf16"], got["fp16"]) == (inp.job.dtype != "fp16", inp.job.dtype == "fp16")


def test_deepspeed_accepts_every_planner_plan(tmp_path):
    scenarios = planner_scenarios()
    for name, inp in scenarios:
        work = tmp_path / name
        work.mkdir()
        got = dsv.validate(_files(inp), work)
        assert got["dp"] == inp.plan.dp and got["stages"] == inp.plan.pp, name


def test_dispatcher_and_format():
    inp = GOLDEN["even"]
    result = emit("deepspeed", inp)
    # the dispatcher adds what the trainer runs otherwise (this Megatron plan's overlapped reduction and gather,
    # which DeepSpeed's pipeline engine and ZeRO-1 run after the backward and in the step; its fp32 gradients:
    # DeepSpeed's are bf16)
    assert result.files == emit_deepspeed(inp).files
    again = "the header's figures are re-estimated for what it runs"
    assert result.warnings == (
        *emit_deepspeed(inp).warnings,
        f"gradients reduced during the backward: deepspeed reduces them after it with pp 2, zero 1; {again}",
        f"weights gathered behind the next forward: deepspeed gathers them in its optimizer step with zero 1; {again}",
        f"--grad-reduce fp32 (deepspeed's config keeps bf16): {again} (less memory than planned)")
    assert [name for name, _ in result.files] == sorted([CONFIG_FILE, PIPELINE_FILE, "launch_deepspeed.sh",
                                                         "sbatch_deepspeed.sh"])
    for _, content in [f for f in result.files if f[0].endswith(".json")]:  # sorted keys, 2-space indent
        assert content == dump(json.loads(content)) and content.endswith("}\n") and "\n  \"" in content


def test_deterministic_across_processes():
    """Same bytes twice in one process and in a fresh interpreter with another hash seed."""
    inp = GOLDEN["uneven_vocab"]
    assert emit_deepspeed(inp) == emit_deepspeed(inp)
    code = ("import json, sys; sys.path.insert(0, 'tests'); from emit.scenarios import GOLDEN; "
            "from autotune.emit.deepspeed import emit_deepspeed; "
            "print(json.dumps(emit_deepspeed(GOLDEN['uneven_vocab']).files))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert [tuple(f) for f in json.loads(out.splitlines()[-1])] == list(emit_deepspeed(inp).files)


# ------------------------------------------------------------------------------------------------ header key
def test_header_key_is_ignored_by_deepspeed_but_not_inside_a_section():
    """JSON has no comments, so the header lives under a top-level "_autotune" key: DeepSpeedConfig ignores
    unknown top-level keys, while its pydantic sections reject them (so nothing of ours goes there)."""
    config = _config(GOLDEN["even"])
    assert config["_autotune"]["header"][0].startswith("generated by autotune")
    assert any("predicted: step 9.500 s" in line for line in config["_autotune"]["header"])
    dsv.deepspeed_config(config, dp=4, pp=2)
    config["zero_optimization"]["_autotune"] = "x"
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        dsv.deepspeed_config(config, dp=4, pp=2)


# ------------------------------------------------------------------------------------------------ broken configs
def test_micro_batch_not_dividing_is_rejected():
    config = _config(GOLDEN["even"])
    config["train_micro_batch_size_per_gpu"] = 3
    with pytest.raises(AssertionError, match="64 != 3 \\* 16 \\* 4"):
        dsv.deepspeed_config(config, dp=4)


def test_wrong_dp_is_rejected():
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        dsv.deepspeed_config(_config(GOLDEN["even"]), dp=8)


def test_bf16_adam_states_are_deepspeeds_bf16_master_weights(tmp_path):
    """--optimizer-states bf16: bf16.bf16_master_weights_and_grads and bf16_optimizer_states, which DeepSpeed's own
    config check takes with ZeRO 1 (the golden plan's) and refuses with ZeRO 0; fp32 states set neither."""
    inp = GOLDEN["even"]
    bf16 = replace(inp, job=replace(inp.job, optimizer_states="bf16"))
    assert inp.plan.zero == 1 and dsv.validate(_files(bf16), tmp_path)["bf16_states"] is True
    assert _config(bf16)["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True,
                                     "bf16_optimizer_states": True}
    assert _config(inp)["bf16"] == {"enabled": True}
    config = _config(bf16)
    config["zero_optimization"]["stage"] = 0
    with pytest.raises(AssertionError, match="only supported with ZeRO Stage 1, 2, or 3"):
        dsv.deepspeed_config(config, dp=4, pp=2)


def test_zero_stage_5_is_rejected():
    config = _config(GOLDEN["even"])
    config["zero_optimization"]["stage"] = 5
    with pytest.raises(ValidationError, match="stage"):
        dsv.deepspeed_config(config, dp=4)
    with pytest.raises(DeepSpeedPlanError, match="zero 5"):
        emit_deepspeed(_with_plan(GOLDEN["even"], zero=5))


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_2_3_with_a_pipeline_is_refused(zero):
    inp = _with_plan(GOLDEN["even"], zero=zero)
    with pytest.raises(DeepSpeedPlanError) as exc:  # our refusal
        emit_deepspeed(inp)
    assert isinstance(exc.value, AutotuneError) and exc.value.exit_code == 1
    message = str(exc.value)
    assert "\n" not in message and f"zero {zero} with pp 2" in message and "use zero 0 or 1" in message
    config = _config(GOLDEN["even"])  # and DeepSpeed's engine rule, mirrored, on a hand-edited config
    config["zero_optimization"]["stage"] = zero
    with pytest.raises(AssertionError, match="ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"):
        dsv.deepspeed_config(config, dp=4, pp=2)
    dsv.deepspeed_config(config, dp=4, pp=1)  # without a pipeline DeepSpeed takes it


def test_zero_3_without_pipeline(tmp_path):
    inp = _with_plan(GOLDEN["even"], pp=1, dp=8, num_microbatches=8, zero=3, layers_per_stage=(32,))
    config = _config(inp)
    assert config["zero_optimization"]["stage3_prefetch_bucket_size"] == inp.plan.bucket_size
    assert "allgather_bucket_size" not in config["zero_optimization"] and "pipeline" not in config
    assert dsv.validate(_files(inp), tmp_path)["zero"] == 3


# ------------------------------------------------------------------------------------------------ partition
@pytest.mark.parametrize("layers,pp", [(n, p) for n in (1, 2, 5, 7, 13, 30, 32) for p in (1, 2, 3, 4, 8) if p <= n]
                         + [(80, 6), (126, 16), (96, 12)])
def test_partition_matches_deepspeed(layers, pp):
    assert dsv.deepspeed_partition("type:transformer", layers, pp) == list(deepspeed_split(layers, pp))


def test_uneven_split_warns_and_keeps_the_planned_counts():
    result = emit_deepspeed(GOLDEN["uneven_vocab"])
    pipe = json.loads(dict(result.files)[PIPELINE_FILE])
    assert pipe["layers_per_stage"] == [7, 9, 9, 7] and pipe["partition_method_layers_per_stage"] == [8, 8, 8, 8]
    assert any("layers_per_stage 7,9,9,7" in w and "gives 8,8,8,8" in w for w in result.warnings)
    assert any("_partition_layers" in note for note in pipe["_autotune"]["notes"])


def test_even_split_that_deepspeed_reproduces_has_no_partition_warning():
    inp = _with_plan(GOLDEN["even"], recompute="none")
    result = emit_deepspeed(inp)
    assert result.warnings == ()
    pipe = json.loads(dict(result.files)[PIPELINE_FILE])
    assert pipe["partition_method"] == "type:transformer" and pipe["num_stages"] == 2
    assert pipe["topology"] == {"num_pp": 2, "num_mp": 2, "num_dp": 4} and pipe["world_size"] == 16


# ------------------------------------------------------------------------------------------------ warnings
def test_interleaved_becomes_1f1b_with_a_warning():
    result = emit_deepspeed(GOLDEN["interleaved"])
    assert len(result.warnings) == 1 and "no interleaved schedule" in result.warnings[0]
    assert "vpp 1" in result.warnings[0]
    assert json.loads(dict(result.files)[PIPELINE_FILE])["layers_per_stage"] == [6, 6, 6, 6]


@pytest.mark.parametrize("recompute,layers,interval,warns", [
    ("none", None, 0, False), ("full", None, 1, False), ("full", 16, 1, False), ("full", 2, 1, True),
    ("selective", None, 1, True)])
def test_recompute_maps_to_checkpoint_interval(recompute, layers, interval, warns):
    result = emit_deepspeed(_with_plan(GOLDEN["even"], recompute=recompute, recompute_layers=layers))
    files = {name: json.loads(content) for name, content in result.files if name.endswith(".json")}
    assert files[CONFIG_FILE]["pipeline"]["activation_checkpoint_interval"] == interval
    assert files[PIPELINE_FILE]["activation_checkpoint_interval"] == interval
    assert any("recompute" in w for w in result.warnings) == warns


def test_context_parallel_with_a_pipeline_is_refused():
    """Issue 12: deepspeed.initialize rejected every pp > 1 and cp > 1 plan (the pipeline engine takes dp from
    its topology, dp x cp); the emitter now refuses it up front with one line, and the search reads the flag."""
    inp = _with_plan(GOLDEN["even"], tp=1, cp=2, sequence_parallel=False, recompute="none")
    with pytest.raises(DeepSpeedPlanError, match=r"^cp 2 with pp 2: DeepSpeed's pipeline engine") as err:
        emit_deepspeed(inp)
    assert "\n" not in str(err.value) and REFUSES_PP_WITH_CP


def test_recompute_without_a_pipeline_reaches_the_config():
    """pp 1: PipelineModule's interval is never read; the config carries activation_checkpointing and the
    warning says the model code must call deepspeed.checkpointing.checkpoint (nothing claims it was applied)."""
    inp = _with_plan(GOLDEN["even"], tp=2, pp=1, dp=8, num_microbatches=8, layers_per_stage=(32,), zero=1)
    result = emit_deepspeed(inp)
    config = json.loads(dict(result.files)[CONFIG_FILE])
    assert "pipeline" not in config and "activation_checkpointing" in config
    assert any("deepspeed.checkpointing.checkpoint" in w for w in result.warnings)
    none = emit_deepspeed(_with_plan(inp, recompute="none"))
    assert "activation_checkpointing" not in json.loads(dict(none.files)[CONFIG_FILE])


def test_context_parallel_becomes_ulysses_with_a_warning(tmp_path):
    inp = _with_plan(GOLDEN["even"], tp=1, pp=1, dp=8, cp=2, num_microbatches=8, layers_per_stage=(32,),
                     sequence_parallel=False, recompute="none")
    result = emit_deepspeed(inp)
    files = {name: json.loads(content) for name, content in result.files if name.endswith(".json")}
    assert files[PIPELINE_FILE]["mpu"]["sequence_parallel_world_size"] == 2 and files[PIPELINE_FILE]["world_size"] == 16
    # tp 1: DeepSpeed builds its own (data_parallel, sequence_parallel) mesh from these two keys
    assert (files[CONFIG_FILE]["data_parallel_size"], files[CONFIG_FILE]["sequence_parallel_size"]) == (8, 2)
    with_tp = emit_deepspeed(_with_plan(inp, tp=2, dp=4))  # tp > 1: the model code's mpu has the degrees
    assert "sequence_parallel_size" not in json.loads(dict(with_tp.files)[CONFIG_FILE])
    assert len(result.warnings) == 1 and result.warnings[0].startswith("cp 2: DeepSpeed has no ring-attention")
    assert dsv.validate(dict(result.files), tmp_path)["dp"] == 8


def test_fp8_becomes_bf16_with_a_warning():
    inp = replace(GOLDEN["even"], job=replace(GOLDEN["even"].job, dtype="fp8"))
    result = emit_deepspeed(inp)
    config = json.loads(dict(result.files)[CONFIG_FILE])
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert any(w.startswith("dtype fp8") for w in result.warnings)


def test_warnings_are_single_lines():
    for inp in GOLDEN.values():
        for warning in emit_deepspeed(inp).warnings:
            assert "\n" not in warning and warning == warning.strip()
