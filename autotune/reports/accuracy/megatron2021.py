"""``megatron2021``: Narayanan et al. 2021, Table 1 (see the package docstring): each row's published tp and pp,
the fastest fitting mbs and interleaving, against the step time implied by its achieved TFLOP/s."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import InvalidPlanError, SpecError
from autotune.reports.accuracy.common import (DEFAULT_DATA, Summary, error_pct, read_rows, summarize, summary_head,
                                              summary_line)
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan, check_plan, even_split

SEQ_LEN = 2048
VOCAB = 51200
MBS_CHOICES = (1, 2, 4, 8)
VPP_CHOICES = (2, 4)


@dataclass(frozen=True, slots=True)
class RowResult:
    """One table row: the published step time, the best plan the cost model finds for it, and the error."""

    name: str
    gpus: int
    tp: int
    pp: int
    dp: int
    mbs: int
    schedule: str
    vpp: int
    published_step_s: float
    predicted_step_s: float
    error_pct: float
    """(predicted - published) / published, in percent: negative means the model is too optimistic."""
    fits: bool
    """False when no candidate fits in memory (the fastest non-fitting one is reported)."""
    breakdown: dict[str, float]
    """The chosen plan's step-time terms, seconds."""


@dataclass(frozen=True, slots=True)
class Report:
    """The whole table on one GPU type."""

    gpu: str
    """Catalog GPU or hardware file the predictions used."""
    rows: tuple[RowResult, ...]
    mape_pct: float
    """Mean absolute percentage error over the rows."""
    mean_error_pct: float
    """Mean signed error: the model's bias."""

    def summary(self) -> Summary:
        rows = [(r.name, r.error_pct, r.fits) for r in self.rows]
        return summarize(f"narayanan2021 {Path(self.gpu).stem} fp16", rows)

    def to_dict(self) -> dict:
        return {"source": "Narayanan et al. 2021 (arXiv 2104.04473), Table 1", "gpu": self.gpu,
                "mape_pct": self.mape_pct, "mean_error_pct": self.mean_error_pct,
                "summary": asdict(self.summary()), "rows": [asdict(r) for r in self.rows]}


def published_step_time(row: dict[str, str]) -> float:
    """Seconds per step implied by the row's achieved TFLOP/s and the paper's FLOP formula (appendix)."""
    b, layers, h = int(row["global_batch"]), int(row["layers"]), int(row["hidden"])
    s, v = SEQ_LEN, VOCAB
    flops = 96 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))
    return flops / (float(row["achieved_tflops_per_gpu"]) * 1e12 * int(row["gpus"]))


def candidate_plans(row: dict[str, str], model: ModelSpec, job: JobSpec, gpus_per_node: int) -> Iterator[Plan]:
    """The paper's tp and pp with every micro-batch size and interleaving check_plan accepts."""
    tp, pp, gpus = int(row["tp"]), int(row["pp"]), int(row["gpus"])
    dp = gpus // (tp * pp)
    per_rank = job.global_batch // dp
    schedules = [("1f1b", 1)] + ([("interleaved", v) for v in VPP_CHOICES] if pp > 2 else [])
    for mbs in MBS_CHOICES:
        if per_rank % mbs:
            continue
        for schedule, vpp in schedules:
            plan = Plan(tp=tp, pp=pp, dp=dp, mbs=mbs, num_microbatches=per_rank // mbs, schedule=schedule, vpp=vpp,
                        recompute="full", zero=0, sequence_parallel=False,
                        layers_per_stage=even_split(model.num_layers, pp))
            try:
                check_plan(plan, model, job, gpus, gpus_per_node)
            except InvalidPlanError:
                continue
            yield plan


