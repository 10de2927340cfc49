"""The accuracy report: Megatron-LM's published weak-scaling table (Narayanan et al. 2021, Table 1) and the public
published-runs set (NVIDIA dgxc-benchmarking, torchtitan benchmarks, Megatron-LM examples). No accuracy threshold
is asserted here: the cost model changes, and this file pins the row -> plan mapping, the attention_bwd_ratio fit
and the report's structure."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.catalog import load_hardware, load_model
from autotune.errors import SpecError
from autotune.reports.accuracy import rules
from autotune.reports.accuracy.__main__ import main
from autotune.reports.accuracy.common import DEFAULT_DATA, PUBLIC_DATA, read_rows, spread_floor
from autotune.reports.accuracy.fit import (ATTENTION_BWD_GRID, ATTENTION_FIT_SOURCES, Fitted, attention_bwd_fit,
                                           attention_fit_rows, estimate_case, fit_attention_bwd_ratio,
                                           lofo_predictions, step_with_attention_bwd_ratio, with_attention_bwd_ratio)
from autotune.reports.accuracy.megatron2021 import accuracy_report, published_step_time
from autotune.reports.accuracy.public import public_report
from autotune.reports.accuracy.rules import RULE_KEYS, Case, RowSkipped, nearest_interleaved, row_case, row_hardware
from autotune.specs.plan import Plan
from autotune.units import GiB

DATA = DEFAULT_DATA
PUBLIC = PUBLIC_DATA
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "published-runs-public.csv"


@pytest.fixture(scope="module")
def report():
    return accuracy_report(DATA)


@pytest.fixture(scope="module")
def public():
    return public_report(PUBLIC)


@pytest.fixture(scope="module")
def public_rows():
    return {int(r["row_id"]): r for r in read_rows(PUBLIC)}


def case(public_rows, row_id: int) -> Case:
    return row_case(public_rows[row_id])


# ----------------------------------------------------------------- megatron2021
def test_published_step_time_of_the_first_row_by_hand():
    """gpt-1.7b: B=512, s=2048, l=24, h=2304, V=51200, 137 TFLOP/s on 32 GPUs (Table 1), F from the appendix."""
    row = read_rows(DATA)[0]
    assert row["name"] == "gpt-1.7b"
    flops = 96 * 512 * 2048 * 24 * 2304**2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    assert published_step_time(row) == pytest.approx(flops / (137e12 * 32))


def test_report_has_ten_rows_with_positive_predictions(report):
    assert len(report.rows) == 10
    for r in report.rows:
        assert r.predicted_step_s > 0 and r.published_step_s > 0
        assert r.fits
        assert r.tp * r.pp * r.dp == r.gpus
        assert r.schedule == "1f1b" or (r.pp > 2 and r.vpp in (2, 4))
        assert sum(r.breakdown.values()) == pytest.approx(r.predicted_step_s)
    assert report.mape_pct == pytest.approx(sum(abs(r.error_pct) for r in report.rows) / 10)
    assert math.isfinite(report.mape_pct)
    summary = report.summary()
    assert (summary.n, summary.mape_pct, summary.not_fitting) == (10, report.mape_pct, 0)


def test_main_prints_a_table_and_json(capsys):
    assert main(["--set", "megatron2021", "--data", str(DATA)]) == 0
    out = capsys.readouterr().out
    assert "gpt-1008b" in out and "MAPE" in out and "Published runs" not in out
    assert main(["--set", "megatron2021", "--data", str(DATA), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["megatron2021"]
    table = doc["megatron2021"]
    assert len(table["rows"]) == 10 and table["mape_pct"] > 0
    assert {"name", "published_step_s", "predicted_step_s", "error_pct", "mbs", "vpp"} <= table["rows"][0].keys()


def test_main_reports_a_missing_file(capsys, tmp_path):
    assert main(["--data", str(tmp_path / "none.csv")]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert main(["--set", "public", "--public-data", str(tmp_path / "none.csv")]) == 1
    assert "cannot read" in capsys.readouterr().err


# ----------------------------------------------------------------- public: the data file
def test_public_file_is_the_shared_copy_behind_comment_lines():
    text = PUBLIC.read_text()
    assert text.startswith("#") and "dgxc-benchmarking" in text.split("\n", 12)[5] + text[:2000]
    assert len(read_rows(PUBLIC)) == 151
    if SHARED.is_file():  # the project's shared copy, when this checkout has one
        data = [line for line in text.splitlines() if not line.startswith("#")]
        assert data == SHARED.read_text().splitlines()


# ----------------------------------------------------------------- public: row -> plan, hand-checked
def test_dgxc_70b_bf16_nemo1_row(public_rows):
    """Row 89: dgxc v24.11.1, Llama 3.1 70B BF16 on 64 H100, 'TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64', GBS 128,
    ub_tp_comm_overlap=true, recompute none: dp = 64/(4*4*2) = 2, microbatches = 128/(2*1) = 64."""
    c = case(public_rows, 89)
    p = c.plan
    assert (p.tp, p.pp, p.cp, p.dp, p.mbs, p.num_microbatches) == (4, 4, 2, 2, 1, 64)
    assert (p.schedule, p.vpp, p.layers_per_stage, p.vocab) == ("interleaved", 5, (20, 20, 20, 20), "ends")
    assert (p.zero, p.sequence_parallel, p.tp_overlap, p.recompute) == (1, True, True, "none")
    assert (c.job.dtype, c.job.trainer, c.job.fused_kernels, c.job.flash_attention) == ("bf16", "megatron", True, True)
    assert c.job.grad_reduce == "bf16"  # NeMo's performance scripts: grad_reduce_in_fp32 = False
    assert (c.job.global_batch, c.job.seq_len) == (128, 8192)
    assert (c.source_id, c.gpu_type) == ("dgxc", "H100")
    assert c.hw.name == "h100-sxm" and c.hw.gpus_per_node == 8
    assert c.family == "Llama3.1-70B" and c.note == "" and c.published_step_s == 14.72


def test_row_shape_is_the_catalog_llama(public_rows):
    """The row's shape columns give the same ModelSpec as profiles/models/llama3.1-70b.json (name and the RoPE
    fields, which only the launch files read, aside)."""
    catalog = load_model("llama3.1-70b")
    assert replace(case(public_rows, 89).model, name=catalog.name, source=catalog.source,
                   rope_theta=catalog.rope_theta, rope_scaling=catalog.rope_scaling,
                   rope_scaling_factor=catalog.rope_scaling_factor) == catalog


def test_nemo2_row_uses_release_defaults(public_rows):
    """Row 94: NeMo 2.0 (25.04) prints neither recompute nor overlap: RULES give none, tp_comm_overlap on (tp 4)."""
    p = case(public_rows, 94).plan
    assert (p.recompute, p.tp_overlap, p.sequence_parallel, p.zero) == ("none", True, True, 1)


def test_dgxc_fp8_row(public_rows):
    """Row 109: NeMo 2.0, 70B FP8 on 64 H100, TP 4 PP 8 CP 1 VP 5, GBS 128: dp 2, 10 layers per rank."""
    c = case(public_rows, 109)
    p = c.plan
    assert (c.job.dtype, c.job.grad_reduce) == ("fp8", "bf16")
    assert (p.tp, p.pp, p.cp, p.dp, p.num_microbatches, p.vpp) == (4, 8, 1, 2, 64, 5)
    assert p.layers_per_stage == (10,) * 8 and p.tp_overlap


def test_dgxc_8b_row_has_no_tp(public_rows):
    """Row 125: 8B, TP 1 PP 1 CP 2: no sequence parallelism and no TP overlap."""
    p = case(public_rows, 125).plan
    assert (p.tp, p.pp, p.cp, p.dp, p.num_microbatches, p.schedule) == (1, 1, 2, 4, 32, "1f1b")
    assert not p.sequence_parallel and not p.tp_overlap


def test_torchtitan_fsdp_tp_rows(public_rows):
    """Rows 319/320: torchtitan, 70B on 256 Grand Teton H100, FSDP 32 x TP 8, compile, full AC, LBS 16, BF16;
    vanilla TP vs AsyncTP."""
    vanilla, async_tp = case(public_rows, 319), case(public_rows, 320)
    p = vanilla.plan
    assert (p.tp, p.pp, p.cp, p.dp, p.mbs, p.num_microbatches) == (8, 1, 1, 32, 16, 1)
    assert (p.zero, p.recompute, p.sequence_parallel, p.tp_overlap) == (3, "full", True, False)
    assert async_tp.plan == replace(p, tp_overlap=True)
    assert (vanilla.job.trainer, vanilla.job.fused_kernels, vanilla.job.dtype) == ("torchtitan", True, "bf16")
    assert vanilla.job.grad_reduce == "fp32"  # FSDP2 with torchtitan's reduce_dtype float32
    assert vanilla.hw.memory_bytes == 96 * GiB
    assert vanilla.hw.hbm_bandwidth == pytest.approx(2.4e12)


def test_grand_teton_h100_without_its_catalog_file(public_rows, monkeypatch):
    """Before profiles/hardware/h100-hbm2e-96gb.json exists: h100-sxm with 96 GiB and 2.4 TB/s of HBM."""
    monkeypatch.setattr(rules, "HBM2E_96GB", "no-such-gpu")
    hw = row_hardware(public_rows[319])
    assert (hw.memory_bytes, hw.hbm_bandwidth) == (96 * GiB, 2.4e12)
    assert hw.peak_flops_bf16 == load_hardware("h100-sxm").peak_flops_bf16


def test_torchtitan_fsdp_without_compile(public_rows):
    """Row 327: FSDP on 8 GPUs, LBS 2, selective AC, no torch.compile -> fused kernels off."""
    c = case(public_rows, 327)
    assert (c.plan.dp, c.plan.mbs, c.plan.num_microbatches, c.plan.zero, c.plan.recompute) == (8, 2, 1, 3, "selective")
    assert not c.job.fused_kernels
    assert case(public_rows, 328).job.fused_kernels  # "FSDP + torch.compile"


def test_torchtitan_float8_context_parallel_row(public_rows):
    """Row 337: 8B Float8, FSDP 1 x CP 8, seq 262144, LBS 1, full AC."""
    c = case(public_rows, 337)
    assert c.job.dtype == "fp8" and c.job.seq_len == 262144
    assert (c.plan.cp, c.plan.dp, c.plan.zero, c.plan.recompute) == (8, 1, 3, "full")


def test_torchtitan_pipeline_rows_take_the_default_microbatches(public_rows):
    """Rows 313/314: 405B, FSDP 8 x TP 8 x PP 8, LBS 32, micro-batches not stated (torchtitan's default: one per
    stage): 1F1B -> 8 of 4; Interleaved 1F1B -> 2 stages per rank, 16 of 2. FSDP with pp becomes zero 1."""
    one, inter = case(public_rows, 313).plan, case(public_rows, 314).plan
    assert (one.schedule, one.vpp, one.mbs, one.num_microbatches, one.zero) == ("1f1b", 1, 4, 8, 1)
    assert (inter.schedule, inter.vpp, inter.mbs, inter.num_microbatches) == ("interleaved", 2, 2, 16)
    assert "zero 1" in case(public_rows, 313).note


def test_405b_interleaved_runs_as_published(public_rows):
    """Row 60: NeMo 405B, 126 layers, PP 8, VP 8 (NeMo counts embedding and loss as layers: 128/64 = 2 per chunk).
    Interleaved chunks may differ by a layer, so the published layout is evaluated as it is: the first and last
    ranks one layer lighter, as NeMo's accounting makes them."""
    c = case(public_rows, 60)
    assert (c.plan.vpp, c.plan.vocab, c.plan.schedule) == (8, "ends", "interleaved")
    assert c.plan.layers_per_stage == (15,) + (16,) * 6 + (15,)
    assert not c.note


