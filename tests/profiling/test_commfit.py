"""The alpha-beta fit (numpy only): exact on points made by costmodel/comm.py's own formulas."""

from __future__ import annotations

import pytest

from autotune.costmodel import comm
from autotune.errors import SpecError
from autotune.profiling.comm import fit_alpha_beta, fit_tier

ALPHA, BW = 20e-6, 5e9
LINK = comm.Link(bandwidth=BW, latency=ALPHA)
MODEL = {"all_reduce": comm.all_reduce, "all_gather": comm.all_gather, "reduce_scatter": comm.reduce_scatter,
         "p2p": lambda x, n, link: comm.p2p(x, link)}


def synthetic(n: int) -> list[dict]:
    return [{"collective": c, "bytes": float(2**k), "seconds": f(2**k, n, LINK), "stdev_seconds": 0.0, "repeats": 1}
            for c, f in MODEL.items() for k in range(12, 27, 2)]


@pytest.mark.parametrize("n", [2, 8])
def test_fit_recovers_alpha_and_bandwidth_from_the_cost_models_formulas(n):
    """n=8: the all-reduce is the tree piece for small sizes and the ring for large ones (NCCL's choice)."""
    alpha, bw, err = fit_alpha_beta(synthetic(n), n)
    assert alpha == pytest.approx(ALPHA, rel=1e-9) and bw == pytest.approx(BW, rel=1e-9)
    assert abs(err).max() < 1e-9


def test_fit_tier_reports_each_collective_and_each_point():
    tier = fit_tier({"nproc": 2, "backend": "gloo", "points": synthetic(2)})
    assert tier.alpha_us == pytest.approx(20.0) and tier.bandwidth_GBps == pytest.approx(5.0)
    assert set(tier.collectives) == set(MODEL) and len(tier.points) == len(synthetic(2))
    assert tier.max_error_pct < 1e-6


def test_a_fit_without_latency_is_refused():
    points = [{"collective": "p2p", "bytes": float(2**k), "seconds": 2.0**k / BW - 1e-5, "stdev_seconds": 0.0,
               "repeats": 1} for k in range(16, 24)]
    with pytest.raises(SpecError, match="both must be > 0"):
        fit_alpha_beta(points, 2)
