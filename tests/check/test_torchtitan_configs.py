"""torchtitan 0.3.0 launches read back from their config function plus overrides: a bare `--config NAME` reads as
what the function itself sets (pinned to torchtitan's own functions, CPU only), overrides change only what they
name, in every spelling tyro accepts; schedule names match as torch matches them."""

from __future__ import annotations

import importlib

import pytest

from autotune.check.torchtitan_configs import CONFIG_DEFAULTS, config_defaults
from autotune.check.torchtitan_toml import read_overrides, read_toml
from autotune.errors import SpecError

#: torchtitan's model modules, each the prefix of its config functions' names
MODULES = ("llama3", "qwen3", "deepseek_v3", "gpt_oss")


def _module(config: str) -> str:
    return next(m for m in MODULES if config.startswith(m))


def _torchtitan_config(name: str, monkeypatch) -> tuple:
    """torchtitan's own config function called on a CPU, and the model converters it asks for: Float8's converter
    checks for torchao and an SM89+ GPU when it is built, which reading the settings does not need."""
    pytest.importorskip("torchtitan.config")
    float8 = importlib.import_module("torchtitan.components.quantization.float8")
    monkeypatch.setattr(float8.Float8LinearConverter, "__init__", lambda self, config: setattr(self, "config", config))
    monkeypatch.setattr(float8.Float8LinearConverter, "convert", lambda self, model_config: model_config, raising=False)
    registry = importlib.import_module(f"torchtitan.models.{_module(name)}.config_registry")
    seen: list = []
    real = registry.model_registry
    monkeypatch.setattr(registry, "model_registry", lambda *a, converters=None, **k: (
        seen.extend(converters or []), real(*a, converters=converters, **k))[1])
    return getattr(registry, name)(), seen


@pytest.mark.parametrize("name", sorted(CONFIG_DEFAULTS))
def test_a_bare_config_reads_as_the_function_sets_it(name, monkeypatch) -> None:
    cfg, converters = _torchtitan_config(name, monkeypatch)
    r = read_overrides(f"--module {_module(name)} --config {name}")
    p, t = cfg.parallelism, cfg.training
    assert (r.tp, r.pp, r.cp, r.ep) == (p.tensor_parallel_degree, p.pipeline_parallel_degree,
                                        p.context_parallel_degree, p.expert_parallel_degree)
    assert (r.mbs, r.seq_len, r.global_batch) == (t.local_batch_size, t.seq_len, None)
    ac = type(cfg.activation_checkpoint).__qualname__.split(".")[0]
    assert r.recompute == {"FullAC": "full", "SelectiveAC": "selective"}[ac]
    assert r.fused_kernels == (cfg.compile.enable and "model" in cfg.compile.components)  # deepseek: loss only
    assert r.tp_overlap == cfg.compile.enable_async_tensor_parallel
    assert (r.dtype == "fp8") == any("Float8" in type(c).__qualname__ for c in converters), converters
    sections = {"training": t, "parallelism": p, "compile": cfg.compile}
    for section, body in CONFIG_DEFAULTS[name].items():  # every listed value is the function's own
        for key, value in body.items():
            if section in sections:
                assert getattr(sections[section], key) == value, (section, key)


def test_overrides_change_only_what_they_name() -> None:
    """The issue's launch: llama3_70b() sets tp 8, so 8-way FSDP over it is a 64-GPU job of 8 x 8192 tokens per
    rank under full checkpointing."""
    r = read_overrides("torchrun --nproc_per_node=8 --nnodes=8 -m torchtitan.train --module llama3 --config "
                       "llama3_70b --parallelism.data_parallel_shard_degree 8")
    assert (r.tp, r.dp, r.mbs, r.seq_len, r.recompute) == (8, 8, 8, 8192, "full")
    r = read_overrides("--module qwen3 --config qwen3_30b_a3b --training.seq_len 2048 activation-checkpoint:none")
    assert (r.seq_len, r.recompute, r.mbs) == (2048, "none", 2)


def test_every_tyro_spelling_is_read() -> None:
    """tyro takes `-` and `_` in names alike, `--key=value`, and negative numbers as values."""
    r = read_overrides("--module qwen3 --config qwen3_30b_a3b --parallelism.expert-parallel-degree 8 "
                       "--parallelism.tensor_parallel_degree=2 --parallelism.data-parallel-shard-degree -1 "
                       "--config=qwen3_30b_a3b")
    assert (r.ep, r.tp, r.dp) == (8, 2, None)
    assert not [n for n in r.notes if "ignored" in n]


def test_config_defaults_of_autotunes_own_functions_are_their_bases() -> None:
    assert config_defaults("llama3_405b_bf16") == CONFIG_DEFAULTS["llama3_70b"]
    assert config_defaults("qwen3_235b_a22b") == CONFIG_DEFAULTS["qwen3_30b_a3b"]
    assert config_defaults("not_a_function") == {}


