"""torchtitan launch configs: 0.3.x command-line overrides (`cli`, default) or a 0.2.x TOML job file (`toml`).

torchtitan 0.3.0 has no TOML: a Python config function (`--module llama3 --config llama3_8b`) is overridden by
tyro flags such as `--parallelism.tensor_parallel_degree 2`. 0.2.x reads `--job.config_file x.toml`. Both use the
same key names, so one mapping serves both (autotune/emit/torchtitan_mapping.py: data parallelism, the batch,
the partition, the schedules). This module writes the files: the 0.3.x launch script, its overrides and, where a
registry function does more than the plan says, a config function of its own; or the 0.2.x TOML.
"""

from __future__ import annotations

from autotune.emit import EmitInput, EmitResult
from autotune.emit.common import commented, header_lines
from autotune.emit.quote import bash_word, toml_str
from autotune.emit.runfiles import (float_text, launch_shape, nccl_env_block, nodes_block, required_env_block,
                                     sbatch_script, schedule)
from autotune.emit.torchtitan_mapping import MOE_REGISTRY, REGISTRY, Mapping, MoeModel, map_plan, model_shape
from autotune.errors import SpecError

FORMATS = ("cli", "toml")
TARGET = {"cli": "torchtitan 0.3.x command-line overrides", "toml": "torchtitan 0.2.x TOML job config"}
#: Registry functions that switch on more than the plan says (llama3_405b: Float8 linears, torch.compile and async
#: TP; Float8 crashes below SM89 and trains in FP8 on H100 while the plan is bf16). The launch uses a config
#: function of its own instead, written next to the script (CONFIG_MODULE): the 405B model without converters on
#: the 70B recipe, with the 405B recipe's learning rate; compile and async TP come from the flags.
BF16_CONFIG = {"llama3_405b": ("405B", 8e-5)}
CONFIG_MODULE = "autotune_torchtitan_config"


def bf16_config_name(config: str) -> str:
    """The name of the bf16 config function the launch writes in place of torchtitan's `config`."""
    return f"{config}_bf16"


def moe_config_name(moe: MoeModel) -> str:
    """The name of the config function the launch writes for an MoE flavor torchtitan has no function for."""
    return f"{moe.module}_{moe.flavor.lower().replace('-', '_').replace('.', '_')}"


def float8_config_name(config: str) -> str:
    """The name of the FP8 config function the launch writes in place of torchtitan's bf16 `config`."""
    return f"{config}_float8"


def float8_configs() -> dict[str, str]:
    """The FP8 config functions the launch may write -> torchtitan's bf16 function each converts."""
    return {float8_config_name(config): config for config, _ in REGISTRY.values() if config not in BF16_CONFIG}


def own_config_names() -> dict[str, str]:
    """The config functions the launch writes itself (CONFIG_MODULE) -> the catalog model each trains (the first
    of its shape), so `autotune check` reads them back."""
    out = {bf16_config_name(config): name for name, (config, _) in reversed(REGISTRY.items())
           if config in BF16_CONFIG}
    bases = {config: name for name, (config, _) in reversed(REGISTRY.items())}
    out.update((fp8, bases[config]) for fp8, config in float8_configs().items())
    out.update((moe_config_name(m), name) for name, m in MOE_REGISTRY.items() if not m.config)
    return out


def emit_torchtitan(inp: EmitInput, *, fmt: str = "cli") -> EmitResult:
    """torchtitan files for a plan: `launch_torchtitan.sh` + `torchtitan_overrides.txt` (cli) or `torchtitan.toml`."""
    if fmt not in FORMATS:
        raise SpecError(f"--torchtitan-format {fmt!r}: use cli (torchtitan 0.3.x) or toml (torchtitan 0.2.x)")
    m = map_plan(inp, fmt)
    if fmt == "cli":
        overrides = cli_overrides(m)
        nodes, per_node = launch_shape(inp.plan.num_gpus, inp.gpus_per_node)
        files = tuple(sorted((*_config_function(inp)[2], ("launch_torchtitan.sh", _script(inp, m, overrides)),
                              ("sbatch_torchtitan.sh", sbatch_script(inp, "torchtitan", TARGET["cli"],
                                                                     "launch_torchtitan.sh", nodes, per_node, 29500)),
                              ("torchtitan_overrides.txt", "".join(f"{o}\n" for o in overrides)))))
    else:
        files = (("torchtitan.toml", _toml(inp, m)),)
    return EmitResult(files=files, warnings=m.warnings)


