"""The runs file of `autotune calibrate`: measured step times of real runs, read and checked into plans.

The runs file is a CSV, one measured run per line. Lines starting with '#' and blank lines are skipped; the
first other line is the header. Columns (all required unless marked optional; no others are accepted):

  model              catalog model name or a model/config.json path
  gpu                catalog GPU or hardware file; every row must name the same one
  gpus               GPUs the run used (= tp*pp*dp*cp)
  global_batch       sequences per optimizer step
  seq_len            tokens per sequence
  dtype              bf16, fp16 or fp8
  tp, pp, dp, cp     parallel degrees
  mbs                micro-batch size, sequences
  num_microbatches   micro-batches per step on each data-parallel rank
  schedule           1f1b, interleaved, zb-h1 or v-half
  vpp                virtual stages per pipeline rank (1 for 1f1b)
  recompute          none, selective or full
  zero               ZeRO stage 0-3
  sequence_parallel  true or false
  flash_attention    true or false
  step_time_s        measured seconds per optimizer step (> 0)
  layers_per_stage   optional: transformer layers per pipeline rank, ';'-separated ("7;9;9;7"); empty = even
  fused_kernels      optional: true (default) or false
  trainer            optional: megatron (default), torchtitan, deepspeed or colossalai (whose kernels ran)
  grad_reduce        optional: fp32, bf16, or fp16 (with dtype fp16); default what the trainer's config runs (fp32;
                     DeepSpeed's, the model dtype)
  attention_backend  optional: cudnn or flash, the attention kernel (not flash with megatron); default the trainer's
                     own (cuDNN; FlashAttention-2 for Colossal-AI)
  cross_entropy      optional: unfused, native or te, Megatron's loss kernel (--cross-entropy-loss-fusion and
                     --cross-entropy-fusion-impl); default native, what autotune's Megatron configs run
  bucket_size        optional: the gradient bucket in parameters; default the trainer's own (Megatron max(40M,
                     1M x dp), DeepSpeed 500M, else 40M)
  tp_overlap         optional: false (default) or true (TP communication overlapped with the GEMMs)
  async_tp_backward  optional: true (default) or false (Megatron before late 2021: synchronous TP backward)
  overlap_grad_reduce optional: true (default) or false (Megatron-LM's LocalDDP of 2021: gradients reduced after
                     the backward)
  overlap_param_gather optional: true (default) or false (Megatron's distributed optimizer gathering the updated
                     weights in the optimizer step: no --overlap-param-gather)
  overlap_p2p        optional: true (default) or false (Megatron's interleaved schedule waiting on every pipeline
                     send: --no-overlap-p2p-communication, or Megatron-LM before 2023)

Each row becomes a Plan checked by `specs.plan.check_plan`; every error names file:line and the field.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.catalog import PROFILES_DIR, load_hardware, load_model, read_json
from autotune.costmodel.memory import active_params
from autotune.errors import SpecError
from autotune.fileio import decode_text, read_bounded
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import OVERLAP_KEYS, JobSpec
from autotune.specs.limits import MAX_RUNS_FILE_BYTES, int_maximum
from autotune.specs.model import ModelSpec
from autotune.specs.plan import RECOMPUTES, SCHEDULES, Plan, check_plan, default_bucket, even_split, is_even_split
from autotune.specs.trainer_jobs import runs_grad_reduce
from autotune.units import TERA

REQUIRED = ("model", "gpu", "gpus", "global_batch", "seq_len", "dtype", "tp", "pp", "dp", "cp", "mbs",
            "num_microbatches", "schedule", "vpp", "recompute", "zero", "sequence_parallel", "flash_attention",
            "step_time_s")
OPTIONAL = ("layers_per_stage", "fused_kernels", "trainer", "grad_reduce", "tp_overlap", "async_tp_backward",
            "overlap_grad_reduce", "overlap_param_gather", "overlap_p2p", "attention_backend", "cross_entropy",
            "bucket_size")
_INTS = ("gpus", "global_batch", "seq_len", "tp", "pp", "dp", "cp", "mbs", "num_microbatches", "vpp")
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run: where it came from, what ran, and how long a step took."""

    line: int
    """Line number in the runs file (1-based)."""
    model_name: str
    model: ModelSpec
    job: JobSpec
    plan: Plan
    step_time_s: float
    """Measured seconds per optimizer step."""


@dataclass(frozen=True, slots=True)
class RunsFile:
    """The parsed runs file and the one hardware profile its rows share."""

    path: Path
    gpu: str
    """The gpu column as written (catalog name or file)."""
    hw: HardwareSpec
    hw_raw: dict[str, Any]
    """The hardware file's JSON, which the calibrated profile copies."""
    runs: tuple[Run, ...]


