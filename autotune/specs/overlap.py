"""When each trainer's data-parallel and pipeline communication overlaps its compute, and when it waits: the
rules the cost model (costmodel/estimate.py, stages.py, schedules.py) and the planner's partition model
(search/tables.py, bounds.py) share, each from the trainer's own source.
"""

from __future__ import annotations

from autotune.specs.job import JobSpec


def overlaps_grad_reduce(job: JobSpec, pp: int, zero: int) -> bool:
    """Whether the data-parallel gradient reduction runs during the backward, bucket by bucket (Megatron's
    overlap_grad_reduce, FSDP2's per-block reduce-scatter, DeepSpeed's ZeRO-1/2 hooks with overlap_comm, PyTorch
    DDP under Colossal-AI), rather than after it in one pass (estimate.dp_sync_exposed's _unoverlapped).
    DeepSpeed 0.19 reduces after the backward in two cases: its pipeline engine turns the engine's backward
    all-reduce off and reduces once the whole schedule has run (runtime/pipe/engine.py: enable_backward_allreduce
    False, _exec_reduce_grads), and without ZeRO its engine all-reduces the gradients once loss.backward() returns
    (engine.py allreduce_gradients -> buffered_allreduce_fallback). Colossal-AI's legacy engine wraps the model in
    DDP only without a pipeline; with one it adds DataParallelGradientHandler, which all-reduces in engine.step()
    (0.3.6 legacy/initialize.py, legacy/engine/_base_engine.py). job.overlap_grad_reduce False (Megatron-LM's
    LocalDDP of 2021) never overlaps."""
    if (job.trainer == "deepspeed" and (pp > 1 or zero == 0)) or (job.trainer == "colossalai" and pp > 1):
        return False
    return job.overlap_grad_reduce


def gathers_params_in_step(job: JobSpec, zero: int) -> bool:
    """Whether ZeRO-1/2's all-gather of the updated 16-bit weights runs inside the optimizer step, where nothing
    hides it, rather than bucket by bucket behind the next forward: DeepSpeed's (0.19 runtime/zero/
    stage_1_and_2.py step: all_gather_dp_groups after the update), Colossal-AI's (0.3.6 zero/low_level/
    low_level_optim.py step: dist.all_gather) and Megatron's distributed optimizer without --overlap-param-gather
    (megatron-core 0.16 optimizer/distrib_optimizer.py; its ZeRO-2, Megatron-FSDP, prefetches its own gathers)."""
    if zero not in (1, 2):
        return False
    return job.trainer in ("deepspeed", "colossalai") or (zero == 1 and not job.overlap_param_gather)


def reduces_inline(job: JobSpec, pp: int, zero: int) -> bool:
    """Whether ZeRO-2's per-micro-batch reduce-scatters run on the compute stream, stalling the backward: DeepSpeed
    without overlap_comm (stage_1_and_2.py reduce_ipg_grads on the current stream; stages.zero3_exposed)."""
    return job.trainer == "deepspeed" and zero == 2 and not overlaps_grad_reduce(job, pp, zero)


def overlaps_p2p(job: JobSpec, schedule: str, vpp: int) -> bool:
    """Whether the interleaved schedule's steady-state sends and receives run beside the passes. Megatron's does
    (megatron-core's forward_backward_pipelining_with_interleaving with overlap_p2p_comm, JobSpec.overlap_p2p; its
    1F1B without interleaving forces overlap_p2p_comm off, Megatron-LM validate_args), and so does torchtitan's
    Interleaved1F1B, which runs on torch's _PipelineScheduleRuntime: it never waits on a send until the step ends
    and posts each receive as soon as the sending pass is scheduled (torch 2.13 distributed/pipelining/
    schedules.py, _add_send_recv), so charging it Megatron's blocking warm-up (schedules.exposed_p2p_share) errs
    on the slow side. torchtitan's 1F1B (Schedule1F1B) and DeepSpeed's and Colossal-AI's pipeline engines wait
    on each send and receive."""
    if schedule != "interleaved" or vpp <= 1:
        return False
    return (job.trainer == "megatron" and job.overlap_p2p) or job.trainer == "torchtitan"
