"""How close the cost model comes to published step times, over every public set of published measurements.

Every row is evaluated with its PUBLISHED configuration pinned, never with the planner's best plan.

``megatron2021``: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21, arXiv 2104.04473), Table 1 reports achieved TFLOP/s per GPU for ten GPT models on up to
3072 A100-80GB GPUs. Their FLOP count F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) includes full activation
recomputation, so the measured step time is F / (TFLOP/s per GPU * GPUs). For each row this module evaluates the
published tp and pp with dp = gpus/(tp*pp), fp16, full recomputation, no sequence parallelism (it came in 2022),
ZeRO 0, no flash attention (2022), the tensor-parallel backward's input-gradient all-reduces synchronous (the
asynchronous form, --async-tensor-model-parallel-allreduce, came after the paper's runs) and an even layer split. The paper does not give the micro-batch size or the
interleaving per row and says both were tuned, so the best fitting choice among mbs in {1, 2, 4, 8} and, when
pp > 2, the interleaved schedule with vpp in {2, 4}, is taken.

``public``: profiles/published/published-runs-public.csv, a copy of the project's shared published-runs file:
NVIDIA dgxc-benchmarking (NeMo on DGX H100, Llama 3.1 8B/70B/405B, BF16 and FP8), torchtitan's benchmarks (H100
96 GB HBM2e Grand Teton hosts, one H200 set), Megatron-LM's Llama examples and two MoE runs from Megatron-Bridge.
Each dense pretraining row becomes a ModelSpec, HardwareSpec, JobSpec and Plan from its columns; every knob the
row does not publish follows one written rule (RULES, printed in the report's header); a layout check_plan
rejects is replaced by the nearest valid one, with a note on the row; a row that cannot be represented is
listed as skipped with the reason.

One figure of the cost model is fitted to these rows: ``attention_bwd_ratio`` (backward over forward speed of
fused attention) of the H100-class hardware files, fitted to the dgxc-benchmarking rows and the three
Megatron-LM-example H100 rows (Transformer Engine's cuDNN attention) by the least MAPE over a fixed grid
(fit_attention_bwd_ratio). Every other efficiency comes from public microbenchmarks and datasheets. The in-sample
column uses the shipped hardware files as they are; the leave-one-family-out (LOFO) column refits the ratio
without each model family (Llama 3.1 8B, 70B, 405B) and predicts that family's rows with it;
`public_report(fit=...)` takes any other fitting hook the same way.

Run: ``python -m autotune.accuracy [--set megatron2021|public|all] [--json]``. This file is longer than the
project's ~300-line guide: the two sets share the summary, the JSON and the command line, and splitting them
would spread one report over modules.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

from autotune.catalog import PROFILES_DIR, load_hardware, load_model
from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import InvalidPlanError, SpecError
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan, check_plan, even_split, is_even_split
from autotune.units import GiB, from_gib

PUBLISHED_DIR = PROFILES_DIR / "published"
#: a copy of ../shared/data/megatron-2021-table1.csv shipped with the package (published measurements)
DEFAULT_DATA = PUBLISHED_DIR / "megatron-2021-table1.csv"
#: a copy of ../shared/data/published-runs-public.csv (151 rows) behind '#' lines naming its sources
PUBLIC_DATA = PUBLISHED_DIR / "published-runs-public.csv"
SETS = ("megatron2021", "public")
SEQ_LEN = 2048
VOCAB = 51200
MBS_CHOICES = (1, 2, 4, 8)
VPP_CHOICES = (2, 4)

#: The hardware files whose attention_bwd_ratio is fitted (every H100-class file; all public rows use one)
FITTED_HARDWARE = ("h100-sxm", "h200", "h100-hbm2e-96gb")
#: The rows attention_bwd_ratio is fitted to: Transformer Engine / cuDNN attention kernels on H100
ATTENTION_FIT_SOURCES = ("dgxc", "megatron_lm_examples_llama")
ATTENTION_FIT_GPU = "H100"
#: 0.30, 0.35, ..., 1.00
ATTENTION_BWD_GRID = tuple(round(0.30 + 0.05 * i, 2) for i in range(15))
FIT_STATEMENT = ("One figure of the cost model is fitted to these rows: attention_bwd_ratio (backward over forward "
                 "speed of fused attention) in the H100-class hardware files (" + ", ".join(FITTED_HARDWARE) + "), "
                 "fitted to the dgxc-benchmarking rows and the three Megatron-LM-example H100 rows (both run "
                 "Transformer Engine's cuDNN attention) as the least MAPE over 0.30 to 1.00 in steps of 0.05 (ties -> the "
                 "larger value). Every other efficiency comes from public microbenchmarks and datasheets. The "
                 "in-sample column (MAPE, bias) uses the shipped hardware files as they are; LOFO refits the ratio "
                 "without each model family and predicts that family's rows (every H100/H200 row) with it.")


# ----------------------------------------------------------------- shared: reading, summaries
def read_rows(path: Path) -> list[dict[str, str]]:
    """The CSV's data rows (lines starting with '#' are comments)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SpecError(f"--data {path}: cannot read ({exc.strerror})") from None
    return list(csv.DictReader(line for line in lines if line.strip() and not line.startswith("#")))


