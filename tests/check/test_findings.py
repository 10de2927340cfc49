"""check's verdicts from an estimate: out-of-memory stages grouped by the term to cut, one line each."""

from __future__ import annotations

from autotune.catalog import load_hardware, load_model
from autotune.check.findings import EXIT_OOM, _ranges, memory_findings
from autotune.costmodel.estimate import CostModel
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, even_split
from autotune.units import gib

CM = CostModel(load_model("llama3-70b"), load_hardware("h100-sxm"), JobSpec(global_batch=64, seq_len=4096))


def test_a_pipeline_out_of_memory_everywhere_is_one_line_naming_the_worst_stage() -> None:
    """70B on 8 stages without tensor parallelism or ZeRO: ~140 GB of weights and Adam state per stage, 8 stages
    over, all bound by the optimizer states: one finding, naming the largest stage."""
    est = CM.estimate(Plan(tp=1, pp=8, dp=1, mbs=1, num_microbatches=64, layers_per_stage=even_split(80, 8)))
    (finding,) = memory_findings(est)
    worst = max(est.stages, key=lambda s: s.memory.total)
    assert finding.exit_code == EXIT_OOM and finding.message.startswith("stages 0-7 are predicted out of memory")
    assert f"up to {gib(worst.memory.total):.2f} GiB (stage {worst.index})" in finding.message
    assert "binding term: optimizer states up to" in finding.message


def test_one_stage_out_of_memory_is_named_alone() -> None:
    """78 of 80 layers on stage 0 (tp 8: ~8.5B parameters, ~136 GB with Adam) and 2 on stage 1."""
    est = CM.estimate(Plan(tp=8, pp=2, dp=1, mbs=1, num_microbatches=64, layers_per_stage=(78, 2)))
    (finding,) = memory_findings(est)
    assert finding.message.startswith(f"stage 0 is predicted out of memory: {gib(est.stages[0].memory.total):.2f} GiB")
    assert est.stages[1].memory.total <= est.usable_memory_bytes


def test_stage_ranges() -> None:
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert _ranges([3]) == "3"
