"""One-line plan names: every choice that tells two plans apart is named, expert parallelism included."""

from __future__ import annotations

from autotune.render.common import plan_brief, plan_line, plan_tag
from autotune.specs.plan import Plan

DENSE = Plan(tp=2, pp=2, dp=8, mbs=1, num_microbatches=8, zero=1, sequence_parallel=True, layers_per_stage=(16, 16))


def test_expert_layouts_are_named_where_they_exist() -> None:
    """Two MoE runners-up differing only in ep (or etp) read differently; dense plans say nothing of experts."""
    ep4, ep8 = (Plan(**{**DENSE.to_dict(), "layers_per_stage": (16, 16), "ep": ep, "etp": 1}) for ep in (4, 8))
    assert plan_brief(ep4) != plan_brief(ep8) and "ep 4 etp 1" in plan_brief(ep4)
    assert "ep4" in plan_tag(ep4) and "etp" not in plan_tag(ep4)
    assert "ep 8, etp 1" in plan_line(ep8)
    assert "ep" not in plan_brief(DENSE) and "ep" not in plan_tag(DENSE) and ", ep" not in plan_line(DENSE)
    assert "etp2" in plan_tag(Plan(**{**ep4.to_dict(), "layers_per_stage": (16, 16), "etp": 2}))


def test_a_small_bucket_reads_in_parameters():
    from autotune.render.common import bucket_words
    assert (bucket_words(40_000_000), bucket_words(1), bucket_words(500_000)) == ("40M params", "1 params",
                                                                                    "500,000 params")


def test_an_mfu_above_100_percent_says_why():
    """MFU counts causal attention in full (CLI.md), so at a million tokens on a fast attention kernel it passes
    100% (user-tester: 108.7%); a warning says why, and below 100% nothing is said."""
    from dataclasses import replace as swap

    from autotune.catalog import load_hardware, load_model
    from autotune.costmodel.estimate import CostModel
    from autotune.render.common import mfu_warnings
    from autotune.specs.job import JobSpec
    from autotune.specs.plan import Plan

    hw = load_hardware("h100-sxm")
    fast = swap(hw, efficiency=swap(hw.efficiency, attention=0.75))
    plan = Plan(tp=4, pp=1, dp=1, cp=16, mbs=1, num_microbatches=1, recompute="full", recompute_layers=4, zero=3,
                sequence_parallel=True, layers_per_stage=(32,))
    est = CostModel(load_model("llama3-8b"), fast, JobSpec(global_batch=1, seq_len=1 << 20)).estimate(plan)
    assert est.mfu > 1.0
    assert mfu_warnings(est)[0].startswith(f"MFU {100 * est.mfu:.1f}% is above 100%: model FLOPs count causal")
    short = CostModel(load_model("llama3-8b"), hw, JobSpec(global_batch=8, seq_len=8192)).estimate(
        swap(plan, cp=1, dp=8, tp=8, num_microbatches=1, mbs=1, recompute="none", recompute_layers=None))
    assert short.mfu < 1.0 and mfu_warnings(short) == []