def error_pct(predicted: float, published: float) -> float:
    """(predicted - published) / published, in percent: negative means the model is too fast."""
    return 100 * (predicted - published) / published


@dataclass(frozen=True, slots=True)
class Summary:
    """One subset's (or one set's) figures."""

    name: str
    n: int
    mape_pct: float
    """Mean absolute percentage error."""
    mean_error_pct: float
    """Mean signed error, the bias: negative = the model is too fast."""
    worst_row: str
    worst_error_pct: float
    not_fitting: int
    """Rows whose plan the cost model predicts not to fit in memory."""
    lofo_mape_pct: float | None
    """MAPE of the leave-one-family-out predictions (None where the set has no fit hook)."""
    spread_floor_pct: float | None
    """Lowest MAPE any model giving one prediction per config_key can reach here (None: no key repeats)."""
    repeated_configs: int
    """config_keys measured in several releases."""


def summarize(name: str, rows: Sequence[tuple[str, float, bool]], lofo: Sequence[float] | None = None,
              configs: Sequence[tuple[str, float]] | None = None) -> Summary:
    """rows: (label, error %, fits); lofo: the LOFO errors %; configs: (config_key, published step s)."""
    errors = [e for _, e, _ in rows]
    worst = max(rows, key=lambda r: abs(r[1]))
    floor, repeated = spread_floor(configs) if configs is not None else (None, 0)
    return Summary(name=name, n=len(rows), mape_pct=_mean(abs(e) for e in errors), mean_error_pct=_mean(errors),
                   worst_row=worst[0], worst_error_pct=worst[1], not_fitting=sum(not f for _, _, f in rows),
                   lofo_mape_pct=None if lofo is None else _mean(abs(e) for e in lofo),
                   spread_floor_pct=floor, repeated_configs=repeated)


