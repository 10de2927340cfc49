"""The one figure fitted to the public rows, attention_bwd_ratio of the H100-class hardware files, and the
leave-one-family-out (LOFO) predictions any fit hook gives."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from autotune.catalog import PROFILES_DIR, load_hardware
from autotune.costmodel.estimate import CostModel, Estimate
from autotune.errors import SpecError
from autotune.reports.accuracy.rules import Case
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec

#: The H100-class hardware files (all public rows use one) whose attention_bwd_ratio the diagnostic refit varies
FITTED_HARDWARE = ("h100-sxm", "h200", "h100-hbm2e-96gb")
#: The rows attention_bwd_ratio is fitted to: Transformer Engine / cuDNN attention kernels on H100
ATTENTION_FIT_SOURCES = ("dgxc", "megatron_lm_examples_llama")
ATTENTION_FIT_GPU = "H100"
#: 0.30, 0.35, ..., 1.00
ATTENTION_BWD_GRID = tuple(round(0.30 + 0.05 * i, 2) for i in range(15))
FIT_STATEMENT = ("Nothing is fitted to these rows: every efficiency in the hardware files comes from kernels timed "
                 "alone (profiles/measured/h100-sxm-microbench*.json: GEMMs by shape, cuDNN and FlashAttention-2 "
                 "forward and backward, PyTorch's memory-bound kernels) or from datasheets, so LOFO equals in-sample. "
                 "attention_bwd_ratio, fitted to the Transformer Engine rows until 2026-11 (0.40, when the GEMM "
                 "figure was 23% optimistic), is now measured; the line below prints what a refit to the dgxc and "
                 "Megatron-LM-example H100 rows would choose, as a diagnostic of what the rest of the model still "
                 "misses, never shipped.")


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


def shipped_values() -> dict[str, dict[str, float]]:
    """attention_bwd_ratio as each FITTED_HARDWARE file ships it (files that do not exist are left out)."""
    out = {}
    for name in FITTED_HARDWARE:
        if (PROFILES_DIR / "hardware" / f"{name}.json").is_file():
            out[name] = load_hardware(name).efficiency.attention_bwd_ratio
    return {"attention_bwd_ratio": out}