def test_megatron_lm_example_row(public_rows):
    """Row 310: Megatron-LM examples, Llama3-70B FP8 on 64 H100, TP 4 PP 8 VP 5, GBS 128: Megatron-LM's default
    fp32 gradient reduction; family Llama3.1-70B (Llama 3 and 3.1 share the shape)."""
    c = case(public_rows, 310)
    assert (c.source_id, c.family, c.job.trainer, c.job.dtype, c.job.grad_reduce) == (
        "megatron_lm_examples_llama", "Llama3.1-70B", "megatron", "fp8", "fp32")
    assert (c.plan.tp, c.plan.pp, c.plan.dp, c.plan.vpp, c.plan.num_microbatches) == (4, 8, 2, 5, 64)


def test_h200_row(public_rows):
    c = case(public_rows, 346)
    assert (c.hw.name, c.job.grad_reduce) == ("h200", "fp32")


@pytest.mark.parametrize("gpu, name", [("B200", "b200"), ("b200", "b200"), ("H200", "h200"), ("H800", "h800"),
                                       ("A100", "a100-80gb")])
def test_b200_rows_run_on_the_catalog_b200(public_rows, gpu, name):
    """RULES 'hardware': a DGX B200 row (held out: the public rows are H100/H200) runs on profiles/hardware/b200.json
    with the row's GPUs per node; a GPU without a catalog file is skipped with the reason."""
    row = {**public_rows[346], "gpu_type": gpu}
    assert row_hardware(row).name == name
    with pytest.raises(RowSkipped, match="GB200"):
        row_hardware({**row, "gpu_type": "GB200"})
    assert row_hardware({**row, "gpu_type": "A100", "gpu_note": "SXM4 40GB HBM2"}).name == "a100-40gb"


