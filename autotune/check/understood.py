"""The plan a config runs: read the file, detect its trainer, and turn the Reading into Plan, ModelSpec, JobSpec.

The model comes from the config where it defines it (Megatron's shape flags, torchtitan's flavor) and is then
matched to the catalog model of that shape (so names and estimates are the catalog's), else from --model;
both given and different is an error naming the difference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from autotune.catalog import load_model, model_names
from autotune.check.deepspeed_json import is_pipeline_file, parse, read_deepspeed
from autotune.check.detect import check_forced_trainer, detect_trainer
from autotune.check.megatron_args import read_megatron, vocab_padded
from autotune.check.overlaps import overlap_notes
from autotune.check.accumulation import flushes_note, pipeline_flushes
from autotune.check.reading import Reading
from autotune.check.torchtitan_toml import per_rank, read_overrides, read_toml, torchtitan_split
from autotune.emit.deepspeed import CONFIG_FILE, PIPELINE_FILE, deepspeed_split
from autotune.errors import SpecError
from autotune.fileio import slug
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan, default_bucket, is_even_split, normalized
from autotune.specs.trainer_jobs import as_run_model

CHECK_TRAINERS = ("megatron", "torchtitan", "deepspeed")
MAX_CONFIG_BYTES = 4 << 20
_HEADER_MODEL = re.compile(r"^#? ?model (\S+) on \d+ x ", re.M)
_HEADER_ROUTING = re.compile(r"^#? ?routing: the busiest expert's tokens (\d+(?:\.\d+)?(?:e[+-]?\d+)?) x the mean",
                             re.M)
#: autotune's header line for the plan a file runs (emit/common.py), as far as `check` compares it.
_HEADER_PLAN = re.compile(r"plan: tp (\d+), pp (\d+), dp (\d+), cp (\d+), mbs (\d+) x (\d+), ([\w-]+) \(vpp (\d+)\)"
                          r", recompute [^,]*, zero (\d+), layers ([\d,]+)")


@dataclass(frozen=True, slots=True)
class Understood:
    """What `check` understood: the specs the cost model takes, the trainer, and the reading's caveats."""

    trainer: str
    plan: Plan
    model: ModelSpec
    job: JobSpec
    notes: tuple[str, ...]
    torchtitan_format: str | None
    """'toml' or 'cli' for torchtitan configs (the format --emit-better writes), else None."""
    flushes: int = 1
    """Runs of the pipeline schedule a step, plan.num_microbatches / flushes micro-batches each (torchtitan's
    gradient accumulation with a pipeline: pipeline_flushes; costmodel/accumulation.py)."""