# ---------------------------------------------------------------- 0.3.x: command-line overrides


def cli_overrides(m: Mapping) -> list[str]:
    """One override per entry (flag and its values), the activation-checkpoint subcommand last."""
    out = []
    for section, key, value in m.keys:
        flag = f"--{section}.{key}"
        if isinstance(value, bool):
            out.append(flag if value else f"--{section}.no_{key}")
        elif isinstance(value, list) and all(isinstance(part, str) for part in value):
            out.append(f"{flag} {','.join(value)}")  # torchtitan's list syntax: a,b (compile.components)
        elif isinstance(value, list):
            out.append(f"{flag} {' '.join(','.join(part) for part in value)}")
        else:
            out.append(f"{flag} {value}")
    return out + [f"activation-checkpoint:{m.ac_mode}"]


def _config_function(inp: EmitInput) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """(TT_MODULE default, TT_CONFIG default or "" when the user must give one, extra files)."""
    moe = MOE_REGISTRY.get(inp.model.known_as)
    if moe is not None:
        return _moe_config_function(inp, moe)
    registry = REGISTRY.get(inp.model.known_as)
    if registry is None:
        return "llama3", "", ()
    fp8 = inp.job.dtype == "fp8"
    if (registry[0] in BF16_CONFIG) == fp8:  # torchtitan's own function trains the model in the plan's precision
        return "llama3", registry[0], ()
    if fp8:
        return _float8_config_function(inp, *registry)
    flavor, lr = BF16_CONFIG[registry[0]]
    name = bf16_config_name(registry[0])
    module = (commented(header_lines(inp, "torchtitan", TARGET["cli"]) + [
        f"torchtitan's {registry[0]} config function turns on Float8 linears, torch.compile and async TP; this one",
        f"trains the {flavor} model in bf16 on the 70B recipe (data, loss, metrics, checkpointing) with the",
        f"{flavor} recipe's learning rate {lr:g}; compile and async TP come from the launch script's flags."])
        + "import dataclasses\n\n"
        "from torchtitan.components.optimizer import default_adamw\n"
        "from torchtitan.models.llama3 import model_registry\n"
        "from torchtitan.models.llama3.config_registry import llama3_70b\n\n\n"
        f"def {name}():\n"
        f'    return dataclasses.replace(llama3_70b(), model_spec=model_registry("{flavor}"), '
        f"optimizer=default_adamw(lr={lr!r}))\n")
    return CONFIG_MODULE, name, ((f"{CONFIG_MODULE}.py", module),)


def _float8_config_function(inp: EmitInput, config: str, flavor: str) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """An FP8 plan of a model whose torchtitan config function trains in bf16: that function with the model's
    linear layers converted as llama3_405b converts them (Float8LinearConverter, rowwise, the LM head kept bf16)."""
    name = float8_config_name(config)
    module = (commented(header_lines(inp, "torchtitan", TARGET["cli"]) + [
        f"torchtitan's {config} config function trains in bf16; this one converts the {flavor} model's linear layers",
        "to Float8 as llama3_405b does (rowwise scaling, the LM head kept in bf16); the launch script's flags set",
        "the plan, torch.compile included."])
        + "import dataclasses\n\n"
        "from torchtitan.components.quantization import Float8LinearConverter\n"
        "from torchtitan.models.llama3 import model_registry\n"
        f"from torchtitan.models.llama3.config_registry import {config}\n\n\n"
        f"def {name}():\n"
        f'    converter = Float8LinearConverter.Config(filter_fqns=["lm_head"], '
        f"model_compile_enabled={inp.job.fused_kernels!r})\n"
        f'    return dataclasses.replace({config}(), model_spec=model_registry("{flavor}", converters=[converter]))\n')
    return CONFIG_MODULE, name, ((f"{CONFIG_MODULE}.py", module),)