def evaluate_row(row: dict[str, str], gpu: str = "a100-80gb") -> RowResult:
    """The fastest fitting candidate plan for one row, against the published step time."""
    model = load_model(row["name"])
    # fp16 gradient buffers: Megatron-LM keeps fp16 training's gradients in fp16 unless given
    # --accumulate-allreduce-grads-in-fp32 (its validate_args forces fp32 for bf16 only), and the paper's scripts
    # (examples/pretrain_gpt3_175B.sh) do not give it; its LocalDDP reduced them after the backward, and its
    # interleaved schedule waited on every send (overlap_p2p_comm came in 2023), and its loss ran unfused (the fused
    # cross-entropy came with megatron-core)
    job = JobSpec(global_batch=int(row["global_batch"]), seq_len=SEQ_LEN, dtype="fp16", flash_attention=False,
                  fused_kernels=True, async_tp_backward=False, grad_reduce="fp16", overlap_grad_reduce=False,
                  overlap_p2p=False, cross_entropy="unfused")
    hw = load_hardware(gpu)
    cm = CostModel(model, hw, job)
    estimates = [cm.estimate(plan) for plan in candidate_plans(row, model, job, hw.gpus_per_node)]
    if not estimates:
        raise SpecError(f"{row['name']}: no valid plan for tp {row['tp']}, pp {row['pp']}, {row['gpus']} GPUs")
    fitting = [e for e in estimates if e.fits]
    best: Estimate = min(fitting or estimates, key=lambda e: e.step_time_s)
    published = published_step_time(row)
    p = best.plan
    return RowResult(name=row["name"], gpus=p.num_gpus, tp=p.tp, pp=p.pp, dp=p.dp, mbs=p.mbs, schedule=p.schedule,
                     vpp=p.vpp, published_step_s=published, predicted_step_s=best.step_time_s,
                     error_pct=error_pct(best.step_time_s, published), fits=bool(fitting),
                     breakdown=best.breakdown.as_dict())


def accuracy_report(data: Path = DEFAULT_DATA, gpu: str = "a100-80gb") -> Report:
    """Every row of the table, the mean absolute percentage error and the mean signed error."""
    rows = tuple(evaluate_row(row, gpu) for row in read_rows(data))
    if not rows:
        raise SpecError(f"--data {data}: no data rows")
    errors = [r.error_pct for r in rows]
    return Report(gpu=gpu, rows=rows, mape_pct=sum(abs(e) for e in errors) / len(errors),
                  mean_error_pct=sum(errors) / len(errors))


def format_report(report: Report) -> str:
    """A plain-text table (this module sits below render.py, so no rich)."""
    head = (f"{'model':<11} {'gpus':>5} {'tp':>3} {'pp':>3} {'dp':>3} {'mbs':>3} {'sched':<8} "
            f"{'published s':>11} {'predicted s':>11} {'error':>7}   {'compute':>7} {'recomp':>7} {'tp comm':>7} "
            f"{'pp comm':>7} {'bubble':>7} {'dp comm':>7}")
    lines = [f"Megatron-LM weak scaling (Narayanan et al. 2021, Table 1) on {report.gpu}; mbs and interleaving are "
             "the fastest fitting choice (the paper tuned them per row and does not list them). No parameter of "
             "the cost model is fitted to these rows.", head, "-" * len(head)]
    for r in report.rows:
        b = r.breakdown
        sched = "1f1b" if r.schedule == "1f1b" else f"int v={r.vpp}"
        lines.append(
            f"{r.name:<11} {r.gpus:>5} {r.tp:>3} {r.pp:>3} {r.dp:>3} {r.mbs:>3} {sched:<8} "
            f"{r.published_step_s:>11.2f} {r.predicted_step_s:>11.2f} {r.error_pct:>+6.1f}%   "
            f"{b['compute_s']:>7.2f} {b['recompute_s']:>7.2f} {b['tp_comm_s']:>7.2f} {b['pp_comm_s']:>7.2f} "
            f"{b['bubble_s']:>7.2f} {b['dp_comm_exposed_s']:>7.2f}" + ("" if r.fits else "  (does not fit)"))
    lines.append(f"MAPE {report.mape_pct:.1f}%  (mean signed error {report.mean_error_pct:+.1f}%)")
    lines += ["", summary_head(), summary_line(report.summary())]
    return "\n".join(lines)
