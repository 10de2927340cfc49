"""``public``: every row of published-runs-public.csv with its published configuration pinned, per-subset figures,
the skipped rows and the MoE rows; the report as one JSON object or plain text (no rich below render)."""

from __future__ import annotations

import re
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.catalog import PROFILES_DIR
from autotune.errors import SpecError
from autotune.reports.accuracy.common import (PUBLIC_DATA, Summary, error_pct, read_rows, summarize, summary_head,
                                              summary_line)
from autotune.reports.accuracy.fit import (FIT_STATEMENT, Fit, attention_bwd_fit, estimate_case, lofo_predictions,
                                           no_fit, shipped_step, shipped_values)
from autotune.reports.accuracy.rules import RULES, Case, RowSkipped, is_moe_row, moe_case, row_case
from autotune.units import GiB


@dataclass(frozen=True, slots=True)
class PublicRow:
    """One evaluated public row."""

    row_id: int
    source_id: str
    gpu_type: str
    precision: str
    model: str
    family: str
    num_layers: int
    config_key: str
    release: str
    hardware: str
    trainer: str
    dtype: str
    fused_kernels: bool
    gpus: int
    plan: dict
    """The evaluated plan (Plan.to_dict())."""
    published_step_s: float
    predicted_step_s: float
    error_pct: float
    """(predicted - published) / published, in percent: negative = the model is too fast."""
    lofo_step_s: float
    lofo_error_pct: float
    fits: bool
    peak_memory_gib: float
    breakdown: dict[str, float]
    """The cost model's step-time terms, seconds (they sum to its step time)."""
    note: str


@dataclass(frozen=True, slots=True)
class SkippedRow:
    row_id: int
    model: str
    source_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class PublicReport:
    data: str
    rows: tuple[PublicRow, ...]
    skipped: tuple[SkippedRow, ...]
    subsets: tuple[Summary, ...]
    """Per source_id x gpu_type x precision, in that order."""
    overall: Summary
    shipped: dict[str, dict[str, float]]
    """The fitted figures as the hardware files ship them: figure -> hardware file -> value."""
    fitted_all: dict[str, float]
    """The fit on every family (for comparison with the shipped value; the in-sample column does not use it)."""
    fitted_lofo: dict[str, dict[str, float]]
    """The fit without each family: held-out family -> figure -> value."""
    moe_rows: tuple[PublicRow, ...] = ()
    """The MoE rows (issue 14), with the shipped files (nothing is fitted to them: LOFO = in-sample)."""
    moe: Summary | None = None
    """Their figures."""

    def to_dict(self) -> dict:
        return {"source": self.data, "fitted": FIT_STATEMENT, "rules": dict(RULES),
                "fitted_values": {"shipped": self.shipped, "all_families": self.fitted_all,
                                  "without_family": self.fitted_lofo},
                "overall": asdict(self.overall), "subsets": [asdict(s) for s in self.subsets],
                "skipped": [asdict(s) for s in self.skipped], "rows": [asdict(r) for r in self.rows],
                "moe": None if self.moe is None else {"summary": asdict(self.moe),
                                                      "rows": [asdict(r) for r in self.moe_rows]}}


def public_row(row: dict[str, str], case: Case, predicted: float, lofo: float) -> PublicRow:
    est = estimate_case(case)
    return PublicRow(
        row_id=case.row_id, source_id=row["source_id"], gpu_type=row["gpu_type"], precision=row["precision"],
        model=row["model"], family=case.family, num_layers=case.model.num_layers, config_key=row["config_key"],
        release=row["source_release"], hardware=case.hw.name, trainer=case.job.trainer, dtype=case.job.dtype,
        fused_kernels=case.job.fused_kernels, gpus=case.plan.num_gpus, plan=case.plan.to_dict(),
        published_step_s=case.published_step_s, predicted_step_s=predicted,
        error_pct=error_pct(predicted, case.published_step_s), lofo_step_s=lofo,
        lofo_error_pct=error_pct(lofo, case.published_step_s), fits=est.fits,
        peak_memory_gib=est.peak_memory_bytes / GiB, breakdown=est.breakdown.as_dict(), note=case.note)