def spread_floor(configs: Sequence[tuple[str, float]]) -> tuple[float | None, int]:
    """The release spread floor: a model sees the same inputs for every release of one config_key, so on a key
    measured as t_1..t_k the best it can do is the single p minimizing sum |t_i - p| / t_i (one of the t_i);
    the floor is that least error summed over repeated keys, divided by all rows (comparable to the MAPE)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for key, t in configs:
        groups[key].append(t)
    repeated = [g for g in groups.values() if len(g) > 1]
    if not repeated:
        return None, 0
    least = sum(min(sum(abs(t - p) / t for t in g) for p in g) for g in repeated)
    return 100 * least / len(configs), len(repeated)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


# ----------------------------------------------------------------- megatron2021: Narayanan et al. Table 1
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
    job = JobSpec(global_batch=int(row["global_batch"]), seq_len=SEQ_LEN, dtype="fp16", flash_attention=False,
                  fused_kernels=True, async_tp_backward=False)
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
    lines += ["", _summary_head(), _summary_line(report.summary())]
    return "\n".join(lines)


# ----------------------------------------------------------------- public: published-runs-public.csv
#: The rule for every knob a public row does not publish (or publishes as free text), in one place; the
#: report prints them in its header.
RULES: tuple[tuple[str, str], ...] = (
    ("rows", "dense pretraining rows; MoE rows (is_moe yes) are listed as skipped here and evaluated in the MoE "
             "section below (no figure is fitted to them); other tasks are listed as skipped with the reason"),
    ("moe", "MoE rows (is_moe yes): the catalog model of the row's name (its config.json shape: head_dim, expert "
            "width, biases, which the shape columns lack), checked against the row's layers, hidden size, experts "
            "and top-k; balanced routing (moe_imbalance 1.0: the rows' source forces it, or drops tokens at "
            "capacity); ep and etp as published, blank etp -> tp (Megatron's default)"),
    ("model", "the row's shape columns as a Llama-family ModelSpec: SwiGLU, RMSNorm, RoPE, no bias, no dropout, "
              "untied embeddings, head_dim = hidden/heads; a reduced-depth 405B proxy keeps its num_layers"),
    ("hardware", "H100 -> h100-sxm (80 GB HBM3, 700 W); torchtitan's Grand Teton H100 (gpu_note '96GB HBM2e') -> "
                 "catalog h100-hbm2e-96gb when it exists, else h100-sxm with 96 GiB and 2.4 TB/s HBM; H200 -> "
                 "h200; gpus_per_node from the row"),
    ("trainer", "NeMo, Megatron-Core, Megatron-LM and Megatron-Bridge rows -> megatron; torchtitan rows -> "
                "torchtitan"),
    ("dtype", "fp8 when precision is fp8 (TE hybrid/current scaling, torchao float8 tensorwise/rowwise alike: "
              "the scaling recipe is not modelled), else bf16; flash attention on"),
    ("fused_kernels", "megatron: on (Transformer Engine); torchtitan: on only when other_settings names "
                      "torch.compile"),
    ("degrees", "tp, pp, cp as published, blank -> 1; dp = dp_derived, which must equal num_gpus/(tp*pp*cp)"),
    ("microbatches", "num_microbatches = global_batch/(dp*mbs) (the derived GA where the source prints another); "
                     "torchtitan pp rows without mbs: torchtitan's default of one micro-batch per pipeline stage "
                     "(pp x stages per rank), mbs = local batch / that; without mbs and pp 1, mbs = local batch"),
    ("schedule", "vp > 1 -> interleaved with vpp = vp; torchtitan 'Interleaved 1F1B' without vp -> vpp 2 "
                 "(torchtitan's default stages per rank for looped schedules); otherwise 1f1b"),
    ("recompute", "activation_recompute text: none / selective (torchtitan's op-level SAC counted as selective) / "
                  "full; blank -> the framework default: megatron none (Megatron-Core's default, and NeMo 2.0's "
                  "Llama 3.1 recipes leave recompute unset), torchtitan its llama3 train config (selective for "
                  "8B, full for 70B and 405B)"),
    ("zero", "torchtitan with fsdp yes -> 3 (FSDP2 shards weights, gradients and optimizer state), without -> 0; "
             "NeMo/Megatron -> 1: they use the distributed optimizer by default (NeMo 1.0 distributed_fused_adam, "
             "NeMo 2.0 use_distributed_optimizer=True), unless the row says fsdp yes (-> 3); FSDP with pp > 1 "
             "-> 1, as check_plan allows no more with pipelining (torchtitan keeps the gathered weights across "
             "micro-batches under PP), with a note on the row"),
    ("sequence_parallel", "on whenever tp > 1: NeMo/Megatron recipes set it with tp, and torchtitan's TP plan "
                          "shards the norms over the sequence (sequence parallelism)"),
    ("tp_overlap", "megatron with tp > 1: on when other_settings says tp_comm_overlap=true, and by the release "
                   "default otherwise (NeMo 2.0 performance recipes, which the Megatron-LM examples follow, turn "
                   "tp_comm_overlap on for tp > 1 on H100); off only where a row says tp_comm_overlap=false; "
                   "torchtitan: on when other_settings names AsyncTP, off for vanilla TP"),
    ("partition", "layers_per_stage = even_split(num_layers, pp), vocab 'ends'; where check_plan rejects the "
                  "published layout, the nearest valid one (for an interleaved split: the vpp <= published "
                  "and per-rank layer counts with the shortest ideal pipeline time, vocab 'balanced' when "
                  "uneven) is evaluated and the row's note says what changed"),
    ("grad_reduce", "dgxc (NeMo) rows -> bf16: NeMo's performance scripts (scripts/performance, "
                    "set_primary_perf_configs) set grad_reduce_in_fp32 = False; Megatron-LM example rows -> fp32 "
                    "(Megatron-LM's default); torchtitan rows -> fp32 (FSDP2 reduces in fp32: torchtitan's "
                    "mixed-precision policy has reduce_dtype float32 by default)"),
    ("lofo", "family = the model (Llama 3 and 3.1 of one size share a shape: Llama3-70B counts as Llama3.1-70B; "
             "a 405B proxy counts as Llama3.1-405B)"),
)
RULE_KEYS = tuple(k for k, _ in RULES)
#: torchtitan's default number of stages per rank for looped (interleaved) schedules (generate_split_points)
TORCHTITAN_STAGES_PER_RANK = 2
#: source_ids whose rows reduce gradients in bf16 (RULES 'grad_reduce')
BF16_GRAD_REDUCE_SOURCES = ("dgxc",)
#: torchtitan's Grand Teton H100: 96 GB HBM2e at 2.4 TB/s (../shared/HARDWARE.md)
HBM2E_96GB = "h100-hbm2e-96gb"


class RowSkipped(Exception):
    """A public row the cost model cannot represent; the message is the reason the report prints."""


@dataclass(frozen=True, slots=True)
class Case:
    """One public row as the cost model's inputs, with the published step time it is judged against."""

    row_id: int
    source_id: str
    gpu_type: str
    family: str
    model: ModelSpec
    hw: HardwareSpec
    job: JobSpec
    plan: Plan
    published_step_s: float
    note: str
    """What was changed to make the published layout valid ('' when nothing was)."""


