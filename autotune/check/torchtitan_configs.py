"""What torchtitan 0.3.0's config functions set, which a launch's command-line overrides start from.

`-m torchtitan.train --module llama3 --config llama3_70b --parallelism.data_parallel_shard_degree 8` trains tp 8,
8 sequences of 8192 tokens per rank with full activation checkpointing: llama3_70b() sets them, the overrides
change only what they name. Read from torchtitan/models/*/config_registry.py of torchtitan 0.3.0, and pinned to
the functions themselves by tests/check/test_torchtitan_configs.py; only the settings check reads (the sections
and keys of torchtitan_toml.KNOWN) and those that differ from torchtitan's own defaults are listed.
"""

from __future__ import annotations

import copy
from typing import Any

from autotune.emit.torchtitan import BF16_CONFIG, bf16_config_name, float8_configs, moe_config_name
from autotune.emit.torchtitan_mapping import MOE_REGISTRY, REGISTRY

#: config function -> {section: {key: value}}; activation_checkpoint "mode" stands for the function's FullAC /
#: SelectiveAC config, model "converters" for its Float8 linear converter.
CONFIG_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "llama3_8b": {"training": {"local_batch_size": 1, "seq_len": 8192},
                  "activation_checkpoint": {"mode": "selective"}},
    "llama3_70b": {"training": {"local_batch_size": 8, "seq_len": 8192},
                   "parallelism": {"tensor_parallel_degree": 8}, "activation_checkpoint": {"mode": "full"}},
    "llama3_405b": {"training": {"local_batch_size": 2, "seq_len": 8192},
                    "parallelism": {"tensor_parallel_degree": 8}, "activation_checkpoint": {"mode": "full"},
                    "compile": {"enable": True, "enable_async_tensor_parallel": True},
                    "model": {"converters": ["float8"]}},
    "qwen3_30b_a3b": {"training": {"local_batch_size": 2, "seq_len": 4096},
                      "activation_checkpoint": {"mode": "full"}},
    "deepseek_v3_671b": {"training": {"local_batch_size": 4, "seq_len": 4096},
                         "parallelism": {"expert_parallel_degree": 2,
                                         "pipeline_parallel_schedule": "Interleaved1F1B"},
                         "activation_checkpoint": {"mode": "selective"},
                         "compile": {"enable": True, "components": ["loss"]}},
    "deepseek_v3_16b": {"training": {"local_batch_size": 4, "seq_len": 4096},
                        "parallelism": {"expert_parallel_degree": 8, "pipeline_parallel_schedule": "Interleaved1F1B"},
                        "activation_checkpoint": {"mode": "selective"},
                        "compile": {"enable": True, "components": ["loss"]}},
    "qwen3_0_6b": {"training": {"local_batch_size": 4, "seq_len": 4096},
                   "activation_checkpoint": {"mode": "selective"}},
    "qwen3_1_7b": {"training": {"local_batch_size": 4, "seq_len": 4096},
                   "activation_checkpoint": {"mode": "selective"}},
    "qwen3_14b": {"training": {"local_batch_size": 4, "seq_len": 4096}, "activation_checkpoint": {"mode": "full"}},
    "qwen3_32b": {"training": {"local_batch_size": 2, "seq_len": 4096}, "activation_checkpoint": {"mode": "full"}},
    "gpt_oss_120b": {"training": {"local_batch_size": 1, "seq_len": 8192}, "activation_checkpoint": {"mode": "full"}},
    "gpt_oss_20b": {"training": {"local_batch_size": 1, "seq_len": 8192}, "activation_checkpoint": {"mode": "full"}},
}


def _own_bases() -> dict[str, str]:
    """The config functions autotune's launch writes (emit/torchtitan.py) -> the function each replaces only the
    model and learning rate of: the bf16 Llama 3 on llama3_70b's recipe, an MoE flavor on its `base`."""
    out = {bf16_config_name(config): "llama3_70b" for config in BF16_CONFIG}
    out.update(float8_configs())
    out.update((moe_config_name(m), m.base) for m in MOE_REGISTRY.values() if not m.config)
    return out


def config_defaults(name: str) -> dict[str, dict[str, Any]]:
    """The settings config function `name` starts a launch from (empty for one autotune does not know)."""
    out = copy.deepcopy(CONFIG_DEFAULTS.get(_own_bases().get(name, name), {}))
    if name in float8_configs():  # autotune's FP8 function: its base's settings, the linear layers converted
        out.setdefault("model", {})["converters"] = ["float8"]
    return out


def with_overrides(defaults: dict[str, dict[str, Any]], tree: dict[str, Any]) -> dict[str, Any]:
    """The config function's settings with the launch's overrides on top, key by key."""
    out: dict[str, Any] = {section: dict(body) for section, body in defaults.items()}
    for section, body in tree.items():
        if isinstance(body, dict) and isinstance(out.get(section), dict):
            out[section].update(body)
        else:
            out[section] = body
    return out


def model_options_message(section: dict[str, Any], model: str | None) -> str:
    """torchtitan 0.3.x suppresses the model from its command line (Trainer.Config.model_spec: a config function
    sets it, converters included), so tyro refuses a launch giving --model.* as unrecognized options. The message
    names the config function that builds `model` (the catalog model the options name), or where Float8 comes
    from."""
    given = ", ".join(f"--model.{key} {value}" for key, value in section.items())
    config = (MOE_REGISTRY[model].config if model in MOE_REGISTRY else REGISTRY[model][0] if model in REGISTRY
              else "")
    if "flavor" in section or "name" in section:
        fix = (f"give --module {section.get('name', 'llama3')} --config {config}" if config else
               "give --module and --config naming a config function that builds it")
    else:
        fix = "its Float8 linears come with a config function that converts them (llama3_405b's does)"
    return (f"{given}: torchtitan 0.3.x takes no model options on its command line (tyro refuses them: a config "
            f"function builds the model); {fix}, or check the 0.2.x TOML that sets [model]")


def unknown_config_note(name: str) -> str:
    """What a config function without a catalog model is read as: its settings where CONFIG_DEFAULTS lists
    them, else torchtitan 0.3.0's own defaults (Trainer.Config: local_batch_size 8, seq_len 2048, SelectiveAC),
    which the function may change."""
    if config_defaults(name):
        return f"--config {name}: its model is not in autotune's catalog, so it comes from --model; {name}'s batch, " \
               "sequence length and checkpointing are read as it sets them"
    return (f"--config {name}: not a torchtitan config function autotune knows, so the model comes from --model and "
            "the batch, sequence length and activation checkpointing from the overrides, else torchtitan's defaults "
            f"(local_batch_size 8, seq_len 2048, selective): give them as overrides to check what {name} sets")