def test_grad_reduce_rule_over_every_row(public_rows):
    """RULES 'grad_reduce': bf16 exactly on the dgxc rows."""
    for row_id, row in public_rows.items():
        try:
            c = row_case(row)
        except RowSkipped:
            continue
        assert c.job.grad_reduce == ("bf16" if row["source_id"] == "dgxc" else "fp32"), row_id


def test_moe_rows_are_skipped_with_the_reason(public_rows):
    with pytest.raises(RowSkipped, match="MoE"):
        row_case(public_rows[519])


def test_nearest_interleaved_by_hand():
    """30 layers on pp 4, vpp 8, 64 micro-batches: vpp 2 [8,8,8,6] (8*(64+1.5)) beats vpp 3 [6,9,9,6], 5, 6 and
    1F1B [7,8,8,7] (8*(64+3))."""
    plan = Plan(tp=8, pp=4, dp=1, cp=2, mbs=1, num_microbatches=64, schedule="interleaved", vpp=8,
                         layers_per_stage=(7, 8, 8, 7))
    best = nearest_interleaved(plan, 30)
    assert (best.vpp, best.layers_per_stage, best.vocab) == (2, (8, 8, 8, 6), "balanced")


def test_spread_floor_by_hand():
    """Key a measured 10 and 11 s: the best single prediction is 10 (error 1/11 on the 11 s row); b once."""
    floor, repeated = spread_floor([("a", 10.0), ("a", 11.0), ("b", 5.0)])
    assert repeated == 1 and floor == pytest.approx(100 * (1 / 11) / 3)
    assert spread_floor([("a", 1.0)]) == (None, 0)


