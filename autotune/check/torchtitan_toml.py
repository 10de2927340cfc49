"""torchtitan configs read back into a Reading: a 0.2.x TOML job file, or 0.3.x command-line overrides (a launch
script running `-m torchtitan.train`, or a file of overrides one per line).

Both use the same section.key names (torchtitan/config/job_config.py in 0.2.2, config/configs.py in 0.3.0), so
both become one nested dict and one mapping, the inverse of autotune/emit/torchtitan_mapping.py:
* dp = data_parallel_replicate_degree x data_parallel_shard_degree; FSDP2 with fsdp_reshard_after_forward
  "always" (or "default" without a pipeline) is ZeRO-3; "never" (or "default" with one) keeps the gathered
  weights from forward to backward, ZeRO-2-like: read as ZeRO-2 without a pipeline, ZeRO-1 with one (the
  closest stage a pipeline allows; torchtitan has no ZeRO-1/2 and the emitter maps both there);
* local_batch_size is per data-parallel rank per step with a pipeline (micro-batches of
  pipeline_parallel_microbatch_size), else one micro-batch, accumulated to global_batch_size;
* schedules: 1F1B, Interleaved1F1B (vpp = virtual stages / pp), ZBVZeroBubble (read as v-half: the same V
  placement; it keeps about 1F1B's activation memory, noted);
* the partition: module_fqns_per_model_part (layers.N per virtual stage) or pipeline_parallel_layers_per_stage
  with first/last_stage_less_layers (torchtitan's own split, reproduced in understood.py).
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from typing import Any

from autotune.catalog import model_names
from autotune.check.bash import Shell, tokenize
from autotune.check.reading import Reading, check_sizes, misspelling_of
from autotune.check.script import launch_words, launcher_world
from autotune.check.torchtitan_configs import (config_defaults, model_options_message, unknown_config_note,
                                              with_overrides)
from autotune.check.torchtitan_settings import compiled_model, get as _get, memory_budget, optimizer_states
from autotune.emit.torchtitan import own_config_names
from autotune.emit.torchtitan_mapping import MOE_REGISTRY, REGISTRY
from autotune.errors import SpecError

#: Sections that never change the plan (logging, checkpoints, optimizer, data...).
NEUTRAL_SECTIONS = ("job", "metrics", "optimizer", "lr_scheduler", "checkpoint", "profiling", "comm", "validation",
                    "fault_tolerance", "memory_estimation", "debug", "experimental", "float8", "mx", "dataloader",
                    "profiler", "quantize", "tokenizer")
#: 0.3.x top-level options that do not change the plan (paths, the run's name).
NEUTRAL_OPTIONS = ("--hf_assets_path", "--dump_folder", "--description", "--print_config", "--seed")
KNOWN = {
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param",
                 "mixed_precision_reduce", "disable_cuda_graphs", "steps", "dataset", "dataset_path",
                 "max_norm", "warmup_steps", "gc_freq", "seed", "deterministic"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "enable_sequence_parallel", "context_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "module_fqns_per_model_part",
                    "enable_async_tensor_parallel", "disable_loss_parallel", "enable_compiled_autograd",
                    "pipeline_parallel_split_points", "context_parallel_rotate_method", "expert_parallel_degree",
                    "expert_tensor_parallel_degree"},
    "compile": {"enable", "enable_async_tensor_parallel", "components", "backend"},
    "activation_checkpoint": {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                              "memory_budget", "visualize_memory_budget_pareto"},
    "model": {"name", "flavor", "converters", "tokenizer_path", "hf_assets_path", "norm_type"},
}
SCHEDULES = {"1F1B": "1f1b", "Interleaved1F1B": "interleaved", "ZBVZeroBubble": "v-half"}
#: torch.distributed.pipelining's other schedules (get_schedule_class), which run but autotune does not cost.
OTHER_SCHEDULES = ("GPipe", "LoopedBFS", "InterleavedZeroBubble", "DualPipeV", "PipelineScheduleSingle",
                   "PipelineScheduleMulti")
#: torchtitan's flavor names (0.2.x) and config functions (0.3.x) -> the first catalog model of that shape.
FLAVORS = {flavor: name for name, (_, flavor) in reversed(REGISTRY.items())}
CONFIGS = {config: name for name, (config, _) in reversed(REGISTRY.items())}
# torchtitan's MoE config functions name their catalog model too
CONFIGS.update((m.config, name) for name, m in MOE_REGISTRY.items() if m.config)
# and so do the config functions autotune's own launch writes beside it (the bf16 405B, Qwen3-235B-A22B)
CONFIGS.update(own_config_names())
#: torchtitan 0.2.x MoE models: (model.name, model.flavor) -> the catalog model.
MOE_FLAVORS = {(m.module, m.flavor): name for name, m in MOE_REGISTRY.items()}


def flavor_model(section: dict[str, Any]) -> str | None:
    """The catalog model a [model] section's name and flavor are in torchtitan, or None."""
    flavor, module = section.get("flavor"), section.get("name", "llama3")
    return MOE_FLAVORS.get((module, flavor)) or (FLAVORS.get(flavor) if module == "llama3" else None)


