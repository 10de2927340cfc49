"""A step that runs its pipeline schedule several times: torchtitan's gradient accumulation with a pipeline.

torchtitan (0.3.0 trainer.py, `train_step`) runs `gradient_accumulation_steps = global_batch_size /
(local_batch_size x data-parallel degree)` forward-backward calls a step; with a pipeline each call is the whole
schedule over local_batch_size / pipeline_parallel_microbatch_size micro-batches, warm-up and cool-down
included, so a step pays one bubble per call. The optimizer steps once. autotune's own configs never do this
(they put every micro-batch in one schedule); `check` costs the configs that do.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.costmodel.estimate import CostModel, Estimate
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan


def one_flush(plan: Plan, job: JobSpec, flushes: int) -> tuple[Plan, JobSpec]:
    """The plan and job of one of a step's `flushes` runs of the schedule: its share of the micro-batches and of
    the global batch (what `accumulated` takes the estimate of)."""
    return (replace(plan, num_microbatches=plan.num_microbatches // flushes),
            replace(job, global_batch=job.global_batch // flushes))


def accumulated(flush: Estimate, flushes: int, plan: Plan) -> Estimate:
    """The step of `flushes` runs of `flush`'s schedule (each with its own bubble and data-parallel sync, as
    torchtitan's FSDP reduces each call's gradients) and one optimizer step, as the estimate of `plan` (the same
    plan with all the step's micro-batches). Throughput and MFU follow: the work is `flushes` times the flush's."""
    if flushes == 1:
        return replace(flush, plan=plan)
    b = flush.breakdown
    step = flushes * flush.step_time_s - (flushes - 1) * b.optimizer_s
    ratio = flushes * flush.step_time_s / step  # the step's work over the flush's, per second
    return replace(
        flush, plan=plan, step_time_s=step, tokens_per_s=flush.tokens_per_s * ratio,
        model_tflops_per_gpu=flush.model_tflops_per_gpu * ratio, mfu=flush.mfu * ratio,
        breakdown=replace(b, **{k: v * flushes for k, v in b.as_dict().items() if k != "optimizer_s"}),
        op_seconds=tuple((name, flushes * s) for name, s in flush.op_seconds))


def flushed_estimate(model: ModelSpec, hw: HardwareSpec, job: JobSpec, measured, plan: Plan, flushes: int) -> Estimate:
    """The estimate of `plan` run as `flushes` runs of its schedule a step (check's torchtitan configs, and estimate
    --plan of check's document); with 1, the plan's own estimate."""
    if flushes == 1:
        return CostModel(model, hw, job, measured).estimate(plan)
    flush, flush_job = one_flush(plan, job, flushes)
    return accumulated(CostModel(model, hw, flush_job, measured).estimate(flush), flushes, plan)