# ----------------------------------------------------------------- public: the report
def test_public_report_covers_every_row(public, public_rows):
    predicted = {r.row_id for r in public.rows}
    skipped = {s.row_id for s in public.skipped}
    assert predicted | skipped == set(public_rows) and not predicted & skipped
    for s in public.skipped:
        assert s.reason
    moe = {i for i, r in public_rows.items() if r["is_moe"] == "yes"}
    assert moe <= skipped
    assert {i for i in public_rows if i not in moe} <= predicted  # every dense row is predicted here


def test_every_published_run_is_predicted_to_fit(public):
    """A configuration that ran must fit: no dense row is predicted out of memory."""
    assert [r.row_id for r in public.rows if not r.fits] == []


def test_nemo_rows_meet_the_fidelity_targets(public):
    """Issue 11's targets for the Transformer Engine rows (NeMo's and Megatron-LM's H100 runs, BF16 and FP8), with
    nothing fitted to them: MAPE < 8% and |bias| < 4% over them. Each dtype alone is guarded at MAPE < 8% and
    |bias| < 5% (a regression guard on `make accuracy`): BF16 runs about 4% fast and FP8 about 3% slow, a split
    the model does not explain (README, Limits)."""
    by = {s.name: s for s in public.subsets}
    for name in ("dgxc H100 bf16", "dgxc H100 fp8"):
        s = by[name]
        assert s.mape_pct < 8 and abs(s.mean_error_pct) < 5 and s.lofo_mape_pct < 8, name
    errors = [100 * (r.predicted_step_s / r.published_step_s - 1) for r in public.rows
              if r.source_id in ("dgxc", "megatron_lm_examples_llama")]
    assert len(errors) == 107
    assert sum(map(abs, errors)) / len(errors) < 8 and abs(sum(errors) / len(errors)) < 4