def read_runs(path: Path) -> RunsFile:
    """Parse and check a runs file; every error names file:line and the field."""
    raw = read_bounded(path, str(path), MAX_RUNS_FILE_BYTES, noun="the runs file",
                       fix="give a CSV of measured runs (see the docs)")
    lines = decode_text(raw, f"{path}: the runs file").removeprefix("\ufeff").splitlines()  # Excel's UTF-8 BOM
    numbered = [(i, line) for i, line in enumerate(lines, 1) if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise SpecError(f"{path}: no header line; the columns are {', '.join(REQUIRED)}")
    head_line, head = numbered[0]
    header = [c.strip() for c in next(csv.reader([head]))]
    missing = [c for c in REQUIRED if c not in header]
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if missing:
        raise SpecError(f"{path}:{head_line}: missing column(s) {', '.join(missing)}")
    if twice := sorted({c for c in header if header.count(c) > 1}):
        raise SpecError(f"{path}:{head_line}: column(s) {', '.join(twice)} given twice; keep one of each")
    if unknown:
        raise SpecError(f"{path}:{head_line}: unknown column(s) {', '.join(unknown)}; allowed: "
                        f"{', '.join(REQUIRED + OPTIONAL)}")
    rows = []
    for no, line in numbered[1:]:
        cells = [c.strip() for c in next(csv.reader([line]))]
        if len(cells) != len(header):
            raise SpecError(f"{path}:{no}: {len(cells)} fields, but the header has {len(header)}")
        rows.append((no, dict(zip(header, cells))))
    if not rows:
        raise SpecError(f"{path}: no runs; calibrating needs at least 2 distinct configurations")
    gpus = sorted({r["gpu"] for _, r in rows})
    if len(gpus) > 1:
        other = next(no for no, r in rows if r["gpu"] != rows[0][1]["gpu"])
        raise SpecError(f"{path}:{other}: gpu: {rows[0][1]['gpu']!r} above, {dict(rows)[other]['gpu']!r} here; rows use "
                        f"{len(gpus)} GPU types ({', '.join(gpus)}); calibrate one at a time")
    no = rows[0][0]
    try:
        hw = load_hardware(gpus[0])
    except SpecError as exc:
        raise SpecError(f"{path}:{no}: gpu: {exc}") from None
    runs = tuple(_run(path, no, row, hw) for no, row in rows)  # each row's own errors first, then the count
    configurations = {tuple(sorted((k, v) for k, v in row.items() if k != "step_time_s")) for _, row in rows}
    if len(configurations) < 2:
        raise SpecError(f"{path}: {len(rows)} run(s) of {len(configurations)} configuration; calibrating needs at "
                        "least 2 distinct configurations (and more than the fitted efficiencies to determine them)")
    return RunsFile(path=path, gpu=gpus[0], hw=hw, hw_raw=read_json(_hardware_path(gpus[0]), "hardware file"),
                    runs=runs)


def _hardware_path(name_or_path: str) -> Path:
    catalog = PROFILES_DIR / "hardware" / f"{name_or_path}.json"
    return catalog if catalog.is_file() else Path(name_or_path)


def _run(path: Path, no: int, row: dict[str, str], hw: HardwareSpec) -> Run:
    where = f"{path}:{no}"
    ints = {k: _int(where, k, row[k], minimum=0 if k == "zero" else 1) for k in (*_INTS, "zero")}
    step = _positive_float(where, "step_time_s", row["step_time_s"])
    for key, options in (("schedule", SCHEDULES), ("recompute", RECOMPUTES)):
        if row[key] not in options:
            raise SpecError(f"{where}: {key}: must be one of {', '.join(options)}, got {row[key]!r}")
    try:
        model = load_model(row["model"])
    except SpecError as exc:
        raise SpecError(f"{where}: model: {exc}") from None
    switches = {"flash_attention": _bool(where, "flash_attention", row["flash_attention"]),
                "fused_kernels": _bool(where, "fused_kernels", row.get("fused_kernels") or "true"),
                **{key: _bool(where, key, row.get(key) or "true") for key in ("async_tp_backward", *OVERLAP_KEYS)}}
    try:  # JobSpec's own errors get the line; _bool's name it already
        job = JobSpec(global_batch=ints["global_batch"], seq_len=ints["seq_len"], dtype=row["dtype"],
                      trainer=row.get("trainer") or "megatron",
                      attention_backend=row.get("attention_backend") or None,
                      grad_reduce=row.get("grad_reduce") or runs_grad_reduce(row.get("trainer"), row["dtype"]),
                      cross_entropy=row.get("cross_entropy") or None, **switches)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    layers = _layers(where, row.get("layers_per_stage", ""), model, ints["pp"])
    plan = Plan(tp=ints["tp"], pp=ints["pp"], dp=ints["dp"], cp=ints["cp"], mbs=ints["mbs"],
                num_microbatches=ints["num_microbatches"], schedule=row["schedule"], vpp=ints["vpp"],
                recompute=row["recompute"], zero=ints["zero"],
                sequence_parallel=_bool(where, "sequence_parallel", row["sequence_parallel"]),
                vocab="ends" if is_even_split(layers) else "balanced", layers_per_stage=layers,
                tp_overlap=_bool(where, "tp_overlap", row.get("tp_overlap") or "false"),
                bucket_size=_int(where, "bucket_size", row["bucket_size"], minimum=1) if row.get("bucket_size")
                else default_bucket(job.trainer, ints["dp"]))
    try:
        check_plan(plan, model, job, ints["gpus"], hw.gpus_per_node)
    except SpecError as exc:  # check_plan names the command line's flag where a runs file has its column
        raise SpecError(f"{where}: plan: {str(exc).replace('--gpus is', 'the gpus column is')}") from None
    _check_physical(where, step, model, job, plan, hw)
    return Run(line=no, model_name=row["model"], model=model, job=job, plan=plan, step_time_s=step)


#: The least share of the peak a run's linear layers may reach: a step slower than that is read as a typo (a
#: millisecond figure in seconds reads 1000x too slow, so a run at 40% MFU reads 0.04%), unless it could not be
#: one: read as milliseconds it would beat the peak (a small model's latency-bound step, reviewer)
SLOWEST_SHARE = 0.005


def _check_physical(where: str, step: float, model: ModelSpec, job: JobSpec, plan: Plan, hw: HardwareSpec) -> None:
    """A step faster than the GPUs can compute is a typo (milliseconds, or a per-micro-batch time), and fitting
    efficiencies to it pins every one at its bound: refused, as is one below SLOWEST_SHARE of the peak (a
    millisecond figure, 1e300). The floor is the linear layers' work alone, 6 FLOPs
    per parameter a token passes through (forward 2, backward 4), which no schedule or kernel avoids."""
    work = 6.0 * active_params(model, input_embedding=False) * job.global_batch * job.seq_len
    rate = work / (step * plan.num_gpus)
    peak = hw.peak_flops(job.dtype)
    if rate > peak:
        raise SpecError(f"{where}: step_time_s {step:g}: faster than {plan.num_gpus} x {hw.name} can compute: the "
                        f"linear layers alone would run at {_tflops(rate)} TFLOP/s per GPU, above its "
                        f"{job.dtype} peak of {peak / TERA:,.0f}; give seconds per optimizer step")
    if rate < SLOWEST_SHARE * peak and rate * 1000 <= peak:  # (a slow small run read in ms would beat the peak)
        raise SpecError(f"{where}: step_time_s {step:g}: the linear layers alone would run at "
                        f"{100 * rate / peak:.3g}% of the {job.dtype} peak, less than any GPU training run "
                        f"reaches ({100 * SLOWEST_SHARE:g}%): milliseconds given as seconds? give seconds per "
                        "optimizer step")


def _tflops(rate: float) -> str:
    return f"{rate / TERA:,.0f}" if rate < 1e6 * TERA else f"{rate / TERA:.2e}"


def _int(where: str, key: str, raw: str, *, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise SpecError(f"{where}: {key}: must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise SpecError(f"{where}: {key}: must be >= {minimum}, got {value}")
    if value > int_maximum(key):
        raise SpecError(f"{where}: {key}: {value} exceeds the maximum of {int_maximum(key):,}")
    return value


def _positive_float(where: str, key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SpecError(f"{where}: {key}: must be a number of seconds, got {raw!r}") from None
    if not 0 < value < float("inf"):
        raise SpecError(f"{where}: {key}: must be > 0 and finite, got {raw!r}")
    return value


def _bool(where: str, key: str, raw: str) -> bool:
    if raw.lower() not in _BOOLS:
        raise SpecError(f"{where}: {key}: must be true or false, got {raw!r}")
    return _BOOLS[raw.lower()]


def _layers(where: str, raw: str, model: ModelSpec, pp: int) -> tuple[int, ...]:
    if not raw:
        return even_split(model.num_layers, pp)
    try:
        return tuple(int(n) for n in raw.split(";"))
    except ValueError:
        raise SpecError(f"{where}: layers_per_stage: must be ';'-separated whole numbers, got {raw!r}") from None