def test_schedule_names_ignore_case_and_other_schedules_are_named() -> None:
    toml = '[model]\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "{}"\n'
    assert read_toml(toml.format("interleaved1f1b")).schedule == "interleaved"
    assert read_toml(toml.format("zbvzerobubble")).schedule == "v-half"
    with pytest.raises(SpecError, match="'GPipe': a torchtitan schedule autotune does not model"):
        read_toml(toml.format("GPipe"))
    with pytest.raises(SpecError, match="not a torchtitan schedule"):
        read_toml(toml.format("Zigzag"))


@pytest.mark.parametrize("version", ["0.3.0", "0.2.2"])
def test_no_real_torchtitan_setting_is_refused_as_a_slip(version, monkeypatch) -> None:
    """Every field of torchtitan's own config sections (0.3.0's, and 0.2.2's job_config) read as a key or section
    name: none is refused as a slip of one autotune reads; a real slip is."""
    import dataclasses
    import sys
    from pathlib import Path

    from autotune.check.reading import misspelling_of
    from autotune.check.torchtitan_toml import KNOWN, NEUTRAL_SECTIONS

    pytest.importorskip("torchtitan.config")
    if version == "0.2.2":
        old = Path(sys.prefix) / "torchtitan-0.2.2"
        if not old.is_dir():
            pytest.skip("torchtitan 0.2.2 is installed beside the venv by `make trainers`")
        for name in [m for m in sys.modules if m == "torchtitan" or m.startswith("torchtitan.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.syspath_prepend(str(old))
        config = importlib.import_module("torchtitan.config.job_config")
        sections = {f.name: f.type for f in dataclasses.fields(config.JobConfig)}
        classes = {name: getattr(config, name.title().replace("_", ""), None) for name in sections}
    else:
        config = importlib.import_module("torchtitan.config")
        classes = {"training": config.TrainingConfig, "parallelism": config.ParallelismConfig,
                   "compile": config.CompileConfig}
    known_sections = set(KNOWN) | set(NEUTRAL_SECTIONS)
    assert [s for s in classes if s not in known_sections and misspelling_of(s, known_sections)] == []
    checked = 0
    for section, cls in classes.items():
        if section in KNOWN and dataclasses.is_dataclass(cls):
            fields = [f.name for f in dataclasses.fields(cls)]
            checked += len(fields)
            assert [f for f in fields if f not in KNOWN[section] and misspelling_of(f, KNOWN[section])] == []
    assert checked > 30
    with pytest.raises(SpecError, match=r"\[paralelism\]: .* did you mean \[parallelism\]"):
        read_overrides("--module llama3 --config llama3_8b --paralelism.tensor_parallel_degree 8")


def test_debug_forced_balance_memory_budget_and_unknown_functions() -> None:
    """torchtitan's --debug.moe_force_load_balance (its router's round-robin, models/common/decoder.py) reads as
    balanced routing, as Megatron's --moe-router-force-load-balancing does; MemoryBudgetAC (which torchtitan runs
    on a compiled model only) reads as full (0), none (1) or selective between them, with a note; a config
    function autotune does not list says that the batch and sequence are torchtitan's defaults unless the
    overrides give them (user-tester: silent)."""
    base = "--module qwen3 --config qwen3_30b_a3b"
    assert read_overrides(f"{base} --debug.moe_force_load_balance").moe_imbalance == 1.0
    assert read_overrides(base).moe_imbalance is None
    assert read_toml('[model]\nname = "qwen3"\nflavor = "30B-A3B"\n[debug]\nmoe_force_load_balance = true\n'
                     ).moe_imbalance == 1.0
    with pytest.raises(SpecError, match="memory-budget needs the model compiled: torchtitan refuses it otherwise"):
        read_overrides(f"{base} activation-checkpoint:memory-budget")
    budget = f"{base} --compile.enable activation-checkpoint:memory-budget --activation_checkpoint.memory_budget"
    assert [read_overrides(f"{budget} {b}").recompute for b in ("0", "0.3", "1")] == ["full", "selective", "none"]
    assert any("memory_budget 0.3: torch.compile's partitioner" in n for n in read_overrides(f"{budget} 0.3").notes)
    with pytest.raises(SpecError, match="memory_budget must be a number from 0 to 1, got 1.5"):
        read_overrides(f"{budget} 1.5")
    unknown = read_overrides("--module qwen3 --config qwen3_99b")
    assert (unknown.mbs, unknown.seq_len, unknown.recompute) == (8, 2048, "selective")
    assert any("else torchtitan's defaults (local_batch_size 8, seq_len 2048, selective)" in n for n in unknown.notes)
    listed = read_overrides("--module qwen3 --config qwen3_14b")
    assert (listed.mbs, listed.seq_len, listed.recompute) == (4, 4096, "full")
    assert any("its model is not in autotune's catalog" in n for n in listed.notes)