#: A fitted predictor: step seconds for a case.
Predictor = Callable[[Case], float]


@dataclass(frozen=True, slots=True)
class Fitted:
    """What a fit returns: the predictor and the fitted figures (name -> value) the report prints."""

    predict: Predictor
    params: dict[str, float]


#: A fit builds a Fitted from training cases (their published step times).
Fit = Callable[[Sequence[Case]], Fitted]
#: The cost model's step seconds of a case with attention_bwd_ratio set to a value.
Evaluate = Callable[[Case, float], float]


@lru_cache(maxsize=None)
def _cost_model(model: ModelSpec, hw: HardwareSpec, job: JobSpec) -> CostModel:
    return CostModel(model, hw, job)


@lru_cache(maxsize=None)
def estimate_case(case: Case) -> Estimate:
    """The cost model's estimate of a case (one CostModel per model, hardware and job)."""
    return _cost_model(case.model, case.hw, case.job).estimate(case.plan)


def shipped_step(case: Case) -> float:
    """The cost model's step time with the hardware files as shipped (the in-sample column)."""
    return estimate_case(case).step_time_s


def no_fit(train: Sequence[Case]) -> Fitted:
    """Nothing fitted: every case gets the cost model's step time with the shipped files."""
    return Fitted(shipped_step, {})


def with_attention_bwd_ratio(case: Case, ratio: float) -> Case:
    """The case on its hardware with efficiency.attention_bwd_ratio = ratio."""
    hw = case.hw
    return replace(case, hw=replace(hw, efficiency=replace(hw.efficiency, attention_bwd_ratio=ratio)))


def step_with_attention_bwd_ratio(case: Case, ratio: float) -> float:
    """The default Evaluate: the cost model (one CostModel per model, hardware and job, cached)."""
    return estimate_case(with_attention_bwd_ratio(case, ratio)).step_time_s


def attention_fit_rows(cases: Iterable[Case]) -> list[Case]:
    """The rows attention_bwd_ratio is fitted to: dgxc and Megatron-LM-example rows on H100."""
    return [c for c in cases if c.source_id in ATTENTION_FIT_SOURCES and c.gpu_type == ATTENTION_FIT_GPU]