def test_weak_scaling_with_only_dp_growing_stays_flat(public):
    """NeMo's Llama 3.1 70B BF16 series (64 to 2048 GPUs, tp4 pp4 cp2 vp5, dp 2 to 64) publishes a flat step;
    the prediction stays within 5% of its smallest member's."""
    series = sorted((r.gpus, r.predicted_step_s) for r in public.rows
                    if r.source_id == "dgxc" and r.family == "Llama3.1-70B" and r.dtype == "bf16"
                    and (r.plan["tp"], r.plan["pp"], r.plan["cp"]) == (4, 4, 2))
    assert {g for g, _ in series} >= {64, 128, 256, 512, 1024, 2048}
    smallest = series[0][1]
    assert all(abs(step / smallest - 1) < 0.05 for _, step in series)


def test_public_report_structure(public):
    assert sum(s.n for s in public.subsets) == public.overall.n == len(public.rows)
    names = [s.name for s in public.subsets]
    assert names == sorted(names) and "dgxc H100 bf16" in names and "torchtitan_benchmarks H100 fp8" in names
    for s in (*public.subsets, public.overall):
        assert math.isfinite(s.mape_pct) and math.isfinite(s.mean_error_pct) and math.isfinite(s.lofo_mape_pct)
        assert 0 <= s.not_fitting <= s.n
    dgxc = public.subsets[names.index("dgxc H100 bf16")]
    assert dgxc.repeated_configs > 0 and dgxc.spread_floor_pct is not None and dgxc.spread_floor_pct >= 0
    for r in public.rows:
        assert r.predicted_step_s > 0 and r.published_step_s > 0
        assert sum(r.breakdown.values()) == pytest.approx(r.predicted_step_s)
        assert r.plan["tp"] * r.plan["pp"] * r.plan["cp"] * r.plan["dp"] == r.gpus