def read_toml(text: str) -> Reading:
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"not valid TOML: {exc}; fix the file (torchtitan 0.2.x job config)") from None
    notes: list[str] = []
    section = tree.get("model") if isinstance(tree.get("model"), dict) else {}
    flavor, module = section.get("flavor"), section.get("name", "llama3")
    if flavor is not None and not isinstance(flavor, str):
        raise SpecError(f"model.flavor must be a string, got {flavor!r}")
    # autotune's own TOML names a catalog model as the flavor to add where torchtitan has none (emit/torchtitan.py)
    model = flavor_model(section) or (flavor if flavor in model_names() else None)
    if flavor and model is None:
        notes.append(f"model {module!r} flavor {flavor!r}: not a torchtitan model autotune knows (its llama3 "
                     f"flavors, and {', '.join(f'{m} {f}' for m, f in sorted(MOE_FLAVORS))}); give --model")
    return reading_from_tree(tree, "toml", model, notes)


def read_overrides(text: str) -> Reading:
    """A 0.3.x launch script (its words after torchtitan.train) or a file of overrides."""
    launch = Shell()
    if "torchtitan.train" in text or "torchtitan/train.py" in text:
        words, notes = launch_words(text, lambda w: w in ("torchtitan.train", "torchtitan/train.py"),
                                    "torchtitan.train", launch)
    else:  # a file of overrides: expand defaults, nothing to run
        words = [w for word in tokenize(text) if not isinstance(word, str) for w in launch.expand(word)]
        notes = list(launch.notes)
    tree: dict[str, Any] = {}
    model, config = None, ""
    i = 0
    while i < len(words):
        # tyro takes `--section.key value` and `--section.key=value`, with `-` or `_` inside names alike
        word, _, inline = words[i].partition("=") if words[i].startswith("--") else (words[i], "", "")
        word = "--" + word[2:].replace("-", "_") if word.startswith("--") else word
        j = i + 1
        while j < len(words) and not inline and (_is_number(words[j]) or not words[j].startswith("-")) \
                and ":" not in words[j]:
            j += 1
        values = [inline] if inline else words[i + 1:j]
        if word.replace("_", "-").startswith("activation-checkpoint:"):
            tree.setdefault("activation_checkpoint", {})["mode"] = word.split(":", 1)[1]
        elif word in ("--module", "--config"):
            if word == "--config" and values:
                config, model = values[0], CONFIGS.get(values[0])
                if model is None and values[0]:
                    notes.append(unknown_config_note(values[0]))
        elif word in NEUTRAL_OPTIONS:
            pass
        elif word.startswith("--") and "." in word:
            section, _, key = word[2:].partition(".")
            tree.setdefault(section, {})[key.removeprefix("no_")] = _value(values, not key.startswith("no_"))
        elif word:
            notes.append(f"argument {words[i]!r} ignored")
        i = j
    job = tree.get("job")
    if isinstance(tree.get("model"), dict) and not (isinstance(job, dict) and job.get("config_file")):
        raise SpecError(model_options_message(tree["model"], flavor_model(tree["model"])))
    if isinstance(job, dict) and job.get("config_file"):  # torchtitan 0.2.x: the TOML holds the run's settings
        others = sorted(f"--{sec}.{key}" for sec, body in tree.items() if isinstance(body, dict) for key in body
                        if (sec, key) != ("job", "config_file"))
        toml = str(job["config_file"]).strip("'\"")
        raise SpecError(f"--job.config_file {toml}: the run takes its settings from that TOML, which autotune does "
                        f"not follow from a script; check it: autotune check {toml}"
                        + (f" (with the script's overrides {', '.join(others)} written into it)" if others else ""))
    if not config:
        notes.append("no --config: costed from torchtitan's own defaults (bf16 linears among them); the config "
                     "function a launch names sets the recipe, FP8 included: check the launch script to read it")
    return replace(reading_from_tree(with_overrides(config_defaults(config), tree), "cli", model, notes),
                   launch=launcher_world(launch.launcher))


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _value(values: list[str], positive: bool) -> Any:
    if not values:
        return positive
    if len(values) > 1 or "," in values[0]:
        return [v.split(",") for v in values]
    v = values[0]
    return int(v) if v.lstrip("-").isdigit() else {"true": True, "false": False}.get(v.lower(), v)


