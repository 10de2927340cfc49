"""Command-line input -> specs: the one plan `estimate` evaluates from its pins, plan files and documents (or
stdin), and the measured cost profile a command uses (--profile, else the shipped one, else the roofline)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.catalog import PROFILES_DIR, parse_json, read_json
from autotune.cli.options import Pins, one, parse_choice_list, parse_int_list, show_warnings
from autotune.costmodel.accumulation import one_flush
from autotune.costmodel.measured import OpCoverage, check_profile_model, check_profile_ops, profile_warnings
from autotune.emit.document import document_trainer
from autotune.errors import InvalidPlanError, SpecError
from autotune.fileio import slug
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import (ATTENTION_BACKENDS, CROSS_ENTROPIES, DTYPES, GRAD_REDUCES, MOE_DISPATCHERS,
                               OPTIMIZER_STATES, OVERLAP_KEYS, TRAINERS, JobSpec)
from autotune.specs.limits import MAX_JSON_BYTES
from autotune.specs.model import ModelSpec
from autotune.specs.plan import (RECOMPUTES, SCHEDULES, VOCABS, Plan, check_plan, default_bucket, even_split,
                                 is_even_split, plan_from_dict)
from autotune.specs.profile import Profile, load_profile
from autotune.specs.tpgrid import MODES


def _one_int(raw: str | None, flag: str, default: int, minimum: int = 1) -> int:
    return default if raw is None else one(parse_int_list(raw, flag, minimum=minimum), flag)


def _one_choice(raw: str | None, flag: str, options: Sequence[str], default: str) -> str:
    return default if raw is None else one(parse_choice_list(raw, flag, options), flag)


def _quotient(total: int, flag: str, parts: dict[str, int], fix: str) -> int:
    """total / prod(parts), or an error giving the numbers and the fix."""
    prod = 1
    for value in parts.values():
        prod *= value
    if total % prod:
        names, values = " x ".join(parts), " x ".join(map(str, parts.values()))
        raise SpecError(f"{flag} {total} is not divisible by {names} = {values} = {prod}; {fix}")
    return total // prod


def single_plan(pins: Pins, model: ModelSpec, job: JobSpec, gpus: int) -> Plan:
    """The one plan `estimate` evaluates: each pin one value; dp, micro-batches, schedule derived."""
    if pins.tp is None or pins.pp is None:
        raise SpecError("estimate needs --tp and --pp (or --plan FILE); the other dimensions have defaults")
    tp, pp = _one_int(pins.tp, "--tp", 1), _one_int(pins.pp, "--pp", 1)
    tp_mode = _one_choice(pins.tp_mode, "--tp-mode", MODES, "1d")
    v_half = pins.schedule is not None and pins.schedule.strip() == "v-half"  # its V is two chunks per rank
    cp, mbs = _one_int(pins.cp, "--cp", 1), _one_int(pins.mbs, "--mbs", 1)
    vpp = _one_int(pins.vpp, "--vpp", 2 if v_half else 1)
    dp = (_one_int(pins.dp, "--dp", 1) if pins.dp is not None
          else _quotient(gpus, "--gpus", {"tp": tp, "pp": pp, "cp": cp}, "change --gpus or a degree"))
    micro = (pins.num_microbatches if pins.num_microbatches is not None
             else _quotient(job.global_batch, "--global-batch", {"dp": dp, "mbs": mbs},
                            f"use a multiple of {dp * mbs}, or change --mbs or --dp"))
    layers = (parse_int_list(pins.layers_per_stage, "--layers-per-stage", minimum=0)
              if pins.layers_per_stage is not None else even_split(model.num_layers, pp))
    return Plan(
        tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, num_microbatches=micro, vpp=vpp,
        schedule=_one_choice(pins.schedule, "--schedule", SCHEDULES, "interleaved" if vpp > 1 else "1f1b"),
        recompute=_one_choice(pins.recompute, "--recompute", RECOMPUTES, "none"),
        recompute_layers=pins.recompute_layers,
        # bf16 optimizer states live in a distributed optimizer: ZeRO-1 unless pinned
        zero=_one_int(pins.zero, "--zero", 0 if job.optimizer_states == "fp32" else 1, minimum=0),
        sequence_parallel=(tp > 1 and tp_mode == "1d") if pins.sequence_parallel is None else pins.sequence_parallel,
        vocab=_one_choice(pins.vocab, "--vocab", VOCABS, "ends" if is_even_split(layers) else "balanced"),
        layers_per_stage=layers,
        bucket_size=default_bucket(job.trainer, dp) if pins.bucket_size is None else pins.bucket_size, tp_mode=tp_mode,
        tp_overlap=bool(pins.tp_overlap), ep=_one_int(pins.ep, "--ep", 1), etp=_one_int(pins.etp, "--etp", 1),
        ep_overlap=bool(pins.ep_overlap))


def read_plan(path: str, pins: Pins) -> tuple[Plan, dict[str, Any], Any]:
    """A plan from a JSON file (or stdin for '-'), the job block a whole `plan --json` document records ({} for a
    bare plan object) and the document; the command line may not pin anything beside it."""
    given = pins.given()
    if given:
        raise SpecError(f"--plan {path} gives the whole plan; drop {', '.join(given)} or drop --plan")
    doc = read_document(path, "--plan")
    where = plan_source(path, "--plan")
    job = doc.get("job") if isinstance(doc, dict) and "plan" in doc else None
    if job is not None and not isinstance(job, dict):
        raise SpecError(f"{where}: 'job' must be an object, as `autotune plan --json` writes it")
    document_trainer(doc, where)  # a document names the trainer it was searched for as emit reads it, or none
    kernels = (job or {}).get("kernels")
    return plan_from_dict(doc, where, kernels if kernels in TRAINERS else "megatron"), job or {}, doc


#: A plan document's job settings estimate re-costs it with: (key of its "job" block, the value's JSON type,
#: estimate's parameter, the flag, whether the flag is the setting's negation)
JOB_SETTINGS = (("dtype", str, "dtype", "--dtype", False),
                ("flash_attention", bool, "no_flash_attention", "--no-flash-attention", True),
                ("fused_kernels", bool, "unfused", "--unfused", True),
                ("grad_reduce", str, "grad_reduce", "--grad-reduce", False),
                ("optimizer_states", str, "optimizer_states", "--optimizer-states", False),
                ("kernels", str, "kernels", "--kernels", False),
                ("attention_backend", str, "attention_backend", "--attention-backend", False),
                ("moe_dispatcher", str, "moe_dispatcher", "--moe-dispatcher", False),
                ("moe_imbalance", float, "moe_imbalance", "--moe-imbalance", False),
                ("moe_capacity_factor", float, "moe_capacity_factor", "--moe-capacity-factor", False),
                ("moe_pad_to_capacity", bool, "moe_pad_to_capacity", "--moe-pad-to-capacity", False))
#: The values a document's job block may hold for the settings with a fixed set of them
JOB_CHOICES = {"dtype": DTYPES, "grad_reduce": GRAD_REDUCES, "optimizer_states": OPTIMIZER_STATES,
               "kernels": TRAINERS, "moe_dispatcher": MOE_DISPATCHERS, "attention_backend": ATTENTION_BACKENDS}
#: What the document's job block must share with the command line: (key, the value's flag)
JOB_FIXED = (("model", "--model"), ("gpu", "--gpu"), ("gpus", "--gpus"), ("gpus_per_node", "--gpus-per-node"),
             ("global_batch", "--global-batch"), ("seq_len", "--seq-len"))


def recorded_overlaps(recorded: dict[str, Any], where: str) -> dict[str, Any]:
    """The overlaps a document's job block records as off (`check --json` of a config that leaves one off) and
    the loss kernel it records, so estimate re-costs the plan as that config runs it."""
    out: dict[str, Any] = {}
    for key in OVERLAP_KEYS:
        if key in recorded:
            if not isinstance(recorded[key], bool):
                raise SpecError(f"{where}: job.{key} {recorded[key]!r} must be true or false, as `autotune check "
                                "--json` writes it")
            out[key] = recorded[key]
    if "cross_entropy" in recorded:
        if recorded["cross_entropy"] not in CROSS_ENTROPIES:
            raise SpecError(f"{where}: job.cross_entropy {recorded['cross_entropy']!r} must be one of "
                            f"{', '.join(CROSS_ENTROPIES)}, as `autotune check --json` writes it")
        out["cross_entropy"] = recorded["cross_entropy"]
    return out


def job_from_plan_document(given: dict[str, Any], recorded: dict[str, Any], where: str) -> dict[str, Any]:
    """estimate's model, cluster and batch (`given`, by key of JOB_FIXED; None where the command line leaves one
    out) with the plan document's job block filling the gaps: a value neither gives is an error naming its flag."""
    out = dict(given)
    for key, flag in JOB_FIXED:
        if out.get(key) is None and key in recorded:
            value = recorded[key]
            text_key = key in ("model", "gpu")
            if (not isinstance(value, str) or not value) if text_key else (
                    not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SpecError(f"{where}: job.{key} {value!r} is not what `autotune plan --json` writes; give {flag} "
                                "or fix the document")
            out[key] = value
    missing = [flag for key, flag in JOB_FIXED if out.get(key) is None and key != "gpus_per_node"]
    if missing:
        raise SpecError(f"estimate needs {', '.join(missing)}" + (f": {where} records no job block with them"
                        if where else " (or --plan FILE, a `plan --json` document that records them)"))
    return out


def refuse_other_job(recorded: dict[str, Any], fixed: dict[str, Any], where: str, fix: str) -> None:
    """A document's job block that names another model, cluster, batch or sequence length than `fixed` (by key of
    JOB_FIXED) is a one-line error ending in `fix`."""
    for key, flag in JOB_FIXED:
        if key in recorded and recorded[key] != fixed[key]:
            raise SpecError(f"{where} was planned with {key} {recorded[key]!r}, the command line gives {flag} "
                            f"{fixed[key]!r}; {fix}")


def settle_job_settings(recorded: dict[str, Any], where: str, values: dict[str, Any], given: set[str],
                        fixed: dict[str, Any]) -> dict[str, Any]:
    """estimate's job settings (`values`, by parameter) with what the plan document recorded filled in, so a
    saved plan is re-costed as it was planned (its kernels, dtype, gradient reduction, MoE routing): a setting the
    command line leaves at its default comes from the document, one it gives must agree with it, as must the
    model, cluster and batch (`fixed`, by key)."""
    out = dict(values)
    if "moe_dispatcher" in recorded:  # an MoE job block leaves out the capacity of dropless routing
        recorded = {"moe_capacity_factor": 0.0, "moe_pad_to_capacity": False, **recorded}
    refuse_other_job(recorded, fixed, where, "give the same, or plan again")
    for key, kind, param, flag, negated in JOB_SETTINGS:
        if key not in recorded:
            continue
        value = recorded[key]
        number = kind is float and isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number or type(value) is kind):
            raise SpecError(f"{where}: job.{key} {value!r} is not what `autotune plan --json` writes; fix it or "
                            "drop the job block")
        if key in JOB_CHOICES and value not in JOB_CHOICES[key]:
            raise SpecError(f"{where}: job.{key} {value!r} must be one of {', '.join(JOB_CHOICES[key])}; fix it or "
                            "drop the job block")
        value = (not value) if negated else value
        if key == "moe_capacity_factor" and value == 0:  # JobSpec's 0: dropless routing, no flag given
            value = None
        if param in given and values[param] != value:
            raise SpecError(f"{where} was planned with {key} {recorded[key]!r}; {flag} differs: drop {flag} to "
                            "re-cost the plan as planned, or plan again")
        out[param] = value
    return out