def test_public_report_columns_use_shipped_files_and_fit_nothing(public, public_rows):
    """In-sample = the shipped hardware files, whose figures are measured: nothing is fitted, so LOFO = in-sample;
    the attention_bwd_ratio refit is reported as a diagnostic only."""
    assert public.shipped == {"attention_bwd_ratio": {"h100-sxm": 0.87, "h200": 0.86, "h100-hbm2e-96gb": 0.87}}
    assert set(public.fitted_lofo) == {"Llama3.1-8B", "Llama3.1-70B", "Llama3.1-405B"}
    assert all(params == {} for params in public.fitted_lofo.values())
    assert set(public.fitted_all) == {"attention_bwd_ratio"} and public.fitted_all["attention_bwd_ratio"] in \
        ATTENTION_BWD_GRID
    by_id = {r.row_id: r for r in public.rows}
    for row_id in (89, 125, 60, 319, 346):  # 70B, 8B, 405B dgxc; torchtitan H100; H200
        r, c = by_id[row_id], case(public_rows, row_id)
        assert r.predicted_step_s == estimate_case(c).step_time_s == r.lofo_step_s
    c = case(public_rows, 89)
    assert with_attention_bwd_ratio(c, 0.5).hw.efficiency == replace(c.hw.efficiency, attention_bwd_ratio=0.5)
    assert step_with_attention_bwd_ratio(c, 0.5) > step_with_attention_bwd_ratio(c, 0.9)


# ----------------------------------------------------------------- public: the attention_bwd_ratio fit
@pytest.fixture(scope="module")
def cases(public_rows):
    out = []
    for row in public_rows.values():
        try:
            out.append(row_case(row))
        except RowSkipped:
            pass
    return out


def test_fit_rows_are_the_transformer_engine_h100_rows(cases):
    rows = attention_fit_rows(cases)
    assert {c.source_id for c in rows} == {"dgxc", "megatron_lm_examples_llama"}
    assert {c.gpu_type for c in rows} == {"H100"} and {c.job.trainer for c in rows} == {"megatron"}
    assert len(rows) == sum(c.source_id in ATTENTION_FIT_SOURCES for c in cases)


def test_grid():
    grid = ATTENTION_BWD_GRID
    assert len(grid) == 15 and grid[0] == 0.30 and grid[-1] == 1.00
    assert all(b - a == pytest.approx(0.05) for a, b in zip(grid, grid[1:]))


def test_fit_on_a_few_real_rows_returns_a_grid_value(cases):
    """The real cost model on six dgxc rows (two per family) and one torchtitan row (ignored by the fit)."""
    few = [c for c in cases if c.source_id == "dgxc" and c.plan.num_gpus <= 128]
    picked = [c for f in sorted({c.family for c in few}) for c in [c for c in few if c.family == f][:2]]
    picked.append(next(c for c in cases if c.job.trainer == "torchtitan"))
    ratio = fit_attention_bwd_ratio(picked)
    assert ratio in ATTENTION_BWD_GRID
    assert ratio == fit_attention_bwd_ratio(picked)  # deterministic


def fake_evaluate(truth: dict[str, float], log: list[tuple[str, str]] | None = None):
    """A stand-in cost model: a case's step time is published * (1 + |ratio - truth[family]|), so the MAPE is the
    mean |ratio - truth| and the fit is the row-weighted median of the truths; it records (source_id, family) of
    every case it is called on."""
    def evaluate(c, ratio):
        if log is not None:
            log.append((c.source_id, c.family))
        return c.published_step_s * (1 + abs(ratio - truth[c.family]))
    return evaluate


def test_fit_picks_the_minimizing_grid_value_and_ignores_other_rows(cases):
    log: list[tuple[str, str]] = []
    truth = {"Llama3.1-8B": 0.65, "Llama3.1-70B": 0.65, "Llama3.1-405B": 0.65}
    assert fit_attention_bwd_ratio(cases, fake_evaluate(truth, log)) == 0.65
    assert {s for s, _ in log} == {"dgxc", "megatron_lm_examples_llama"}  # torchtitan rows never evaluated
    # an off-grid optimum goes to the nearest grid value
    assert fit_attention_bwd_ratio(cases, fake_evaluate(dict.fromkeys(truth, 0.62))) == 0.60


def test_fit_ties_go_to_the_larger_value(cases):
    assert fit_attention_bwd_ratio(cases, lambda c, r: c.published_step_s) == 1.00
    assert fit_attention_bwd_ratio(cases, lambda c, r: c.published_step_s, grid=(0.5, 0.4)) == 0.5


