"""The accuracy report against Megatron-LM's published weak-scaling table (Narayanan et al. 2021, Table 1)."""

from __future__ import annotations

import json

import pytest

from autotune import accuracy

DATA = accuracy.DEFAULT_DATA


@pytest.fixture(scope="module")
def report():
    return accuracy.accuracy_report(DATA)


def test_published_step_time_of_the_first_row_by_hand():
    """gpt-1.7b: B=512, s=2048, l=24, h=2304, V=51200, 137 TFLOP/s on 32 GPUs (Table 1), F from the appendix."""
    row = accuracy.read_rows(DATA)[0]
    assert row["name"] == "gpt-1.7b"
    flops = 96 * 512 * 2048 * 24 * 2304**2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    assert accuracy.published_step_time(row) == pytest.approx(flops / (137e12 * 32))


def test_report_has_ten_rows_with_positive_predictions(report):
    assert len(report.rows) == 10
    for r in report.rows:
        assert r.predicted_step_s > 0 and r.published_step_s > 0
        assert r.fits
        assert r.tp * r.pp * r.dp == r.gpus
        assert r.schedule == "1f1b" or (r.pp > 2 and r.vpp in (2, 4))
        assert sum(r.breakdown.values()) == pytest.approx(r.predicted_step_s)
    assert report.mape_pct == pytest.approx(sum(abs(r.error_pct) for r in report.rows) / 10)


def test_mape_is_under_10_percent(report):
    """Measured 9.0% (every row under-predicted, mean signed error -9.0%) when this test was written."""
    assert report.mape_pct < 10


def test_main_prints_a_table_and_json(capsys):
    assert accuracy.main(["--data", str(DATA)]) == 0
    out = capsys.readouterr().out
    assert "gpt-1008b" in out and "MAPE" in out
    assert accuracy.main(["--data", str(DATA), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["rows"]) == 10 and doc["mape_pct"] > 0
    assert {"name", "published_step_s", "predicted_step_s", "error_pct", "mbs", "vpp"} <= doc["rows"][0].keys()


def test_main_reports_a_missing_file(capsys, tmp_path):
    assert accuracy.main(["--data", str(tmp_path / "none.csv")]) == 1
    assert "cannot read" in capsys.readouterr().err