def plan_source(path: str, flag: str) -> str:
    """How errors name a plan file given to `flag` ('-': stdin)."""
    return path if path != "-" else f"{flag} -"


def read_document(path: str, flag: str) -> Any:
    """A JSON document from a file, or from stdin for '-'; I/O and syntax problems are one-line errors."""
    if path != "-":
        return read_json(Path(path), "plan file")
    try:
        raw = sys.stdin.buffer.read(MAX_JSON_BYTES + 1) if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    except OSError as exc:
        raise SpecError(f"{flag} -: cannot read stdin ({exc})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise SpecError(f"{flag} -: more than the maximum of {MAX_JSON_BYTES:,} bytes on stdin; give a plan document")
    return parse_json(raw, f"{flag} -: stdin")


def load_cost_profile(path: str | None, gpu: str, model: ModelSpec, hw: HardwareSpec, job: JobSpec,
                      force: bool = False) -> Profile | None:
    """--profile FILE, else the shipped profiles/measured/<gpu>-<model>.json, else None (roofline); a profile
    for another model is an error, one measured on another device or dtype a warning."""
    if path is None:
        shipped = PROFILES_DIR / "measured" / f"{slug(gpu)}-{slug(model.name)}.json"  # never a path from input
        if not shipped.is_file():
            return None
        path = str(shipped)
    profile = load_profile(path)
    check_profile_model(profile, model)
    check_profile_ops(profile, model)
    check_comm_profile(profile, hw, force)
    show_warnings(profile_warnings(profile, hw, job.dtype, job.runs_attention if job.flash_attention else None))
    return profile


def check_comm_profile(profile: Profile, hw: HardwareSpec, force: bool) -> None:
    """Measured collectives replace the GPU's links (costmodel/measured.apply_comm): ones timed on a CPU, over
    gloo or on another GPU would price the cluster's NVLink and network at that speed, so they are refused unless
    --force-profile says so."""
    if not profile.comm or force:
        return
    backends = sorted({tier.backend for tier in profile.comm.values()})
    same_gpu = profile.device.kind == "cuda" and hw.name.split("-")[0].lower() in profile.device.name.lower()
    if not same_gpu or backends != ["nccl"]:
        raise SpecError(f"--profile {profile.path}: its collectives ({', '.join(sorted(profile.comm))}) were timed on "
                        f"{profile.device.kind} {profile.device.name!r} over {', '.join(backends)}, not on {hw.name} "
                        f"over nccl, and would replace {hw.name}'s links; measure them on the cluster (`autotune "
                        "profile --comm --device cuda`), or add --force-profile to use them anyway")


def coverage_warnings(coverage: OpCoverage, plan: Plan, profile: Profile | None = None,
                      seq_len: int | None = None) -> list[str]:
    """A warning when a profile is in use but the plan's shapes are outside it (those ops cost by roofline),
    naming what differs: the sequence length the profile was measured at, else the plan's tp, mbs and cp."""
    if coverage.source == "roofline" or not coverage.fallback:
        return []
    ops = f"{coverage.total - coverage.measured} of {coverage.total} ops cost by the roofline instead"
    untimed = {label.split()[0] for label in profile.not_timed} if profile is not None else set()
    if untimed.issuperset(coverage.fallback):
        return [f"--profile {coverage.source} left {', '.join(coverage.fallback)} untimed (too large for the "
                f"memory of the device that measured it): {ops}"]
    cp = f" --cp {plan.cp}" if plan.cp > 1 else ""
    here = (plan.tp, plan.mbs, plan.cp)
    timed_here = {p.op for p in profile.ops if (p.tp, p.mbs, p.cp) == here} if profile is not None else set()
    if timed_here.issuperset(coverage.fallback) and (profile is None or profile.seq_len in (0, None, seq_len)):
        return [f"--profile {coverage.source} timed {', '.join(coverage.fallback)} at the plan's shapes (tp "
                f"{plan.tp}, mbs {plan.mbs}, cp {plan.cp}), but as another kernel (the job's kernels move other "
                f"bytes, e.g. a fused loss): {ops}"]
    if profile is not None and profile.seq_len and seq_len is not None and seq_len != profile.seq_len:
        return [f"--profile {coverage.source} was measured at --seq-len {profile.seq_len}, the job runs {seq_len}: "
                f"{ops}; measure them with `autotune profile --seq-len {seq_len} --tp {plan.tp} --mbs {plan.mbs}{cp}`"]
    return [f"the plan's shapes (tp {plan.tp}, mbs {plan.mbs}, cp {plan.cp}) are outside --profile {coverage.source}: "
            f"{ops}; measure them with `autotune profile --tp {plan.tp} --mbs {plan.mbs}{cp}`"]


def document_flushes(doc: object, plan: Plan, where: str) -> int:
    """The runs of the schedule a step that a `check --json` document records (check.pipeline_flushes: torchtitan's
    gradient accumulation with a pipeline), 1 for any other document; one that cannot be is an error naming it."""
    check = doc.get("check") if isinstance(doc, dict) else None
    if not isinstance(check, dict) or "pipeline_flushes" not in check:
        return 1
    flushes = check["pipeline_flushes"]
    if isinstance(flushes, bool) or not isinstance(flushes, int) or flushes < 1 or plan.num_microbatches % flushes:
        raise SpecError(f"{where}: check.pipeline_flushes {flushes!r} must be a whole number >= 1 dividing the plan's "
                        f"{plan.num_microbatches} micro-batches, as `autotune check --json` writes it")
    return flushes


def check_flush(plan: Plan, model: ModelSpec, job: JobSpec, gpus: int, gpus_per_node: int, flushes: int,
                where: str) -> None:
    """The rules one of a step's runs of the schedule must meet (e.g. an interleaved schedule over enough
    micro-batches): check's torchtitan configs, and estimate --plan / plan --compare of check's document."""
    if flushes == 1:
        return
    flush, flush_job = one_flush(plan, job, flushes)
    try:
        check_plan(flush, model, flush_job, gpus, gpus_per_node, allow_cross_node_tp=True)
    except InvalidPlanError as exc:
        raise InvalidPlanError(f"{where}: each of its {flushes} gradient-accumulation steps runs the schedule over "
                               f"{flush.num_microbatches} micro-batches (training.local_batch_size / "
                               f"pipeline_parallel_microbatch_size), which breaks a rule: {exc}") from None
