"""Fitting a hardware profile's efficiencies to measured step times of real runs (`autotune calibrate`).

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
  schedule           1f1b or interleaved
  vpp                virtual stages per pipeline rank (1 for 1f1b)
  recompute          none, selective or full
  zero               ZeRO stage 0-3
  sequence_parallel  true or false
  flash_attention    true or false
  step_time_s        measured seconds per optimizer step (> 0)
  layers_per_stage   optional: transformer layers per pipeline rank, ';'-separated ("7;9;9;7"); empty = even
  fused_kernels      optional: true (default) or false
  trainer            optional: megatron (default), torchtitan, deepspeed or colossalai (whose kernels ran)
  grad_reduce        optional: fp32 (default) or bf16
  tp_overlap         optional: false (default) or true (TP communication overlapped with the GEMMs)
  async_tp_backward  optional: true (default) or false (Megatron before late 2021: synchronous TP backward)

Each row becomes a Plan checked by `specs.plan.check_plan`. The fit: the predicted step time of every row is
`CostModel(model, hw', job).estimate(plan).step_time_s` where hw' is the hardware with the efficiencies being
fitted replaced; the efficiencies minimize the sum of squared relative errors, bounded to [0.01, 1]. Step
time is close to linear in 1/efficiency (each term is work / (peak * efficiency)), so the unknowns are
u = 1/efficiency and the method is Levenberg-Marquardt with forward-difference Jacobians: numpy only,
deterministic. An efficiency is fitted only when the runs can inform it: when a 1% change of it moves some
row's predicted step time by at least 0.01% (FIT_THRESHOLD); the others keep the hardware file's value.
Leave-one-out: the fit is redone without each row and that row is predicted, so over-fitting shows.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autotune.catalog import PROFILES_DIR, load_hardware, load_model, read_json
from autotune.costmodel.estimate import CostModel
from autotune.errors import SpecError
from autotune.fileio import decode_text, read_bounded, write_file
from autotune.specs.hardware import Efficiency, HardwareSpec, hardware_from_dict
from autotune.specs.job import JobSpec
from autotune.specs.limits import MAX_RUNS_FILE_BYTES, int_maximum
from autotune.specs.model import ModelSpec
from autotune.specs.plan import (
    RECOMPUTES,
    SCHEDULES,
    Plan,
    check_plan,
    even_split,
    is_even_split,
)

REQUIRED = ("model", "gpu", "gpus", "global_batch", "seq_len", "dtype", "tp", "pp", "dp", "cp", "mbs",
            "num_microbatches", "schedule", "vpp", "recompute", "zero", "sequence_parallel", "flash_attention",
            "step_time_s")
OPTIONAL = ("layers_per_stage", "fused_kernels", "trainer", "grad_reduce", "tp_overlap", "async_tp_backward")
EFFICIENCY_KEYS = ("gemm", "attention", "memory", "intra_node_comm", "inter_node_comm")
#: |d log(step time) / d log(efficiency)| a parameter must reach on some row to be fitted
FIT_THRESHOLD = 1e-2
LOWER = 0.01
#: The physical range of each fitted efficiency. Above: no kernel class beats its measured ceiling (a bf16 GEMM
#: at 0.78-0.81 of peak on H100, device copies at 0.90 of HBM, NCCL bus bandwidth at ~0.9 of the link) by
#: more than a margin. Below: a fit that wants less is absorbing a term the cost model misses, not measuring a
#: kernel. A fit that ends on a bound is reported as such.
PHYSICAL_RANGE = {"gemm": (0.3, 0.95), "attention": (0.15, 0.9), "memory": (0.3, 0.95),
                  "intra_node_comm": (0.3, 0.95), "inter_node_comm": (0.3, 0.95)}
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


@dataclass(frozen=True, slots=True)
class RowFit:
    """One run's relative errors, percent ((predicted - measured) / measured)."""

    line: int
    model: str
    gpus: int
    measured_s: float
    before_s: float
    after_s: float
    loo_s: float
    """Predicted by the efficiencies fitted without this row."""

    def errors(self) -> tuple[float, float, float]:
        return tuple(100 * (p - self.measured_s) / self.measured_s for p in (self.before_s, self.after_s, self.loo_s))


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fit and its errors before, after (in-sample) and leave-one-out."""

    runs_file: RunsFile
    fitted: tuple[str, ...]
    """Efficiency keys the fit moved; the rest keep the hardware file's values."""
    before: Efficiency
    after: Efficiency
    rows: tuple[RowFit, ...]
    mape_before_pct: float
    mape_after_pct: float
    mape_loo_pct: float

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for r in self.rows:
            eb, ea, el = r.errors()
            rows.append({"line": r.line, "model": r.model, "gpus": r.gpus, "measured_s": r.measured_s,
                         "before_s": r.before_s, "after_s": r.after_s, "loo_s": r.loo_s, "before_error_pct": eb,
                         "after_error_pct": ea, "loo_error_pct": el})
        return {"runs": str(self.runs_file.path), "gpu": self.runs_file.gpu, "n_runs": len(self.rows),
                "fitted": list(self.fitted), "efficiency_before": _eff_dict(self.before),
                "efficiency_after": _eff_dict(self.after), "mape_before_pct": self.mape_before_pct,
                "mape_after_pct": self.mape_after_pct, "mape_loo_pct": self.mape_loo_pct, "rows": rows}