def _summary(name: str, rows: Sequence[PublicRow]) -> Summary:
    return summarize(name, [(str(r.row_id), r.error_pct, r.fits) for r in rows], [r.lofo_error_pct for r in rows],
                     [(r.config_key, r.published_step_s) for r in rows])


def public_report(data: Path = PUBLIC_DATA, fit: Fit | None = None) -> PublicReport:
    """Every public row with its published configuration pinned, per-subset figures and the skipped rows. The
    in-sample predictions use the shipped hardware files; `fit` (default: none, the files are not fitted) is run
    without each family (the LOFO predictions); the attention_bwd_ratio refit on every family is reported as a
    diagnostic only."""
    fit = no_fit if fit is None else fit
    cases: list[tuple[dict[str, str], Case]] = []
    skipped: list[SkippedRow] = []
    for row in read_rows(data):
        try:
            case = row_case(row)
            try:
                estimate_case(case)
            except SpecError as exc:
                raise RowSkipped(f"the cost model rejects it: {exc}") from None
            cases.append((row, case))
        except RowSkipped as exc:
            skipped.append(SkippedRow(row_id=int(row["row_id"]), model=row["model"], source_id=row["source_id"],
                                      reason=str(exc)))
    if not cases:
        raise SpecError(f"--public-data {data}: no row the cost model can represent")
    only = [c for _, c in cases]
    fitted_all = {**attention_bwd_fit()(only).params, **fit(only).params}
    lofo, fitted_lofo = lofo_predictions(only, fit)
    rows = sorted((public_row(row, c, shipped_step(c), lofo[c.row_id]) for row, c in cases), key=lambda r: r.row_id)
    groups: dict[tuple[str, str, str], list[PublicRow]] = defaultdict(list)
    for r in rows:
        groups[(r.source_id, r.gpu_type, r.precision)].append(r)
    subsets = tuple(_summary(" ".join(key), groups[key]) for key in sorted(groups))
    moe_rows = tuple(moe_public_rows(data))
    return PublicReport(data=_display_path(data), rows=tuple(rows), subsets=subsets, overall=_summary("all", rows),
                        skipped=tuple(sorted(skipped, key=lambda s: s.row_id)), shipped=shipped_values(),
                        fitted_all=fitted_all, fitted_lofo=fitted_lofo, moe_rows=moe_rows,
                        moe=_summary("MoE rows", moe_rows) if moe_rows else None)


def moe_public_rows(data: Path = PUBLIC_DATA) -> list[PublicRow]:
    """The MoE rows the cost model can represent (RULES 'moe'), predicted with the shipped files."""
    out = []
    for row in read_rows(data):
        if not is_moe_row(row):
            continue
        try:
            case = moe_case(row)
            step = shipped_step(case)
        except (RowSkipped, SpecError):
            continue  # listed among the skipped rows of the dense report with its MoE reason
        out.append(public_row(row, case, step, step))
    return sorted(out, key=lambda r: r.row_id)


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(PROFILES_DIR.parent))
    except ValueError:
        return str(path)


_TERMS = (("compute_s", "compute"), ("recompute_s", "recomp"), ("tp_comm_s", "tp"), ("cp_comm_s", "cp"),
          ("pp_comm_s", "pp"), ("bubble_s", "bubble"), ("dp_comm_exposed_s", "dp"), ("optimizer_s", "optim"))


def _row_line(r: PublicRow) -> str:
    p = r.plan
    model = r.model if r.family != "Llama3.1-405B" or r.num_layers == 126 else f"{r.model}/L{r.num_layers}"
    flags = ("s" if p["sequence_parallel"] else "-") + ("o" if p["tp_overlap"] else "-")
    terms = " ".join(f"{r.breakdown[k]:>7.2f}" for k, _ in _TERMS)
    return (f"{r.row_id:>4} {r.source_id[:10]:<10} {model:<18} {r.gpus:>5} {p['tp']:>2} {p['pp']:>2} {p['cp']:>2} "
            f"{p['dp']:>3} {p['mbs']:>3} {p['num_microbatches']:>4} {p['vpp']:>2} {p['zero']:>1} "
            f"{p['recompute'][:4]:<4} {flags:<2} {r.dtype:<4} {r.published_step_s:>8.2f} {r.predicted_step_s:>8.2f} "
            f"{r.error_pct:>+6.1f}% {'yes' if r.fits else 'NO':>4} {r.peak_memory_gib:>5.1f}  {terms}"
            + (f"  {r.note}" if r.note else ""))