def fit_attention_bwd_ratio(rows: Sequence[Case], evaluate: Evaluate = step_with_attention_bwd_ratio,
                            grid: Sequence[float] = ATTENTION_BWD_GRID) -> float:
    """The grid value minimizing the MAPE of the training rows' Transformer Engine rows (attention_fit_rows;
    the others are ignored); ties -> the larger value."""
    train = attention_fit_rows(rows)
    if not train:
        raise SpecError("no dgxc or Megatron-LM-example H100 row to fit attention_bwd_ratio to")

    def mape(ratio: float) -> float:
        return sum(abs(evaluate(c, ratio) - c.published_step_s) / c.published_step_s for c in train) / len(train)

    return min(grid, key=lambda r: (round(mape(r), 12), -r))


def attention_bwd_fit(evaluate: Evaluate = step_with_attention_bwd_ratio,
                      grid: Sequence[float] = ATTENTION_BWD_GRID) -> Fit:
    """The report's fit: attention_bwd_ratio fitted to the training cases, then used for every case."""
    def fit(train: Sequence[Case]) -> Fitted:
        ratio = fit_attention_bwd_ratio(train, evaluate, grid)
        return Fitted(lambda case: evaluate(case, ratio), {"attention_bwd_ratio": ratio})
    return fit


def lofo_predictions(cases: Sequence[Case], fit: Fit = no_fit) -> tuple[dict[int, float], dict[str, dict[str, float]]]:
    """Leave one family out: for each model family, fit on the other families' cases and predict its cases.
    Returns the predictions by row_id and the fitted figures by held-out family."""
    out: dict[int, float] = {}
    params: dict[str, dict[str, float]] = {}
    for family in sorted({c.family for c in cases}):
        fitted = fit([c for c in cases if c.family != family])
        params[family] = fitted.params
        out.update((c.row_id, fitted.predict(c)) for c in cases if c.family == family)
    return out, params


def row_family(model_name: str) -> str:
    """The model family for LOFO (RULES 'lofo')."""
    return re.sub(r"^Llama3-", "Llama3.1-", model_name.strip())


def _int(row: dict[str, str], key: str, default: int | None = None) -> int:
    text = row.get(key, "").strip()
    if not text:
        if default is None:
            raise RowSkipped(f"{key} is not published")
        return default
    try:
        return int(text)
    except ValueError:
        raise RowSkipped(f"{key} {text!r} is not an integer") from None


def row_trainer(row: dict[str, str]) -> str:
    framework = row["framework"].lower()
    if "torchtitan" in framework:
        return "torchtitan"
    if "nemo" in framework or "megatron" in framework:
        return "megatron"
    raise RowSkipped(f"framework {row['framework']!r} is not one the cost model knows")


def row_model(row: dict[str, str]) -> ModelSpec:
    """RULES 'model' (dense) and 'moe'."""
    if row["is_moe"].strip().lower() == "yes":
        return row_moe_model(row)
    hidden, heads = _int(row, "hidden_size"), _int(row, "num_attention_heads")
    kv = _int(row, "num_kv_heads", heads)
    if hidden % heads or heads % kv:
        raise RowSkipped(f"shape hidden {hidden}, heads {heads}, kv heads {kv} is not a Llama attention shape")
    return ModelSpec(name=row["model"], num_layers=_int(row, "num_layers"), hidden_size=hidden, num_heads=heads,
                     num_kv_heads=kv, head_dim=hidden // heads, ffn_hidden_size=_int(row, "ffn_hidden_size"),
                     vocab_size=_int(row, "vocab_size"), activation="swiglu", norm="rmsnorm", tied_embeddings=False,
                     bias="none", dropout=False, causal=True, position_embedding="rope",
                     source="shape columns of published-runs-public.csv (Llama family)")


def row_moe_model(row: dict[str, str]) -> ModelSpec:
    """RULES 'moe': the catalog entry named like the row's model, if its shape agrees with the row's columns."""
    name = row["model"].strip().lower()
    try:
        model = load_model(name)
    except SpecError:
        raise RowSkipped(f"MoE model {row['model']!r} has no catalog entry {name!r}") from None
    for column, value in (("num_layers", model.num_layers), ("hidden_size", model.hidden_size),
                          ("num_experts", model.num_experts), ("moe_top_k", model.moe_top_k)):
        if _int(row, column, value) != value:
            raise RowSkipped(f"{column} {row[column]} differs from catalog {name}'s {value}")
    return model