def read_text(path: Path) -> str:
    try:
        if path.is_dir():
            raise SpecError(f"{path}: a directory; give the launch config inside it (e.g. launch_megatron.sh, "
                            "ds_config.json, a torchtitan .toml)")
        if not path.exists():
            raise SpecError(f"{path}: no such config file")
        if not path.is_file():
            raise SpecError(f"{path}: not a regular file; give the launch config's path")
        raw = path.read_bytes()[:MAX_CONFIG_BYTES + 1]
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the config ({exc.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise SpecError(f"{path}: larger than the maximum of {MAX_CONFIG_BYTES:,} bytes for a launch config")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text") from None


def read_config(path: Path, trainer: str | None, gpus: int) -> tuple[str, Reading, str | None]:
    """(trainer, reading, torchtitan format) of a config file."""
    text = read_text(path)
    if trainer in CHECK_TRAINERS:
        check_forced_trainer(path, text, trainer)
    trainer = trainer or detect_trainer(path, text)
    if trainer not in CHECK_TRAINERS:
        raise SpecError(f"--trainer {trainer!r}: check reads {', '.join(CHECK_TRAINERS)} configs")
    fmt = None
    if trainer == "megatron":
        reading = _megatron(path, text)
    elif trainer == "torchtitan":
        wrapped = _wrapped_script(path, text)
        if wrapped is not None:
            raise SpecError(f"{path.name} only runs {wrapped} (a Slurm wrapper): check that file")
        fmt = "toml" if path.suffix == ".toml" or re.search(r"^\s*\[\w+\]\s*$", text, re.M) else "cli"
        reading = read_toml(text) if fmt == "toml" else read_overrides(text)
    else:
        reading = _deepspeed(path, text, gpus)
    hint = _HEADER_MODEL.search(text)
    if hint is None and trainer == "deepspeed":
        hint = re.search(r'"model (\S+) on \d+ x ', text)
    header = _HEADER_PLAN.search(text)
    reading = replace(reading, model_hint=hint.group(1) if hint else None,
                      header_plan=header.group(0) if header else None)
    routed = _HEADER_ROUTING.search(text)
    return trainer, replace(reading, header_imbalance=float(routed.group(1)) if routed else None), fmt


def _routing(r: Reading, given: float | None, notes: list[str]) -> float | None:
    """The routing imbalance to cost, noting where it comes from: --moe-imbalance (`given`), the config's own
    forced balance, autotune's header (the run's, planned), or None for the cost model's default."""
    if given is not None:
        if r.moe_imbalance is not None:
            notes.append(f"--moe-imbalance {given:g} replaces the config's own routing ({r.moe_imbalance:g}: "
                         "balance forced)")
        return given
    if r.moe_imbalance is None and r.header_imbalance is not None:
        notes.append(f"routing imbalance {r.header_imbalance!r} from autotune's header (the run's, no flag sets it; "
                     "--moe-imbalance checks another)")
        return r.header_imbalance
    return r.moe_imbalance

def header_note(header: str | None, plan: Plan) -> str | None:
    """A note when autotune's own header names another plan than the flags run (the file was edited since)."""
    m = _HEADER_PLAN.search(header or "")
    if m is None:
        return None
    # ZeRO is left out: torchtitan and DeepSpeed have no exact ZeRO-1/2, so a header and a reading may name
    # neighbouring stages for the same settings
    said = (*map(int, m.groups()[:6]), m.group(7), int(m.group(8)), tuple(int(n) for n in m.group(10).split(",")))
    runs = (plan.tp, plan.pp, plan.dp, plan.cp, plan.mbs, plan.num_microbatches, plan.schedule, plan.vpp,
            plan.layers_per_stage)
    if said == runs:
        return None
    if said[:2] + said[3:5] + said[6:] == runs[:2] + runs[3:5] + runs[6:]:  # only dp (and micro-batches) differ
        gpus = said[0] * said[1] * said[2] * said[3]
        return (f"the file's autotune header plans dp {said[2]} ({gpus} GPUs), checked here at --gpus "
                f"{plan.num_gpus} (dp {plan.dp}); autotune's launch scripts refuse another world size")
    return f"the file's autotune header says '{m.group(0)}', but its settings run the plan above (edited since?)"


def _script_beside(path: Path, text: str) -> str | None:
    """The first shell script `text` names (other than itself) that lies beside `path`: the one a Slurm script
    runs (emit's sbatch_<trainer>.sh runs launch_<trainer>.sh). None when it names none."""
    beside = [name for name in sorted(set(re.findall(r"([\w.-]+\.sh)\b", text)) - {path.name})
              if (path.parent / name).is_file()]
    return beside[0] if beside else None


def _wrapped_script(path: Path, text: str) -> str | None:
    """The script beside `path` that this one only runs: a shell script with no torchtitan settings or entry
    point of its own. None otherwise."""
    if path.suffix not in (".sh", ".bash") or re.search(r"--[a-z_]+\.[a-z_]+|torchtitan\.train|train\.py", text):
        return None
    return _script_beside(path, text)


def _megatron(path: Path, text: str) -> Reading:
    """read_megatron, with a pointer to the launch script when this one (a Slurm script) only runs another."""
    try:
        return read_megatron(text)
    except SpecError as exc:
        beside = _script_beside(path, text)
        if "no pretrain_gpt.py call" in str(exc) and beside:
            raise SpecError(f"{exc}; {path.name} runs {beside}: check that file") from None
        raise


def _deepspeed(path: Path, text: str, gpus: int) -> Reading:
    doc = parse(text, str(path))
    if is_pipeline_file(doc):
        pipeline, config_path = doc, path.with_name(CONFIG_FILE)
        config = parse(read_text(config_path), str(config_path))
    else:
        config, sibling = doc, path.with_name(PIPELINE_FILE)
        pipeline = parse(read_text(sibling), str(sibling)) if sibling.is_file() else None
    return read_deepspeed(config, pipeline, gpus, str(path))


# ------------------------------------------------------------------------------------------------ the model
def shape_diffs(found: dict[str, Any], spec: ModelSpec, seq_len: int | None) -> list[str]:
    """Fields where the config's shape and a ModelSpec differ ('field config vs model'). Megatron has no GeGLU
    flag (its --swiglu stands for both gated MLPs), learned positions shorter than the sequence are emitted as
    the sequence length, and shared experts are one total width (--moe-shared-expert-intermediate-size)."""
    out = []
    shared = ("num_shared_experts", "shared_expert_ffn_hidden_size")
    if all(k in found for k in shared):  # Megatron states the shared experts' total width: n experts of w = 1 of n*w
        if found[shared[0]] * found[shared[1]] != spec.num_shared_experts * spec.shared_expert_ffn_hidden_size:
            out.append(f"shared-expert width {found[shared[0]] * found[shared[1]]} vs "
                       f"{spec.num_shared_experts * spec.shared_expert_ffn_hidden_size}")
        found = {k: v for k, v in found.items() if k not in shared}
    for key, value in found.items():
        have = getattr(spec, key)
        if key == "activation" and value == "swiglu" and have == "geglu":
            continue
        if key == "max_position_embeddings" and seq_len is not None and have < seq_len and value == seq_len:
            continue
        if have != value:
            out.append(f"{key} {value} vs {have}")
    return out


def resolve_model(reading: Reading, model_arg: str | None, fallback: str, seq_len: int | None) -> tuple[ModelSpec,
                                                                                                        list[str]]:
    """The model the config trains: its flags' shape, matched to the catalog (or to --model) where it agrees.
    Multi-token prediction modules and group-limited routing are what the config trains, not part of the shape:
    the match ignores them and the result has the config's."""
    found = reading.model_fields
    trained = {} if found is None else {k: found[k] for k in TRAINING_FIELDS if k in found}
    if found is not None:
        found = {k: v for k, v in found.items() if k not in TRAINING_FIELDS}
    model, notes = _resolve_shape(reading, found, model_arg, fallback, seq_len)
    if trained and any(getattr(model, k) != v for k, v in trained.items()):
        if trained.get("dropout", model.dropout) != model.dropout:
            notes.append(f"dropout {'on' if trained['dropout'] else 'off'} as the config runs it ({model.name} is "
                         f"catalogued with it {'on' if model.dropout else 'off'}); costed as the config runs it")
        model = replace(model, **trained)
    return model, notes


#: Model fields a config sets as training choices, not shape (its readers give all of them but dropout, 0 where a
#: flag is absent; Megatron's dropout is on unless both dropout flags are 0)
TRAINING_FIELDS = ("mtp_layers", "moe_router_groups", "moe_router_group_topk", "router_bias", "dropout")


def _resolve_shape(reading: Reading, found: dict[str, Any] | None, model_arg: str | None, fallback: str,
                   seq_len: int | None) -> tuple[ModelSpec, list[str]]:
    notes: list[str] = []
    if found is None and reading.model_name is not None:
        found = {f.name: getattr(named := load_model(reading.model_name), f.name) for f in fields(ModelSpec)
                 if f.name not in ("name", "source")}
        if model_arg is None:
            return named, notes
    if found is None:
        if model_arg is None:
            why = next((n for n in reading.notes if "not a torchtitan model autotune knows" in n), "")
            raise SpecError(f"the {reading.trainer} config does not define the model"
                            + (f" ({why.split(';')[0]})" if why else "")
                            + "; pass --model NAME (see `autotune models`) or a config.json path")
        return load_model(model_arg), notes
    if model_arg is not None:
        spec = load_model(model_arg)
        diffs = shape_diffs(found, spec, seq_len)
        if diffs:
            raise SpecError(f"the config's model differs from --model {model_arg} in {', '.join(diffs)} (config vs "
                            "--model); drop --model to check the config's own model, or fix the config")
        return spec, notes
    soft = reading.model_soft or {}
    matches = [m for m in (load_model(n) for n in model_names()) if not shape_diffs(found, m, seq_len)]
    matches.sort(key=lambda m: (m.name != reading.model_hint,
                                sum(getattr(m, k, v) != v for k, v in soft.items())))
    if matches:
        if len(matches) > 1 and reading.model_hint != matches[0].name:
            notes.append(f"the config's model has the shape of {matches[0].name} (also "
                         f"{', '.join(m.name for m in matches[1:])}); pass --model to name another")
        return matches[0], notes
    if "vocab_size" not in found:
        near = min(((shape_diffs(found, m, seq_len), m.name) for m in (load_model(n) for n in model_names())),
                   key=lambda d: len(d[0]))
        hint = f" (the closest catalog model, {near[1]}, differs in {', '.join(near[0])})" if len(near[0]) <= 2 else ""
        why = ("the tokenizer sets it; --vocab-size counts only with --tokenizer-type NullTokenizer"
               if reading.trainer == "megatron" else "the tokenizer sets it")
        raise SpecError(f"the config defines a model that is not in the catalog{hint} and does not give its "
                        f"vocabulary size ({why}); pass --model NAME or a config.json path")
    notes.append(f"the config's model matches no catalog model; checked as {fallback}, the shape its flags give")
    known = {f.name for f in fields(ModelSpec)}
    extra = {k: v for k, v in soft.items() if k in known}
    return ModelSpec(name=fallback, source="flags of the checked config", **found, **extra), notes


# ------------------------------------------------------------------------------------------------ the plan
def _layers(r: Reading, model: ModelSpec) -> tuple[tuple[int, ...], int]:
    """(layers per rank, vpp) where the config leaves them to the trainer's own split rule."""
    n, pp = model.num_layers, r.pp
    if r.layers_per_stage is not None:
        return r.layers_per_stage, r.vpp
    if r.split == "deepspeed":
        return deepspeed_split(n, pp), r.vpp
    if r.split == "torchtitan":
        per_stage, first, last, stages_per_rank = r.split_extra
        counts, vpp = torchtitan_split(n, pp, per_stage, first, last, stages_per_rank)
        return per_rank(list(counts), pp, r.schedule), vpp
    emb, loss = r.split_extra if r.split == "account" else (0, 0)
    if (n + emb + loss) % pp:
        raise SpecError(f"--num-layers {n}{' + embedding/loss' if emb or loss else ''} is not divisible by "
                        f"--pipeline-model-parallel-size {pp} (Megatron requires it without an uneven split); "
                        "give --decoder-first/last-pipeline-num-layers or a layout")
    per = (n + emb + loss) // pp
    layers = [per] * pp
    layers[0] -= emb
    layers[-1] -= loss
    return tuple(layers), r.vpp


#: The Reading's sizes, degrees and counts, each at least 1 where the config gives it, and how messages name them
READING_COUNTS = (("tp", "tensor-parallel degree"), ("pp", "pipeline-parallel degree"),
                  ("cp", "context-parallel degree"), ("ep", "expert-parallel degree"),
                  ("etp", "expert-tensor-parallel degree"), ("dp", "data-parallel degree"), ("mbs", "micro-batch size"),
                  ("global_batch", "global batch size"), ("num_microbatches", "gradient accumulation steps"),
                  ("vpp", "model chunks per pipeline rank"), ("bucket_size", "gradient bucket size"),
                  ("recompute_layers", "number of recomputed layers"), ("recompute_every", "checkpointing interval"))


def understand(path: Path, reading: Reading, *, trainer: str, fmt: str | None, gpus: int,
               model_arg: str | None, seq_len_arg: int | None, imbalance_arg: float | None = None) -> Understood:
    """The Plan, ModelSpec and JobSpec of a reading on --gpus GPUs (rule checks are the caller's check_plan).
    The routing imbalance is --moe-imbalance's (`imbalance_arg`), else the config's, else autotune's header's."""
    r = reading
    if r.seq_len is not None and r.seq_len < 1:
        raise SpecError(f"the {trainer} config trains {r.seq_len}-token sequences; fix its sequence length (>= 1)")
    for field, label in READING_COUNTS:  # a 0 would divide by zero, or read as unset and be replaced by a default
        if (value := getattr(r, field)) is not None and value < 1:
            raise SpecError(f"the {trainer} config's {label} is {value}; fix it in the config (at least 1)")
    if r.seq_len and seq_len_arg and seq_len_arg != r.seq_len:
        raise SpecError(f"--seq-len {seq_len_arg}: the {trainer} config trains {r.seq_len}-token sequences; drop "
                        "--seq-len or give the same")
    seq_len = r.seq_len or seq_len_arg
    if seq_len is None:
        raise SpecError(f"the {trainer} config does not give the sequence length; pass --seq-len N")
    try:
        model, notes = resolve_model(r, model_arg, slug(r.model_hint or path.stem, fallback="config-model"), seq_len)
    except SpecError as exc:  # emit's torchtitan_overrides.txt: its launch script beside it names the model
        hint = r.model_hint
        if model_arg is None and hint and hint.endswith(".json") and not str(exc).endswith("names it"):
            # a config planned from a config.json: autotune's header names the file, which the flags cannot
            raise SpecError(f"{exc}, or pass --model {hint} (the model file autotune's header names)") from None
        launch = path.with_name("launch_torchtitan.sh")
        if trainer != "torchtitan" or model_arg is not None or path == launch or not launch.is_file():
            raise
        raise SpecError(f"{exc}, or check {launch.name} beside it, which names it") from None
    notes = list(r.notes) + notes
    run = model if (r.model_fields or {}).get("sliding_window") else as_run_model(model, trainer, seq_len)
    if run != model:  # only torchtitan's emitted config builds a model's window (emit warns so), or a Megatron
        # script giving --window-size itself (megatron-core's TransformerConfig.window_size)
        notes.append(f"{model.name}: the config sets no attention window, so its {model.sliding_window_layers} "
                     f"windowed layers run full attention over {seq_len} tokens; costed so")
        model = run
    plan = build_plan(r, model, gpus, trainer)
    said, overlaps = overlap_notes(r, plan)
    notes += said
    if (flushes := pipeline_flushes(r, plan)) > 1:
        notes.append(flushes_note(plan, flushes))
    job = JobSpec(global_batch=plan.dp * plan.mbs * plan.num_microbatches, seq_len=seq_len,
                  dtype=r.dtype, flash_attention=r.flash_attention,  # type: ignore[arg-type]
                  fused_kernels=r.fused_kernels, grad_reduce=r.grad_reduce, optimizer_states=r.optimizer_states,
                  trainer=trainer,  # type: ignore[arg-type]
                  moe_dispatcher=r.moe_dispatcher, cross_entropy=r.cross_entropy,  # type: ignore[arg-type]
                  **overlaps)
    if (imbalance := _routing(r, imbalance_arg, notes)) is not None:
        job = replace(job, moe_imbalance=imbalance)
    if r.moe_capacity[0] and model.is_moe:
        if job.moe_dispatcher == "alltoall":
            job = replace(job, moe_capacity_factor=r.moe_capacity[0], moe_pad_to_capacity=r.moe_capacity[1])
        else:
            notes.append(f"--moe-expert-capacity-factor {r.moe_capacity[0]:g} with DeepEP: costed dropless (autotune "
                         "prices token dropping for the alltoall dispatcher)")
    note = header_note(r.header_plan, plan)
    if note is not None:
        notes.append(note)
    if r.vocab_divisor and (padded := vocab_padded(model.vocab_size, r.tp, r.vocab_divisor)) != model.vocab_size:
        notes.append(f"vocab {model.vocab_size}: Megatron pads it to {padded}, a multiple of "
                     f"--make-vocab-size-divisible-by {r.vocab_divisor} x tp {r.tp}; costed unpadded (the LM head and "
                     f"embedding {padded / model.vocab_size - 1:.1%} larger in the run)")
    return Understood(trainer=trainer, plan=plan, model=model, job=job, notes=tuple(notes), torchtitan_format=fmt,
                      flushes=flushes)


def build_plan(r: Reading, model: ModelSpec, gpus: int, trainer: str) -> Plan:
    """The reading's plan on `gpus` GPUs: dp from the GPU count (checked against a stated dp), micro-batches from
    the global batch, the trainer's layer split and gradient bucket where the config leaves them."""
    mp = r.tp * r.pp * r.cp
    if r.dp is not None and r.dp * mp != gpus:
        raise SpecError(f"the config's degrees tp {r.tp} x pp {r.pp} x cp {r.cp} x dp {r.dp} = {r.dp * mp} GPUs, but "
                        f"--gpus is {gpus}; check on {r.dp * mp} GPUs or change a degree")
    if gpus % mp:
        raise SpecError(f"tp {r.tp} x pp {r.pp} x cp {r.cp} = {mp} does not divide --gpus {gpus}; data parallelism "
                        "is --gpus / (tp x pp x cp): change --gpus or a degree")
    dp = gpus // mp
    gbs = r.global_batch or dp * r.mbs * (r.num_microbatches or 1)
    if gbs % (dp * r.mbs):
        raise SpecError(f"global batch {gbs} is not divisible by dp {dp} x micro-batch {r.mbs}; change the batch "
                        "sizes or the degrees")
    layers, vpp = _layers(r, model)
    recompute_layers = r.recompute_layers
    if r.recompute_every:  # torchtitan layer AC: floor(n / N) layers of each chunk
        chunk = min(n // vpp for n in layers if n) if any(layers) else 0
        recompute_layers = max(1, chunk // r.recompute_every)
    plan = Plan(tp=r.tp, pp=r.pp, dp=dp, cp=r.cp, mbs=r.mbs, num_microbatches=gbs // (dp * r.mbs),
                schedule=r.schedule, vpp=vpp, recompute=r.recompute,  # type: ignore[arg-type]
                recompute_layers=recompute_layers, zero=r.zero, sequence_parallel=r.sequence_parallel,
                vocab="parallel" if r.vocab_parallel else ("ends" if is_even_split(layers) else "balanced"),
                layers_per_stage=layers, bucket_size=r.bucket_size or default_bucket(trainer, dp),
                tp_overlap=r.tp_overlap, ep_overlap=r.ep_overlap)
    if getattr(model, "num_experts", 0):  # expert parallelism; Megatron's etp default is tp
        plan = replace(plan, ep=r.ep, etp=r.etp or r.tp)  # type: ignore[call-arg]
    return normalized(plan)