def test_fit_without_fit_rows_is_an_error(cases):
    torchtitan = [c for c in cases if c.job.trainer == "torchtitan"]
    with pytest.raises(SpecError, match="attention_bwd_ratio"):
        fit_attention_bwd_ratio(torchtitan, lambda c, r: 1.0)


def test_lofo_fit_never_uses_the_held_out_family(cases):
    """Each family has its own best ratio under the fake model; the fit without a family never evaluates that
    family's rows, and its ratio predicts the held-out family (every one of its rows, torchtitan and H200 too).
    Fit rows: 31 8B, 37 70B, 39 405B, so the weighted median is 405B's truth unless 405B is held out."""
    truth = {"Llama3.1-8B": 0.35, "Llama3.1-70B": 0.60, "Llama3.1-405B": 0.90}
    log: list[tuple[str, str]] = []
    fit = attention_bwd_fit(fake_evaluate(truth))
    seen: dict[str, set[str]] = {}

    def recording_fit(train):
        held_out = ({c.family for c in cases} - {c.family for c in train}).pop()
        fitted = attention_bwd_fit(fake_evaluate(truth, log))(train)
        seen[held_out] = {f for _, f in log}
        log.clear()
        return fitted

    predictions, params = lofo_predictions(cases, recording_fit)
    assert set(seen) == set(truth) and all(family not in seen[family] for family in truth)
    assert params == {"Llama3.1-8B": {"attention_bwd_ratio": 0.90}, "Llama3.1-70B": {"attention_bwd_ratio": 0.90},
                      "Llama3.1-405B": {"attention_bwd_ratio": 0.60}}
    assert set(predictions) == {c.row_id for c in cases}
    for c in cases:
        ratio = params[c.family]["attention_bwd_ratio"]
        assert predictions[c.row_id] == pytest.approx(c.published_step_s * (1 + abs(ratio - truth[c.family])))
    assert fit(cases).params == {"attention_bwd_ratio": 0.60}  # all three: 68 rows at or below 0.60, 39 above


def test_lofo_refits_without_the_family(public):
    """Any fit hook sees every family once (reported only) and then every family but the one it predicts: a fit
    that scales the cost model by the training rows' mean published/predicted ratio gives different LOFO and
    in-sample errors."""
    seen: list[set[str]] = []

    def scale(train):
        seen.append({c.family for c in train})
        k = sum(c.published_step_s / estimate_case(c).step_time_s for c in train) / len(train)
        return Fitted(lambda c: k * estimate_case(c).step_time_s, {"scale": k})

    fitted = public_report(PUBLIC, fit=scale)
    families = {r.family for r in public.rows}
    assert families == {"Llama3.1-8B", "Llama3.1-70B", "Llama3.1-405B"}
    assert seen[0] == families and sorted(map(sorted, seen[1:])) == sorted(sorted(families - {f}) for f in families)
    assert fitted.overall.lofo_mape_pct != pytest.approx(fitted.overall.mape_pct)
    assert fitted.overall.mape_pct == public.overall.mape_pct  # in-sample: the shipped files, whatever the fit
    assert set(fitted.fitted_lofo) == families and set(fitted.fitted_all) == {"scale", "attention_bwd_ratio"}


def test_public_main_text_and_deterministic_json(capsys):
    assert main(["--set", "public"]) == 0
    out = capsys.readouterr().out
    assert "Nothing is fitted to these rows" in out and "h100-sxm-microbench" in out
    assert "Skipped rows (12)" in out
    assert re.search(r"^attention_bwd_ratio shipped \(measured\): h100-sxm 0\.87.*would choose \d\.\d\d \(diagnostic",
                     out, re.MULTILINE)
    assert "fitted without" not in out
    for key in RULE_KEYS:
        assert f"  {key} " in out
    assert main(["--set", "public", "--json"]) == 0
    first = capsys.readouterr().out
    assert main(["--set", "public", "--json"]) == 0
    assert capsys.readouterr().out == first
    doc = json.loads(first)["public"]
    assert {"overall", "subsets", "skipped", "rows", "rules", "fitted", "fitted_values"} <= doc.keys()
    assert set(doc["fitted_values"]["without_family"]) == {"Llama3.1-8B", "Llama3.1-70B", "Llama3.1-405B"}
    assert len(doc["rows"]) + len(doc["skipped"]) == 151
    assert {"row_id", "plan", "breakdown", "note", "lofo_error_pct", "fits"} <= doc["rows"][0].keys()