def row_hardware(row: dict[str, str]) -> HardwareSpec:
    """RULES 'hardware'."""
    gpu = row["gpu_type"].strip().upper()
    if gpu == "H100" and re.search(r"96\s*GB\s*HBM2e", row["gpu_note"], re.IGNORECASE):
        if (PROFILES_DIR / "hardware" / f"{HBM2E_96GB}.json").is_file():
            hw = load_hardware(HBM2E_96GB)
        else:
            hw = replace(load_hardware("h100-sxm"), name="h100-sxm with 96 GiB HBM2e at 2.4 TB/s",
                         memory_bytes=from_gib(96), hbm_bandwidth=2.4e12)
    elif gpu == "H100":
        hw = load_hardware("h100-sxm")
    elif gpu == "H200":
        hw = load_hardware("h200")
    else:
        raise RowSkipped(f"gpu_type {row['gpu_type']!r} has no catalog hardware file")
    per_node = _int(row, "gpus_per_node", hw.gpus_per_node)
    return hw if per_node == hw.gpus_per_node else replace(hw, gpus_per_node=per_node)


def row_job(row: dict[str, str], trainer: str) -> JobSpec:
    """RULES 'dtype', 'fused_kernels' and 'grad_reduce'."""
    settings = row["other_settings"].lower()
    fused = trainer == "megatron" or "compile" in settings
    dtype = "fp8" if row["precision"].strip().lower() in ("fp8", "float8") else "bf16"
    grad_reduce = "bf16" if row["source_id"].strip() in BF16_GRAD_REDUCE_SOURCES else "fp32"
    return JobSpec(global_batch=_int(row, "global_batch_size"), seq_len=_int(row, "seq_len"), dtype=dtype,
                   flash_attention=True, fused_kernels=fused, grad_reduce=grad_reduce,  # type: ignore[arg-type]
                   trainer=trainer, moe_imbalance=1.0)  # type: ignore[arg-type]


def row_recompute(row: dict[str, str], trainer: str, model: ModelSpec) -> str:
    """RULES 'recompute'."""
    text = row["activation_recompute"].strip().lower()
    for mode in ("none", "selective", "full"):
        if text.startswith(mode):
            return mode
    if text:
        raise RowSkipped(f"activation_recompute {row['activation_recompute']!r} is not none/selective/full")
    if trainer == "torchtitan":
        return "selective" if row_family(model.name).endswith("-8B") else "full"
    return "none"


def published_plan(row: dict[str, str], model: ModelSpec, job: JobSpec, trainer: str) -> Plan:
    """The row's layout as published, with RULES for what it leaves out (before check_plan)."""
    tp, pp, cp = (_int(row, k, 1) for k in ("tp", "pp", "cp"))
    gpus, dp = _int(row, "num_gpus"), _int(row, "dp_derived")
    if dp * tp * pp * cp != gpus:
        raise RowSkipped(f"dp_derived {dp} != num_gpus/(tp*pp*cp) = {gpus}/({tp}*{pp}*{cp})")
    settings = row["other_settings"].lower()
    vpp = _int(row, "vp", 1)
    if trainer == "torchtitan" and vpp == 1 and pp > 1 and "interleaved" in settings:
        vpp = TORCHTITAN_STAGES_PER_RANK
    if job.global_batch % dp:
        raise RowSkipped(f"global batch {job.global_batch} is not divisible by dp {dp}")
    local = job.global_batch // dp
    if row["micro_batch_size"].strip():
        mbs = _int(row, "micro_batch_size")
    elif trainer == "torchtitan" and pp > 1:
        mbs = local // (pp * vpp) or 1
    elif pp == 1:
        mbs = local
    else:
        raise RowSkipped("micro_batch_size is not published and no default applies (pipeline, not torchtitan)")
    if local % mbs:
        raise RowSkipped(f"local batch {local} (global batch / dp) is not divisible by mbs {mbs}")
    zero = 3 if row["fsdp"].strip().lower() == "yes" else (1 if trainer == "megatron" else 0)
    sp = tp > 1
    if trainer == "megatron":
        overlap = sp and not re.search(r"tp_comm_overlap\s*=\s*false", settings)
    else:
        overlap = sp and bool(re.search(r"async\s*-?\s*tp", settings))
    ep, etp = (_int(row, "ep", 1), _int(row, "etp", tp)) if model.is_moe else (1, 1)
    return Plan(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, num_microbatches=local // mbs, ep=ep, etp=etp,
                schedule="interleaved" if vpp > 1 else "1f1b", vpp=vpp,
                recompute=row_recompute(row, trainer, model), zero=zero,  # type: ignore[arg-type]
                sequence_parallel=sp, tp_overlap=overlap, vocab="ends",
                layers_per_stage=even_split(model.num_layers, pp))