def _check_known(tree: dict[str, Any], notes: list[str]) -> None:
    for section, body in tree.items():
        if section in NEUTRAL_SECTIONS:
            continue
        if not isinstance(body, dict):
            raise SpecError(f"[{section}] must be a table, got {body!r}")
        if section not in KNOWN:
            meant = misspelling_of(section, set(KNOWN) | set(NEUTRAL_SECTIONS))
            if meant is not None:
                raise SpecError(f"[{section}]: torchtitan refuses sections its config does not define; did you mean "
                                f"[{meant}]?")
            notes.append(f"section [{section}] ignored (not one autotune reads)")
            continue
        for key in sorted(set(body) - KNOWN[section]):
            meant = misspelling_of(key, KNOWN[section])
            if meant is not None:
                raise SpecError(f"{section}.{key}: torchtitan refuses settings its config does not define; did you "
                                f"mean {section}.{meant}?")
            notes.append(f"{section}.{key} ignored (not a setting autotune reads)")


#: Keys earlier torchtitan TOMLs kept elsewhere (the same meaning): (section, key) -> where 0.2.x reads it.
MOVED = {("training", "batch_size"): ("training", "local_batch_size"), ("training", "compile"): ("compile", "enable"),
         **{("training", k): ("parallelism", k) for k in (
             "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
             "enable_async_tensor_parallel", "disable_loss_parallel")},
         **{("experimental", k): ("parallelism", k) for k in (
             "pipeline_parallel_degree", "context_parallel_degree", "pipeline_parallel_schedule",
             "pipeline_parallel_split_points", "context_parallel_rotate_method")}}
#: Earlier keys whose meaning changed since: refused, with the key to use.
CHANGED = {("experimental", "pipeline_parallel_microbatches"): "[parallelism] pipeline_parallel_microbatch_size "
           "(micro-batch size, where this counted micro-batches)"}