def _moe_config_function(inp: EmitInput, moe: MoeModel) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """torchtitan's own config function of an MoE model, or (no such function, e.g. Qwen3-235B-A22B) one of
    ours: its model_registry flavor on the recipe of `moe.base` (data, optimizer, loss, checkpointing)."""
    if moe.config:
        return moe.module, moe.config, ()
    name = moe_config_name(moe)
    module = (commented(header_lines(inp, "torchtitan", TARGET["cli"]) + [
        f"torchtitan's {moe.module} has the {moe.flavor} model but no config function; this one trains it on the",
        f"{moe.base} recipe (data, optimizer, loss, checkpointing); the launch script's flags set the plan."])
        + "import dataclasses\n\n"
        f"from torchtitan.models.{moe.module} import model_registry\n"
        f"from torchtitan.models.{moe.module}.config_registry import {moe.base}\n\n\n"
        f"def {name}():\n"
        f'    return dataclasses.replace({moe.base}(), model_spec=model_registry("{moe.flavor}"))\n')
    return CONFIG_MODULE, name, ((f"{CONFIG_MODULE}.py", module),)


def run_overrides(inp: EmitInput) -> list[str]:
    """Flags of a real run that are not the plan (0.3.x): the schedule from --train-tokens, checkpoints about
    hourly, logging, no profiler; the data, tokenizer and checkpoint paths come from the environment."""
    s = schedule(inp, "torchtitan")
    out = [f"--training.steps {s.steps}", f"--lr_scheduler.warmup_steps {s.warmup}",
           "--lr_scheduler.decay_type cosine", "--lr_scheduler.min_lr_factor 0.1",
           f"--metrics.log_freq {s.log_interval}", "--profiler.no_enable_profiling"]
    if not inp.mock_data:
        out += ["--checkpoint.enable", f"--checkpoint.interval {s.save_interval}"]
    return out


def _script(inp: EmitInput, m: Mapping, overrides: list[str]) -> str:
    nodes, per_node = launch_shape(inp.plan.num_gpus, inp.gpus_per_node)
    shape = model_shape(inp, "cli")
    module, function, _ = _config_function(inp)
    config = (f'"${{TT_CONFIG:-{function}}}"' if function else
              f'"${{TT_CONFIG:?set TT_CONFIG to a config_registry function with {shape}}}"')
    head = header_lines(inp, "torchtitan", TARGET["cli"]) + [
        "torchtitan 0.3.x: a config function (--module/--config) overridden by the flags below (tyro);",
        "flags after the script's name are passed on before the activation-checkpoint subcommand.",
        "Run it on each node with NODE_RANK (0..nodes-1) and MASTER_ADDR set (sbatch_torchtitan.sh does)."]
    if inp.mock_data:
        head.append("--mock-data: the config function's own dataset and tokenizer paths (c4_test and the test "
                    "tokenizer of a torchtitan checkout).")
    else:
        head.append("Needs DATA_PATH (a local copy of the dataset --dataloader.dataset names, c4 by default), "
                    "TOKENIZER_MODEL (hf_assets_path: the model's tokenizer files) and CHECKPOINT_DIR (dump_folder).")
    flags, subcommand = overrides[:-1], overrides[-1]
    paths = "" if inp.mock_data else (
        'RUN_ARGS+=(--hf_assets_path "$TOKENIZER_MODEL" --dataloader.dataset_path "$DATA_PATH" '
        '--dump_folder "$CHECKPOINT_DIR")\n')
    pythonpath = ('SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
                  'export PYTHONPATH="$SCRIPT_DIR${PYTHONPATH:+:$PYTHONPATH}"  # for ' + module + ".py\n"
                  if module == CONFIG_MODULE else "")
    return ("#!/usr/bin/env bash\n" + commented(head) + commented(list(m.notes)) + "set -euo pipefail\n\n"
            + nodes_block(nodes, per_node) + required_env_block(inp.mock_data) + "\n" + nccl_env_block() + pythonpath + "\n"
            "OVERRIDES=(\n" + "".join(f"  {_words(o)}\n" for o in flags) + ")\n"
            "# A real run (not the plan): schedule from --train-tokens, checkpoints, logging, paths.\n"
            "RUN_ARGS=(\n" + "".join(f"  {_words(o)}\n" for o in run_overrides(inp)) + ")\n" + paths + "\n"
            f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --node-rank \"${{NODE_RANK:-0}}\" \\\n"
            "  --rdzv-backend c10d --rdzv-endpoint \"${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}\" \\\n"
            f"  -m torchtitan.train --module \"${{TT_MODULE:-{module}}}\" --config {config} \\\n"
            f"  \"${{OVERRIDES[@]}}\" \"${{RUN_ARGS[@]}}\" \"$@\" {_words(subcommand)}\n")


