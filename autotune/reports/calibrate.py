"""Fitting a hardware profile's efficiencies to measured step times of real runs (`autotune calibrate`).

The runs file (its columns, and how each row becomes a checked Plan) is autotune/reports/runs.py. The fit: the
predicted step time of every row is `CostModel(model, hw', job).estimate(plan).step_time_s` where hw' is the
hardware with the efficiencies being fitted replaced; the efficiencies minimize the sum of squared relative errors,
bounded to [0.01, 1]. Step time is close to linear in 1/efficiency (each term is work / (peak * efficiency)), so the
unknowns are u = 1/efficiency and the method is Levenberg-Marquardt with forward-difference Jacobians: numpy only,
deterministic. An efficiency is fitted only when the runs can inform it: when a 1% change of it moves some row's
predicted step time by at least 0.01% (FIT_THRESHOLD); the others keep the hardware file's value. Leave-one-out: the
fit is redone without each row and that row is predicted, so over-fitting shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autotune.costmodel.estimate import CostModel
from autotune.errors import SpecError
from autotune.fileio import write_file
from autotune.reports.runs import Run, RunsFile, read_runs
from autotune.specs.hardware import Efficiency, HardwareSpec, hardware_from_dict
from autotune.units import gib

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
    unfit: tuple[str, ...] = ()
    """Warnings, one line each: runs the cost model predicts out of memory (unfit_runs), an underdetermined fit."""

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
        # a variable on a bound that the descent pushes past stays there, and the others are solved for without
        # it: clipping a step solved for all of them stalled short of the optimum (user-tester: after the fit
        # every run was still 2-6% slow with gemm free, memory on its bound)
        free = ~(((u <= lo) & (grad > 0)) | ((u >= hi) & (grad < 0)))
        if not free.any():
            break
        improved = False
        while lam < 1e12:
            damp = np.diag(lam * (np.diag(jtj) + 1e-12))
            delta = np.zeros_like(u)
            delta[free] = np.linalg.solve((jtj + damp)[np.ix_(free, free)], grad[free])
            trial = np.clip(u - delta, lo, hi)
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
                       mape_loo_pct=_mape(loo, measured), unfit=unfit_runs(runs, fitted) + _underdetermined(runs, keys))


def _underdetermined(runs: tuple[Run, ...], keys: tuple[str, ...]) -> tuple[str, ...]:
    """A warning when the runs hold no more distinct configurations than the fit has unknowns (a repeated
    configuration adds no information): the damped fit then stays near the hardware file's values in the
    directions the runs do not inform, and leave-one-out is the error to trust."""
    distinct = len({(r.model_name, r.plan, r.job) for r in runs})
    if distinct > len(keys):
        return ()
    return (f"{distinct} distinct run configuration(s) for {len(keys)} fitted efficiencies ({', '.join(keys)}): "
            "the fit is underdetermined; add runs of other configurations",)


def unfit_runs(runs: tuple[Run, ...], hw: HardwareSpec) -> tuple[str, ...]:
    """A line per run the cost model predicts out of memory on `hw`: it ran, so its configuration or the model
    is off, and its step time is fitted anyway."""
    out = []
    for r in runs:
        est = CostModel(r.model, hw, r.job).estimate(r.plan)
        if not est.fits:
            out.append(f"line {r.line}: the cost model predicts this run out of memory "
                       f"({gib(est.peak_memory_bytes):.1f} of {gib(est.usable_memory_bytes):.1f} GiB usable), yet it "
                       "ran: check its configuration")
    return tuple(out)


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