def _moved_keys(tree: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The tree with earlier torchtitan's keys (MOVED) read where 0.2.x has them, each with a note; a key set in
    both places, or one whose meaning changed (CHANGED), is an error naming the key to use."""
    out = {name: dict(body) if isinstance(body, dict) else body for name, body in tree.items()}
    for (section, key), why in CHANGED.items():
        if isinstance(out.get(section), dict) and key in out[section]:
            raise SpecError(f"[{section}] {key}: an earlier torchtitan's key; give {why}")
    for (section, key), (to_section, to_key) in MOVED.items():
        if not isinstance(out.get(section), dict) or key not in out[section]:
            continue
        target = out.setdefault(to_section, {})
        if not isinstance(target, dict) or to_key in target:
            raise SpecError(f"[{section}] {key} and [{to_section}] {to_key} both set: keep [{to_section}] {to_key}")
        target[to_key] = out[section].pop(key)
        notes.append(f"[{section}] {key}: an earlier torchtitan's key, read as [{to_section}] {to_key}")
    return out


def reading_from_tree(tree: dict[str, Any], fmt: str, model: str | None, notes: list[str]) -> Reading:
    tree = _moved_keys(tree, notes)
    _check_known(tree, notes)
    tp = _get(tree, "parallelism", "tensor_parallel_degree", int, 1)
    pp = _get(tree, "parallelism", "pipeline_parallel_degree", int, 1)
    cp = _get(tree, "parallelism", "context_parallel_degree", int, 1)
    replicate = _get(tree, "parallelism", "data_parallel_replicate_degree", int, 1)
    shard = _get(tree, "parallelism", "data_parallel_shard_degree", int, -1)
    ep = _get(tree, "parallelism", "expert_parallel_degree", int, 1)
    # torchtitan splits experts over ep alone once ep > 1 (0.3.x), over tp like attention with ep 1; 0.2.x's TOML
    # may say expert_tensor_parallel_degree (1 or tp)
    if fmt == "cli" and "expert_tensor_parallel_degree" in (tree.get("parallelism") or {}):
        raise SpecError("--parallelism.expert_tensor_parallel_degree: torchtitan 0.3.x has no such option (its "
                        "experts split over ep alone once ep > 1; 0.2.x's TOML had it); drop it")
    etp = _get(tree, "parallelism", "expert_tensor_parallel_degree", int, 1 if ep > 1 else tp)
    etp = etp if ep > 1 else tp  # 0.2.x reads it only with ep > 1; with ep 1 the experts follow the attention's tp
    check_sizes("torchtitan config", degrees=(tp, pp, cp, replicate, shard))
    check_sizes("torchtitan config", degrees=(ep, etp))  # folded inside the others, not a product with them
    reshard = _get(tree, "parallelism", "fsdp_reshard_after_forward", str, "default")
    if reshard not in ("default", "always", "never"):
        raise SpecError(f"parallelism.fsdp_reshard_after_forward {reshard!r}: use default, always or never")
    zero = 0 if shard == 1 else (3 if reshard == "always" or (reshard == "default" and pp == 1) else
                                 2 if pp == 1 else 1)
    if replicate > 1 and shard != 1 and zero:
        notes.append(f"HSDP (replicate {replicate} x shard {'the rest' if shard == -1 else shard}): the state is "
                     "sharded over the shard degree only, as costed for memory; the step is costed as FSDP over "
                     "every data-parallel rank (the replicas' gradient all-reduce is not)")
    if zero in (1, 2):
        notes.append(f"FSDP2 without resharding after forward: read as ZeRO-{zero} (torchtitan has no ZeRO-1/2; "
                     "weights are sharded between steps too)" + (", the closest stage a pipeline allows" if zero == 1
                                                                  else ""))
    lbs = _get(tree, "training", "local_batch_size", int, 8)
    gbs = _get(tree, "training", "global_batch_size", int, -1)
    seq = _get(tree, "training", "seq_len", int, 2048)
    schedule_name = _get(tree, "parallelism", "pipeline_parallel_schedule", str, "1F1B")
    schedule = _schedule(schedule_name) if pp > 1 else "1f1b"
    if schedule == "v-half":
        notes.append("ZBVZeroBubble read as v-half (the same V placement of 2 stages per rank, its layers evened "
                     "to two equal chunks a rank where torchtitan's split gives a rank an odd count); it keeps about "
                     "1F1B's activation memory, above the v-half prediction")
    mbs = _get(tree, "parallelism", "pipeline_parallel_microbatch_size", int, 1) if pp > 1 else lbs
    if pp > 1 and lbs % mbs:
        raise SpecError(f"training.local_batch_size {lbs} is not a multiple of "
                        f"parallelism.pipeline_parallel_microbatch_size {mbs}")
    layers, vpp, split, extra = _pipeline(tree, pp, schedule)
    mode = _get(tree, "activation_checkpoint", "mode", str, "selective").replace("-", "_")
    option = str(tree.get("activation_checkpoint", {}).get("selective_ac_option", "op"))
    recompute, recompute_every = {"none": ("none", None), "full": ("full", None)}.get(mode, ("selective", None))
    if mode == "selective" and option.isdigit():
        recompute, recompute_every = "full", int(option)
    elif mode == "memory_budget":
        if not compiled_model(tree):  # torchtitan 0.3.0 Trainer.Config validation refuses it
            raise SpecError("activation-checkpoint:memory-budget needs the model compiled: torchtitan refuses it "
                            "otherwise; add --compile.enable and 'model' to --compile.components")
        recompute = memory_budget(tree, notes)
    elif mode not in ("none", "full", "selective"):
        raise SpecError(f"activation_checkpoint.mode {mode!r}: use none, selective, full or memory_budget")
    async_tp = bool(_get(tree, "compile", "enable_async_tensor_parallel", bool, False)
                    or _get(tree, "parallelism", "enable_async_tensor_parallel", bool, False))
    sp = tp > 1 and (fmt == "toml" or _get(tree, "parallelism", "enable_sequence_parallel", bool, True))
    precision = _get(tree, "training", "mixed_precision_param", str, "bfloat16")
    converters = tree.get("model", {}).get("converters", [])
    if isinstance(converters, str):  # `converters = "float8"`: names, not a list of characters (read by character,
        converters = converters.replace(",", " ").split()  # float8 went unseen; user-tester)
    dtype = "fp8" if any("float8" in str(c) for c in converters) else "bf16"
    if precision != "bfloat16":
        notes.append(f"training.mixed_precision_param {precision}: costed as bf16")
    return Reading(optimizer_states=optimizer_states(tree, fmt),
        trainer="torchtitan", tp=tp, pp=pp, cp=cp, dp=None if shard == -1 else replicate * shard, ep=ep, etp=etp,
        mbs=mbs, num_microbatches=lbs // mbs if pp > 1 else None, global_batch=None if gbs == -1 else gbs,
        seq_len=seq, vpp=vpp, schedule=schedule, recompute=recompute,
        recompute_every=recompute_every, zero=zero, sequence_parallel=sp,
        tp_overlap=async_tp, layers_per_stage=layers, split=split, split_extra=extra, dtype=dtype,
        fused_kernels=compiled_model(tree), model_name=model, notes=tuple(notes),
        moe_imbalance=1.0 if _get(tree, "debug", "moe_force_load_balance", bool, False) else None,
        shard_replicas=replicate if shard != 1 and zero else 1)


def _schedule(name: str) -> str:
    """autotune's schedule for torchtitan's name of it, which torch's get_schedule_class matches ignoring case."""
    ours = {k.lower(): v for k, v in SCHEDULES.items()}.get(name.lower())
    if ours is not None:
        return ours
    costs = f"autotune costs {', '.join(SCHEDULES)}"
    if name.lower() in (n.lower() for n in OTHER_SCHEDULES):
        raise SpecError(f"parallelism.pipeline_parallel_schedule {name!r}: a torchtitan schedule autotune does not "
                        f"model ({costs}); check the config with one of them")
    raise SpecError(f"parallelism.pipeline_parallel_schedule {name!r}: not a torchtitan schedule (torch's "
                    f"get_schedule_class refuses it); {costs}")


def _pipeline(tree: dict[str, Any], pp: int,
              schedule: str) -> tuple[tuple[int, ...] | None, int, str, tuple[int, ...]]:
    """(layers per rank or None, vpp, split rule, its arguments) from the pipeline settings."""
    if pp == 1:
        return None, 1, "even", ()
    parts = tree.get("parallelism", {}).get("module_fqns_per_model_part")
    if parts is not None:
        if not isinstance(parts, list) or not all(isinstance(p, list) for p in parts):
            raise SpecError("parallelism.module_fqns_per_model_part must be a list of lists of module names")
        counts = [sum(1 for m in part if str(m).startswith("layers.")) for part in parts]
        if len(counts) % pp:
            raise SpecError(f"module_fqns_per_model_part has {len(counts)} parts, not a multiple of "
                            f"pipeline_parallel_degree {pp}")
        return per_rank(counts, pp, schedule), len(counts) // pp, "even", ()
    per_stage = _get(tree, "parallelism", "pipeline_parallel_layers_per_stage", int, 0)
    first = _get(tree, "parallelism", "pipeline_parallel_first_stage_less_layers", int, 1)
    last = _get(tree, "parallelism", "pipeline_parallel_last_stage_less_layers", int, 1)
    stages_per_rank = 1 if schedule == "1f1b" else 2
    return None, stages_per_rank, "torchtitan", (per_stage, first, last, stages_per_rank)


def per_rank(counts: list[int], pp: int, schedule: str) -> tuple[int, ...]:
    """Layers per rank from layers per virtual stage: looped placement (stage v on rank v % pp) or the V."""
    ranks = [0] * pp
    for v, n in enumerate(counts):
        rank = (v if v < pp else 2 * pp - 1 - v) if schedule == "v-half" else v % pp
        ranks[rank] += n
    if schedule == "v-half":  # autotune's V-Half holds two equal chunks a rank: odd counts move a layer, in pairs,
        odd = [i for i, n in enumerate(ranks) if n % 2]  # from the larger to the smaller
        for a, b in zip(odd[0::2], odd[1::2]):
            step = 1 if ranks[a] > ranks[b] else -1
            ranks[a], ranks[b] = ranks[a] - step, ranks[b] + step
    return tuple(ranks)


def torchtitan_split(num_layers: int, pp: int, per_stage: int, first: int, last: int,
                     stages_per_rank: int) -> tuple[tuple[int, ...], int]:
    """torchtitan's own split (distributed/pipeline_parallel.py, generate_llm_fqn_per_model_part): the embedding
    and the head count as `first`/`last` layers; with layers_per_stage K there are ceil((L+first+last)/K) virtual
    stages, else pp x stages per rank; layers then go evenly, the extra ones to the earliest stages."""
    check_sizes("torchtitan pipeline split", degrees=(pp, stages_per_rank), layers=num_layers + first + last)
    effective = num_layers + first + last
    stages = -(-effective // per_stage) if per_stage else pp * stages_per_rank
    if stages % pp:
        raise SpecError(f"pipeline_parallel_layers_per_stage {per_stage} gives {stages} virtual stages, not a "
                        f"multiple of pipeline_parallel_degree {pp}")
    base, extra = divmod(effective, stages)
    counts = [base + (1 if v < extra else 0) for v in range(stages)]
    counts[0] -= first
    counts[-1] -= last
    if min(counts) < 0:
        raise SpecError(f"torchtitan's split of {num_layers} layers over {stages} stages leaves a stage with fewer "
                        "than 0 layers; lower the first/last_stage_less_layers")
    return tuple(counts), stages // pp