def _words(override: str) -> str:
    """An override (a flag and its space-separated values) as bash words, each quoted."""
    return " ".join(bash_word(word) for word in override.split(" "))


# ---------------------------------------------------------------- 0.2.x: TOML


def _toml_value(value: object) -> str:
    """TOML for a bool, int, string, list of strings (one line) or list of lists (one inner list a line)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_str(value)
    assert isinstance(value, list), value
    if value and isinstance(value[0], list):
        return "[\n" + "".join(f"    {_toml_value(v)},\n" for v in value) + "]"
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def _toml(inp: EmitInput, m: Mapping) -> str:
    plan = inp.plan
    nodes, per_node = launch_shape(plan.num_gpus, inp.gpus_per_node)
    registry = REGISTRY.get(inp.model.known_as)
    paths = "" if inp.mock_data else (' --training.dataset_path "$DATA_PATH" --model.hf_assets_path '
                                      '"$TOKENIZER_MODEL" --job.dump_folder "$CHECKPOINT_DIR"')
    head = header_lines(inp, "torchtitan", TARGET["toml"], "toml") + [
        f"run: torchrun --nnodes {nodes} --nproc-per-node {per_node} -m torchtitan.train "
        f"--job.config_file torchtitan.toml{paths}",
        "(TOML cannot require environment variables: the data, tokenizer and checkpoint paths go on the command "
        "line as above)" if paths else "--mock-data: the default dataset and tokenizer (c4_test and the test "
        "tokenizer of a torchtitan checkout)"]
    sections: dict[str, list[str]] = {"job": [], "model": [], "training": [], "optimizer": [], "lr_scheduler": [],
                                      "checkpoint": [], "metrics": [], "parallelism": [], "compile": [],
                                      "activation_checkpoint": []}
    s = schedule(inp, "torchtitan", "toml")  # the run: steps from --train-tokens, warm-up, cosine decay, checkpoints
    sections["training"].append(_toml_line("steps", s.steps))
    # the peak LR and weight decay the other trainers' files set (0.2.x's [optimizer]; AdamW is its default)
    sections["optimizer"] += [_toml_line("name", "AdamW"), f"lr = {float_text(s.lr)}", "weight_decay = 0.1"]
    sections["lr_scheduler"] += [_toml_line("warmup_steps", s.warmup), _toml_line("decay_type", "cosine"),
                                 "min_lr_factor = 0.1"]
    sections["checkpoint"] += [_toml_line("enable", not inp.mock_data), _toml_line("interval", s.save_interval)]
    sections["metrics"].append(_toml_line("log_freq", s.log_interval))
    sections["job"].append(_toml_line("description", f"autotune plan for {inp.model.name}: tp {plan.tp}, pp "
                                      f"{plan.pp}, dp {plan.dp}, cp {plan.cp}"))
    moe = MOE_REGISTRY.get(inp.model.known_as)
    if moe is not None:  # torchtitan's own MoE model (0.2.x: the same module names and flavors)
        sections["model"] += [_toml_line("name", moe.module), _toml_line("flavor", moe.flavor)]
    else:
        if not registry:
            shape = model_shape(inp, "toml")
            sections["model"].append(commented([f"not a torchtitan flavor: add one to llama3_args with {shape}"])[:-1])
        sections["model"] += [_toml_line("name", "llama3"), _toml_line("flavor", registry[1] if registry else
                                                                        inp.model.name)]
    if inp.job.dtype == "fp8":
        sections["model"].append(_toml_line("converters", ["quantize.linear.float8"]))
    sections["parallelism"] += [commented([n])[:-1] for n in m.notes]
    for section, key, value in m.keys:
        sections[section].append(_toml_line(key, value))
    sections["activation_checkpoint"].append(_toml_line("mode", m.ac_mode))
    if m.ac_option:
        sections["activation_checkpoint"].append(_toml_line("selective_ac_option", m.ac_option))
    body = "\n".join(f"[{name}]\n" + "".join(f"{line}\n" for line in lines) for name, lines in sections.items())
    return commented(head) + "\n" + body


def _toml_line(key: str, value: object) -> str:
    return f"{key} = {_toml_value(value)}"
