"""Colossal-AI emitter: the legacy config schema's rules, checked on the emitted file (Colossal-AI itself needs
CUDA to import, so its own parser cannot run here), and the 1-D fallback with a warning for other trainers."""

from __future__ import annotations

import ast
from dataclasses import replace

import pytest

from autotune.catalog import load_model
from autotune.emit import EmitInput, emit
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, check_plan
from autotune.specs.tpgrid import tp_mode_degrees


def _input(tp_mode: str, tp: int, **plan) -> EmitInput:
    model = load_model("gpt-7.5b")
    job = JobSpec(global_batch=64, seq_len=2048)
    p = Plan(tp=tp, pp=plan.pop("pp", 1), dp=plan.pop("dp", 1), mbs=16, num_microbatches=4,
             layers_per_stage=plan.pop("layers", (36,)), tp_mode=tp_mode, **plan)
    check_plan(p, model, job, p.num_gpus, 8)
    return EmitInput(plan=p, model=model, job=job, gpu="v100-32gb", gpus_per_node=8, step_time_s=1.0,
                     peak_memory_gib=10.0, mfu=0.3)


def _parallel(config: str) -> dict:
    """The `parallel = dict(...)` assignment, evaluated without importing Colossal-AI."""
    tree = ast.parse(config)
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "parallel")
    return eval(compile(ast.Expression(node.value), "config", "eval"), {"dict": dict})  # noqa: S307


@pytest.mark.parametrize(("mode", "tp", "depth"), [("2d", 16, None), ("2.5d", 8, 2), ("3d", 8, None), ("1d", 8, None)])
def test_tensor_block_follows_the_legacy_schema(mode, tp, depth):
    """Colossal-AI's legacy schema: tensor size = q^2 (2d), depth*q^2 with a depth (2.5d), q^3 (3d)."""
    result = emit("colossalai", _input(mode, tp))
    config = dict(result.files)["colossalai_config.py"]
    parallel = _parallel(config)
    assert parallel["pipeline"] == 1
    tensor = parallel["tensor"]
    assert tensor["size"] == tp and tensor["mode"] == mode
    grid = tp_mode_degrees(mode, tp)
    assert tensor.get("depth", 1) == (grid.depth if mode == "2.5d" else 1)
    if depth is not None:
        assert tensor["depth"] == depth
    assert "gradient_accumulation = 4" in config


def test_other_trainers_emit_a_grid_plan_as_1d_with_a_warning():
    result = emit("megatron", _input("3d", 8))
    assert result.warnings and "3d tensor parallelism" in result.warnings[0]
    script = dict(result.files)["launch_megatron.sh"]
    assert "--tensor-model-parallel-size 8" in script


def test_emission_is_deterministic():
    inp = _input("2d", 16)
    assert emit("colossalai", inp) == emit("colossalai", replace(inp))


def _assignments(config: str) -> dict:
    tree = ast.parse(config)
    return {n.targets[0].id: n.value.value for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}


@pytest.mark.parametrize("pp", [1, 2])
def test_context_parallelism_folded_into_data_parallelism_keeps_the_global_batch(pp: int) -> None:
    """Without context parallelism the cp ranks are data-parallel ranks: each runs 1/cp of the micro-batches, so
    world / (tp x pp) ranks x BATCH_SIZE is the planned global batch (it was cp times it)."""
    model, job = load_model("llama3-8b"), JobSpec(global_batch=64, seq_len=8192)
    layers = (32,) if pp == 1 else (16, 16)
    plan = Plan(tp=2, pp=pp, dp=8 // (2 * pp), cp=2, mbs=4, num_microbatches=64 // (8 // (2 * pp) * 4),
                layers_per_stage=layers, zero=1 if pp == 1 else 0, sequence_parallel=True)
    check_plan(plan, model, job, 16, 8)
    inp = EmitInput(plan=plan, model=model, job=job, gpu="h100-sxm", gpus_per_node=8, step_time_s=1.0,
                    peak_memory_gib=10.0, mfu=0.3)
    values = _assignments(dict(emit("colossalai", inp).files)["colossalai_config.py"])
    data_ranks = plan.num_gpus // (plan.tp * plan.pp)
    assert data_ranks * values["BATCH_SIZE"] == values["GLOBAL_BATCH_SIZE"] == 64
    batches = values["NUM_MICRO_BATCHES"] if pp > 1 else values["gradient_accumulation"]
    assert values["BATCH_SIZE"] == plan.mbs * batches


def test_context_parallelism_that_cannot_fold_is_refused() -> None:
    from autotune.errors import SpecError

    model, job = load_model("llama3-8b"), JobSpec(global_batch=8, seq_len=8192)
    plan = Plan(tp=2, pp=1, dp=4, cp=2, mbs=2, num_microbatches=1, layers_per_stage=(32,), sequence_parallel=True)
    check_plan(plan, model, job, 16, 8)
    inp = EmitInput(plan=plan, model=model, job=job, gpu="h100-sxm", gpus_per_node=8, step_time_s=1.0,
                    peak_memory_gib=10.0, mfu=0.3)
    with pytest.raises(SpecError, match="do not split over 2 more data-parallel ranks"):
        emit("colossalai", inp)