def nearest_interleaved(plan: Plan, num_layers: int) -> Plan:
    """The valid interleaved layout closest to the published one: vpp <= published and per-rank layer counts
    divisible by it, with the shortest ideal pipeline time max(layers) * (m + (pp - 1) / vpp); 1F1B with an
    even split competes as vpp 1."""
    best: tuple[float, Plan] | None = None
    for v in range(plan.vpp, 0, -1):
        if num_layers % v:
            continue
        layers = tuple(v * n for n in even_split(num_layers // v, plan.pp))
        if min(layers) == 0:
            continue
        cost = max(layers) * (plan.num_microbatches + (plan.pp - 1) / v)
        if best is None or cost < best[0]:
            best = (cost, replace(plan, vpp=v, schedule="interleaved" if v > 1 else "1f1b", layers_per_stage=layers,
                                  vocab="ends" if is_even_split(layers) else "balanced"))
    assert best is not None  # v = 1 always qualifies
    return best[1]


def representable(plan: Plan, model: ModelSpec, job: JobSpec, hw: HardwareSpec) -> tuple[Plan, str]:
    """The published plan if check_plan accepts it, else the nearest valid plan and a note saying what changed."""
    gpus = plan.num_gpus
    try:
        check_plan(plan, model, job, gpus, hw.gpus_per_node)
        return plan, ""
    except InvalidPlanError as exc:
        first = str(exc)
    notes, fixed = [], plan
    if fixed.zero >= 2 and fixed.pp > 1:
        fixed = replace(fixed, zero=1)
        notes.append(f"FSDP (zero {plan.zero}) with pp {plan.pp}: check_plan allows zero <= 1 with pp > 1, so "
                     "zero 1 is evaluated (torchtitan keeps FSDP's gathered weights across micro-batches under PP)")
    if fixed.schedule == "interleaved" and any(n % fixed.vpp for n in fixed.layers_per_stage):
        why = ("; NeMo counts the embedding and the loss as layers" if job.trainer == "megatron"
               else "; torchtitan's own split points are not published")
        notes.append(f"interleaved vpp {plan.vpp}: {model.num_layers} layers on pp {plan.pp} split "
                     f"{list(fixed.layers_per_stage)} are not divisible by vpp{why}; evaluated as ")
        fixed = nearest_interleaved(fixed, model.num_layers)
        notes[-1] += (f"{fixed.schedule} vpp {fixed.vpp}, layers {list(fixed.layers_per_stage)}, vocab "
                      f"{fixed.vocab} (the valid layout with the shortest ideal pipeline time)")
    try:
        check_plan(fixed, model, job, gpus, hw.gpus_per_node)
    except InvalidPlanError as exc:
        raise RowSkipped(f"check_plan rejects the published layout: {first}"
                         + ("" if str(exc) == first else f"; nearest: {exc}")) from None
    return fixed, "; ".join(notes)


def row_case(row: dict[str, str]) -> Case:
    """One public dense row as a Case, or RowSkipped with the reason (MoE rows: moe_case)."""
    if is_moe_row(row):
        raise RowSkipped(f"MoE ({row['num_experts'] or '?'} experts, top-{row['moe_top_k'] or '?'}): evaluated in "
                         "the MoE section (RULES 'moe')")
    return _case(row)


def is_moe_row(row: dict[str, str]) -> bool:
    return row["is_moe"].strip().lower() == "yes"


def moe_case(row: dict[str, str]) -> Case:
    """One public MoE row as a Case (RULES 'moe'), or RowSkipped with the reason."""
    return _case(row)


def _case(row: dict[str, str]) -> Case:
    if row["task"].strip().lower() != "pretrain":
        raise RowSkipped(f"task {row['task']!r} is not pretraining")
    trainer = row_trainer(row)
    try:
        model = row_model(row)
        hw = row_hardware(row)
        job = row_job(row, trainer)
        plan, note = representable(published_plan(row, model, job, trainer), model, job, hw)
        step = float(row["step_time_s"])
    except (SpecError, ValueError) as exc:
        raise RowSkipped(str(exc)) from None
    return Case(row_id=_int(row, "row_id"), source_id=row["source_id"].strip(),
                gpu_type=row["gpu_type"].strip().upper(), family=row_family(row["model"]), model=model, hw=hw,
                job=job, plan=plan, published_step_s=step, note=note)


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


def shipped_values() -> dict[str, dict[str, float]]:
    """attention_bwd_ratio as each FITTED_HARDWARE file ships it (files that do not exist are left out)."""
    out = {}
    for name in FITTED_HARDWARE:
        if (PROFILES_DIR / "hardware" / f"{name}.json").is_file():
            out[name] = load_hardware(name).efficiency.attention_bwd_ratio
    return {"attention_bwd_ratio": out}


def public_report(data: Path = PUBLIC_DATA, fit: Fit | None = None) -> PublicReport:
    """Every public row with its published configuration pinned, per-subset figures and the skipped rows. The
    in-sample predictions use the shipped hardware files; `fit` (default: attention_bwd_fit()) is run on every
    family (reported only) and without each family (the LOFO predictions)."""
    fit = attention_bwd_fit() if fit is None else fit
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
    fitted_all = fit(only).params
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


# ----------------------------------------------------------------- text
def _summary_head() -> str:
    return (f"{'subset':<38} {'n':>4} {'MAPE':>7} {'bias':>7} {'LOFO':>7} {'floor':>7}  {'worst row':<20} "
            f"{'not fit':>7}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _summary_line(s: Summary) -> str:
    worst = f"{s.worst_row} ({s.worst_error_pct:+.1f}%)"
    return (f"{s.name:<38} {s.n:>4} {_pct(s.mape_pct):>7} {s.mean_error_pct:>+6.1f}% {_pct(s.lofo_mape_pct):>7} "
            f"{_pct(s.spread_floor_pct):>7}  {worst:<20} {s.not_fitting:>7}")


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
        lines.append(f"{name} shipped: {shipped}" + (f"; fitted on all families: {report.fitted_all[name]:.2f}"
                                                     if name in report.fitted_all else ""))
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
              "lowest MAPE a model giving one prediction per config_key can reach.", _summary_head()]
    lines += [_summary_line(s) for s in report.subsets]
    lines += [_summary_line(report.overall), "", *fitted_lines(report), "", f"Skipped rows ({len(report.skipped)}):"]
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
        lines += ["", "MoE rows (issue 14; RULES 'moe'; nothing fitted to them, so LOFO = in-sample):", _summary_head(),
                  _summary_line(report.moe), head, "-" * len(head)]
        lines += [_row_line(r) for r in report.moe_rows]
    return "\n".join(lines)


# ----------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.accuracy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=(*SETS, "all"), default="all", dest="which",
                        help="which published set to report (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="the Megatron 2021 Table 1 CSV (default: %(default)s)")
    parser.add_argument("--public-data", type=Path, default=PUBLIC_DATA,
                        help="the published-runs CSV (default: %(default)s)")
    parser.add_argument("--gpu", default="a100-80gb",
                        help="catalog GPU or hardware file for the Megatron 2021 set (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = parser.parse_args(argv)
    sets = SETS if args.which == "all" else (args.which,)
    try:
        reports = {}
        if "megatron2021" in sets:
            reports["megatron2021"] = accuracy_report(args.data, args.gpu)
        if "public" in sets:
            reports["public"] = public_report(args.public_data)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps({k: r.to_dict() for k, r in reports.items()}, indent=2, sort_keys=True))
    else:
        texts = [format_report(r) if k == "megatron2021" else format_public(r) for k, r in reports.items()]
        print("\n\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