# ----------------------------------------------------------------------------------------------- reading
def read_runs(path: Path) -> RunsFile:
    """Parse and check a runs file; every error names file:line and the field."""
    raw = read_bounded(path, str(path), MAX_RUNS_FILE_BYTES, noun="the runs file",
                       fix="give a CSV of measured runs (see the docs)")
    lines = decode_text(raw, f"{path}: the runs file").splitlines()
    numbered = [(i, line) for i, line in enumerate(lines, 1) if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise SpecError(f"{path}: no header line; the columns are {', '.join(REQUIRED)}")
    head_line, head = numbered[0]
    header = [c.strip() for c in next(csv.reader([head]))]
    missing = [c for c in REQUIRED if c not in header]
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if missing:
        raise SpecError(f"{path}:{head_line}: missing column(s) {', '.join(missing)}")
    if unknown:
        raise SpecError(f"{path}:{head_line}: unknown column(s) {', '.join(unknown)}; allowed: "
                        f"{', '.join(REQUIRED + OPTIONAL)}")
    rows = []
    for no, line in numbered[1:]:
        cells = [c.strip() for c in next(csv.reader([line]))]
        if len(cells) != len(header):
            raise SpecError(f"{path}:{no}: {len(cells)} fields, but the header has {len(header)}")
        rows.append((no, dict(zip(header, cells))))
    if len(rows) < 2:
        raise SpecError(f"{path}: {len(rows)} run(s); calibrating needs at least 2 (more than the fitted values)")
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
    runs = tuple(_run(path, no, row, hw) for no, row in rows)
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
    try:
        job = JobSpec(global_batch=ints["global_batch"], seq_len=ints["seq_len"], dtype=row["dtype"],
                      flash_attention=_bool(where, "flash_attention", row["flash_attention"]),
                      fused_kernels=_bool(where, "fused_kernels", row.get("fused_kernels") or "true"),
                      trainer=row.get("trainer") or "megatron", grad_reduce=row.get("grad_reduce") or "fp32",
                      async_tp_backward=_bool(where, "async_tp_backward", row.get("async_tp_backward") or "true"))
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    layers = _layers(where, row.get("layers_per_stage", ""), model, ints["pp"])
    plan = Plan(tp=ints["tp"], pp=ints["pp"], dp=ints["dp"], cp=ints["cp"], mbs=ints["mbs"],
                num_microbatches=ints["num_microbatches"], schedule=row["schedule"], vpp=ints["vpp"],
                recompute=row["recompute"], zero=ints["zero"],
                sequence_parallel=_bool(where, "sequence_parallel", row["sequence_parallel"]),
                vocab="ends" if is_even_split(layers) else "balanced", layers_per_stage=layers,
                tp_overlap=_bool(where, "tp_overlap", row.get("tp_overlap") or "false"))
    try:
        check_plan(plan, model, job, ints["gpus"], hw.gpus_per_node)
    except SpecError as exc:
        raise SpecError(f"{where}: plan: {exc}") from None
    return Run(line=no, model_name=row["model"], model=model, job=job, plan=plan, step_time_s=step)


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


# ------------------------------------------------------------------------------------------------- fitting
def predict(runs: tuple[Run, ...], hw: HardwareSpec) -> np.ndarray:
    """Predicted step time of every run on `hw`, seconds."""
    return np.array([CostModel(r.model, hw, r.job).estimate(r.plan).step_time_s for r in runs])


def _with(hw: HardwareSpec, keys: tuple[str, ...], u: np.ndarray) -> HardwareSpec:
    """`hw` with the efficiencies `keys` set to 1/u."""
    return replace(hw, efficiency=replace(hw.efficiency, **{k: float(1 / x) for k, x in zip(keys, u)}))


def _residuals(runs: tuple[Run, ...], hw: HardwareSpec, keys: tuple[str, ...], u: np.ndarray) -> np.ndarray:
    measured = np.array([r.step_time_s for r in runs])
    return (predict(runs, _with(hw, keys, u)) - measured) / measured


def _jacobian(runs, hw, keys, u, r0) -> np.ndarray:
    """Forward differences, one relative step per unknown."""
    cols = []
    for j in range(len(u)):
        step = 1e-4 * u[j]
        probe = u.copy()
        probe[j] += step
        cols.append((_residuals(runs, hw, keys, probe) - r0) / step)
    return np.column_stack(cols)


def informed_keys(runs: tuple[Run, ...], hw: HardwareSpec) -> tuple[str, ...]:
    """The efficiencies a 1% change of which moves some run's step time by at least FIT_THRESHOLD percent."""
    base = predict(runs, hw)
    keys = []
    for key in EFFICIENCY_KEYS:
        value = getattr(hw.efficiency, key)
        moved = predict(runs, replace(hw, efficiency=replace(hw.efficiency, **{key: value * 0.99})))
        if np.max(np.abs(moved / base - 1)) / 0.01 >= FIT_THRESHOLD:
            keys.append(key)
    return tuple(keys)


def fit(runs: tuple[Run, ...], hw: HardwareSpec, keys: tuple[str, ...], *, max_iter: int = 60) -> HardwareSpec:
    """Levenberg-Marquardt on u = 1/efficiency within PHYSICAL_RANGE, from the file's values; deterministic."""
    lo = np.array([1 / PHYSICAL_RANGE[k][1] for k in keys])
    hi = np.array([1 / PHYSICAL_RANGE[k][0] for k in keys])
    u = np.clip(np.array([1 / getattr(hw.efficiency, k) for k in keys]), lo, hi)
    r = _residuals(runs, hw, keys, u)
    cost, lam = float(r @ r), 1e-3
    for _ in range(max_iter):
        jac = _jacobian(runs, hw, keys, u, r)
        jtj, grad = jac.T @ jac, jac.T @ r
        improved = False
        while lam < 1e12:
            damp = np.diag(lam * (np.diag(jtj) + 1e-12))
            trial = np.clip(u - np.linalg.solve(jtj + damp, grad), lo, hi)
            rt = _residuals(runs, hw, keys, trial)
            if float(rt @ rt) < cost:
                improved = True
                break
            lam *= 10
        if not improved:
            break
        step = np.max(np.abs(trial - u) / u)
        gain = cost - float(rt @ rt)
        u, r, cost, lam = trial, rt, float(rt @ rt), max(lam / 10, 1e-9)
        if step < 1e-7 or gain < 1e-14 * max(cost, 1e-30):
            break
    return _with(hw, keys, u)


def at_bound(eff: Efficiency, keys: tuple[str, ...]) -> tuple[str, ...]:
    """The fitted keys that ended on an end of their physical range."""
    return tuple(k for k in keys if any(abs(getattr(eff, k) - b) <= 1e-6 * b for b in PHYSICAL_RANGE[k]))


def _mape(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(100 * np.mean(np.abs(pred - measured) / measured))


def calibrate(path: Path) -> Calibration:
    """Read the runs, fit the informed efficiencies, and measure before / after / leave-one-out errors."""
    rf = read_runs(path)
    runs, hw = rf.runs, rf.hw
    keys = informed_keys(runs, hw)
    if not keys:
        raise SpecError(f"{path}: no efficiency moves these runs' predicted step times; nothing to fit")
    fitted = fit(runs, hw, keys)
    before, after = predict(runs, hw), predict(runs, fitted)
    loo = np.array([predict((runs[i],), fit(runs[:i] + runs[i + 1:], hw, keys))[0] for i in range(len(runs))])
    measured = np.array([r.step_time_s for r in runs])
    rows = tuple(RowFit(line=r.line, model=r.model_name, gpus=r.plan.num_gpus, measured_s=r.step_time_s,
                        before_s=float(b), after_s=float(a), loo_s=float(lo))
                 for r, b, a, lo in zip(runs, before, after, loo))
    return Calibration(runs_file=rf, fitted=keys, before=hw.efficiency, after=fitted.efficiency, rows=rows,
                       mape_before_pct=_mape(before, measured), mape_after_pct=_mape(after, measured),
                       mape_loo_pct=_mape(loo, measured))


# ------------------------------------------------------------------------------------------------- output
def _eff_dict(eff: Efficiency) -> dict[str, float]:
    return {k: getattr(eff, k) for k in EFFICIENCY_KEYS}


def calibrated_profile(cal: Calibration) -> dict[str, Any]:
    """The hardware file with the fitted efficiencies (4 decimals) and sources.efficiency naming the fit."""
    data = json.loads(json.dumps(cal.runs_file.hw_raw))
    data["name"] = f"{data['name']}-calibrated"
    data["efficiency"] = {**data["efficiency"], **{k: round(v, 4) for k, v in _eff_dict(cal.after).items()}}
    n, loo = len(cal.rows), cal.mape_loo_pct
    held = [k for k in EFFICIENCY_KEYS if k not in cal.fitted]
    data["sources"]["efficiency"] = (
        f"calibrated by autotune calibrate on {cal.runs_file.path.name} ({n} runs, LOO MAPE {loo:.1f}%): fitted "
        f"{', '.join(cal.fitted)} by least squares on relative step-time error (MAPE {cal.mape_before_pct:.1f}% "
        f"before, {cal.mape_after_pct:.1f}% after)" + (f"; {', '.join(held)} kept from "
                                                      f"{cal.runs_file.gpu}" if held else "")
        + (f"; {', '.join(at_bound(cal.after, cal.fitted))} ended on its physical bound (the runs push it further: "
           "a term the cost model misses is absorbed there)" if at_bound(cal.after, cal.fitted) else ""))
    hardware_from_dict(data, "calibrated profile")  # an internal check: what we write must load
    return data


def write_calibrated(cal: Calibration, out: Path) -> Path:
    """Write the calibrated hardware file atomically."""
    return write_file(out, json.dumps(calibrated_profile(cal), indent=2) + "\n")


def format_calibration(cal: Calibration) -> str:
    """A plain-text table of the rows and the summary."""
    head = f"{'line':>4} {'model':<14} {'gpus':>5} {'measured s':>10} {'before':>8} {'after':>8} {'loo':>8}"
    lines = [f"calibrating {cal.runs_file.gpu} on {cal.runs_file.path} ({len(cal.rows)} runs)", head, "-" * len(head)]
    for r in cal.rows:
        eb, ea, el = r.errors()
        lines.append(f"{r.line:>4} {r.model:<14} {r.gpus:>5} {r.measured_s:>10.3f} {eb:>+7.1f}% {ea:>+7.1f}% "
                     f"{el:>+7.1f}%")
    for k in EFFICIENCY_KEYS:
        mark = "kept" if k not in cal.fitted else (
            f"fitted, AT ITS PHYSICAL BOUND {PHYSICAL_RANGE[k]}" if k in at_bound(cal.after, cal.fitted) else "fitted")
        lines.append(f"{k:<16} {getattr(cal.before, k):.4f} -> {getattr(cal.after, k):.4f} ({mark})")
    lines.append(f"MAPE before {cal.mape_before_pct:.1f}%, after {cal.mape_after_pct:.1f}% (in-sample), "
                 f"leave-one-out {cal.mape_loo_pct:.1f}%")
    return "\n".join(lines)