def _size(family: str) -> tuple[float, str]:
    """Families by parameter count (Llama3.1-8B before -70B before -405B), then by name."""
    found = re.search(r"(\d+(?:\.\d+)?)B$", family)
    return (float(found.group(1)) if found else float("inf"), family)


def _short(family: str) -> str:
    return family.rsplit("-", 1)[-1]


def fitted_lines(report: PublicReport) -> list[str]:
    """The fitted figures: shipped, on every family, and without each family (the LOFO fits)."""
    lines = []
    for name, files in report.shipped.items():
        shipped = ", ".join(f"{f} {v:.2f}" for f, v in files.items())
        lines.append(f"{name} shipped (measured): {shipped}" + (
            f"; a refit to the Transformer Engine rows would choose {report.fitted_all[name]:.2f} (diagnostic, not "
            "shipped)" if name in report.fitted_all else ""))
    for family, params in sorted(report.fitted_lofo.items(), key=lambda kv: _size(kv[0])):
        lines += [f"{name} fitted without {_short(family)}: {value:.2f}" for name, value in params.items()]
    return lines


def format_public(report: PublicReport) -> str:
    """The public set: header with the rules, per-subset figures, skipped and changed rows, then every row."""
    wrap = textwrap.TextWrapper(width=118, subsequent_indent=" " * 21)
    lines = [f"Published runs ({report.data}), each row's published configuration pinned (never the planner's "
             "best plan).", *textwrap.wrap(FIT_STATEMENT, 118), "Rules for what the rows do not publish:"]
    lines += [wrap.fill(f"  {key:<18} {text}") for key, text in RULES]
    lines += ["", "error = (predicted - published) / published; bias = mean signed error (negative = model too "
              "fast); LOFO = MAPE of leave-one-family-out", "predictions; floor = the release spread floor, the "
              "lowest MAPE a model giving one prediction per config_key can reach.", summary_head()]
    lines += [summary_line(s) for s in report.subsets]
    lines += [summary_line(report.overall), "", *fitted_lines(report), "", f"Skipped rows ({len(report.skipped)}):"]
    lines += [f"  row {s.row_id} {s.model} ({s.source_id}): {s.reason}" for s in report.skipped]
    changed = [r for r in report.rows if r.note]
    lines += ["", f"Rows evaluated with the nearest valid representation ({len(changed)}):"]
    lines += [f"  row {r.row_id} {r.model}: {r.note}" for r in changed]
    head = (f"{'row':>4} {'source':<10} {'model':<18} {'gpus':>5} {'tp':>2} {'pp':>2} {'cp':>2} {'dp':>3} {'mbs':>3} "
            f"{'m':>4} {'vp':>2} {'z':>1} {'rc':<4} {'so':<2} {'type':<4} {'publ s':>8} {'pred s':>8} {'error':>7} "
            f"{'fits':>4} {'GiB':>5}  " + " ".join(f"{name:>7}" for _, name in _TERMS) + "  note")
    lines += ["", "Per row (so: s = sequence parallel, o = tp overlap; z = ZeRO stage; m = micro-batches; the last "
              "columns are the cost model's step-time terms, s):", head, "-" * len(head)]
    lines += [_row_line(r) for r in report.rows]
    if report.moe is not None:
        lines += ["", "MoE rows (RULES 'moe'; nothing fitted to them, so LOFO = in-sample):", summary_head(),
                  summary_line(report.moe), head, "-" * len(head)]
        lines += [_row_line(r) for r in report.moe_rows]
    return "\n".join(lines)