@pytest.mark.parametrize(("precision", "dtype"), [("fp8", "fp8"), ("FP8", "fp8"), ("mxfp8", "fp8"),
                                                  ("float8", "fp8"), ("bf16", "bf16"), ("fp16", "fp16")])
def test_precision_spellings_of_held_out_rows(public_rows, precision, dtype):
    """RULES 'dtype': any fp8/float8 recipe is costed as FP8 (B200 rows say MXFP8), fp16 as fp16 with 16-bit
    buffers of its own dtype; FP4 is skipped, with the reason, rather than costed as something else."""
    from autotune.reports.accuracy.rules import row_job

    job = row_job({**public_rows[86], "precision": precision}, "megatron")
    assert job.dtype == dtype and job.grad_reduce in ("fp32", "bf16" if dtype != "fp16" else "fp16")
    with pytest.raises(RowSkipped, match="FP4 is not costed"):
        row_job({**public_rows[86], "precision": "nvfp4"}, "megatron")


@pytest.mark.parametrize(("framework", "detail", "trainer", "zero"), [
    ("DeepSpeed 0.16", "ZeRO-2", "deepspeed", 2), ("Megatron-DeepSpeed", "", "megatron", 1),
    ("Colossal-AI 0.4", "zero stage 1", "colossalai", 1), ("DeepSpeed", "", "deepspeed", 0)])
def test_rows_of_other_trainers(public_rows, framework, detail, trainer, zero):
    """RULES 'trainer' and 'zero': a DeepSpeed or Colossal-AI row (held out: the public rows are NeMo, Megatron and
    torchtitan) is costed with that trainer's kernels, gradient buffers and the ZeRO stage the row names."""
    row = {**public_rows[327], "framework": framework, "source_id": "other", "fsdp": "no", "fsdp_detail": detail}
    c = row_case(row)
    assert (c.job.trainer, c.plan.zero) == (trainer, zero)
    assert c.job.grad_reduce == ("bf16" if trainer == "deepspeed" else "fp32")
    with pytest.raises(RowSkipped, match="MaxText"):
        row_case({**row, "framework": "MaxText"})


def test_each_megatron_row_runs_its_releases_loss_kernel():
    """RULES 'cross_entropy': NeMo 2.0 (and the Megatron-LM examples that follow it) the native fusion, NeMo 1.0's
    launcher unfused, Megatron-Bridge its model recipe's (Transformer Engine's for Llama 3, Qwen3, DeepSeek)."""
    from autotune.reports.accuracy.recipes import row_cross_entropy

    assert row_cross_entropy("dgxc", "NeMo 2.0 (NeMo-Run) / Megatron-Core", "Llama3.1-8B") == "native"
    assert row_cross_entropy("dgxc", "NeMo Launcher (NeMo 1.0, Hydra configs)", "Llama3.1-8B") == "unfused"
    assert row_cross_entropy("megatron_lm_examples_llama", "Megatron-Core", "Llama3-70B") == "native"
    bridge = "megatron_bridge_perf_summary"
    assert [row_cross_entropy(bridge, "Megatron-Bridge", m) for m in
            ("GPT-OSS-120B", "Qwen3-30B-A3B", "Qwen3-Next-80B", "DeepSeekV3", "Llama3.1-405B", "Nemotron-H")] == [
        "native", "te", "native", "te", "te", "native"]
