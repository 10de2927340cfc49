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
