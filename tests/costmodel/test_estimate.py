"""The whole step assembled from its terms, checked against hand assembly on tiny plans."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.costmodel import comm, memory
from autotune.costmodel.estimate import ADAM_STEP_BYTES, CostModel, tied_embedding_sync
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, check_plan, even_split

from ._helpers import gpt_model, toy_hardware

MODEL = gpt_model(hidden=1024, heads=16, layers=8, vocab=32000)
HW = toy_hardware()
JOB = JobSpec(global_batch=16, seq_len=1024)


def _plan(**kw) -> Plan:
    base = dict(tp=1, pp=1, dp=1, mbs=1, num_microbatches=16, layers_per_stage=(8,))
    base.update(kw)
    plan = Plan(**base)
    check_plan(plan, MODEL, JOB, plan.num_gpus, HW.gpus_per_node)
    return plan


PLANS = [
    _plan(),
    _plan(recompute="full", mbs=2, num_microbatches=8),
    _plan(tp=2, sequence_parallel=True, recompute="selective"),
    _plan(pp=2, layers_per_stage=(4, 4)),
    _plan(pp=4, layers_per_stage=(2, 2, 2, 2), schedule="interleaved", vpp=2),
    _plan(dp=4, num_microbatches=4, zero=1),
    _plan(tp=2, pp=2, dp=4, num_microbatches=4, layers_per_stage=(4, 4), zero=1),
    _plan(dp=16, num_microbatches=1, zero=3),
]


@pytest.mark.parametrize("plan", PLANS, ids=range(len(PLANS)))
def test_breakdown_adds_up_to_the_step_time(plan):
    """The breakdown is additive (as `autotune estimate` explains it term by term)."""
    est = CostModel(MODEL, HW, JOB).estimate(plan)
    assert sum(est.breakdown.as_dict().values()) == pytest.approx(est.step_time_s, rel=1e-12)
    assert est.tokens_per_s * est.step_time_s == pytest.approx(JOB.tokens_per_step)
    flops = 72 * 16 * 1024 * 8 * 1024**2 * (1 + 1024 / (6 * 1024) + 32000 / (12 * 8 * 1024))
    assert est.model_tflops_per_gpu * 1e12 * est.step_time_s * plan.num_gpus == pytest.approx(flops)
    assert est.mfu == pytest.approx(est.model_tflops_per_gpu * 1e12 / HW.peak_flops_bf16)


def test_one_gpu_is_microbatches_times_the_layers_plus_the_optimizer():
    """No parallelism: m * (L * layer + embedding + head) + Adam over every parameter."""
    plan = _plan(recompute="selective")
    cm = CostModel(MODEL, HW, JOB)
    layer, vocab = cm.layer(1, 1, 1, False), cm.vocab(1, 1, 1, False)
    per_mb = 8 * layer.time("selective") + vocab.embed_time + vocab.head_time
    opt = memory.total_params(MODEL) * ADAM_STEP_BYTES / (HW.hbm_bandwidth * HW.efficiency.memory)
    est = cm.estimate(plan)
    assert est.step_time_s == pytest.approx(16 * per_mb + opt)
    assert est.breakdown.bubble_s == pytest.approx(0.0, abs=1e-12)
    assert est.breakdown.dp_comm_exposed_s == 0.0
    assert est.stages[0].params == memory.total_params(MODEL)


@pytest.mark.parametrize("model", [
    gpt_model(hidden=1024, heads=16, layers=8, vocab=32000, position_embedding="rope", max_position_embeddings=0),
    MODEL,  # learned positions: only the word embedding is all-reduced, not the position table
], ids=["rope", "learned-positions"])
def test_two_stages_add_the_bubble_and_the_tied_embedding_sync(model):
    """pp = 2: 1F1B time of the two stage times, plus the all-reduce of the tied word embedding's fp32
    gradient (V*h/tp parameters) between the first and last stage (Megatron-LM's finalize_model_grads),
    plus Adam on the larger stage."""
    plan = _plan(pp=2, layers_per_stage=(4, 4))
    cm = CostModel(model, HW, JOB)
    est = cm.estimate(plan)
    times = [s.time_s for s in est.stages]
    tied = comm.all_reduce(model.vocab_size * model.hidden_size * 4, 2, comm.group_link(HW, 2, 1))
    opt = max(s.params for s in est.stages) * ADAM_STEP_BYTES / (HW.hbm_bandwidth * HW.efficiency.memory)
    assert times[1] > times[0]  # the head stage is slowest, where 1F1B takes (m-1)*max(t) + sum(t)
    assert est.step_time_s == pytest.approx(15 * max(times) + sum(times) + tied + opt, rel=1e-9)
    assert est.breakdown.bubble_s == pytest.approx(sum(times) - max(times))
    assert est.stages[1].has_head and est.stages[0].has_embedding
    assert est.bottleneck == 1  # the LM head stage


def test_data_parallel_gradient_reduction_is_bucketed_behind_the_last_backward():
    """pp = 1, ZeRO 0: the fp32 gradients are all-reduced in buckets while the last micro-batch's backward
    runs (Megatron's overlap_grad_reduce); what does not fit behind it is exposed."""
    plan = _plan(dp=4, num_microbatches=4, bucket_size=2_000_000)
    est = CostModel(MODEL, HW, JOB).estimate(plan)
    stage = est.stages[0]
    link = comm.group_link(HW, 4, 1)
    want = comm.bucketed_exposure(stage.params * 4, 2_000_000 * 4, stage.bwd_s,
                                  lambda size: comm.all_reduce(size, 4, link))
    assert est.breakdown.dp_comm_exposed_s == pytest.approx(want)
    assert want > 0


def test_a_bucket_holds_at_least_a_whole_weight_matrix():
    """Megatron's DDP and DeepSpeed fill buckets with whole tensors: a bucket below the smallest weight matrix
    (here the 1024 x 1024 output projection, 1,048,576 parameters) runs as that matrix, not as one collective per
    bucket's worth of parameters (a DeepSpeed reduce_bucket_size of 1 was 10^9 collectives, user-tester)."""
    assert memory.whole_tensor_bucket(MODEL, 1) == 1024 * 1024 and memory.whole_tensor_bucket(MODEL, 2) == 512 * 1024
    cm = CostModel(MODEL, HW, JOB)
    tiny, floor = (cm.estimate(_plan(dp=4, num_microbatches=4, bucket_size=b)) for b in (1, 1024 * 1024))
    assert tiny.breakdown.dp_comm_exposed_s == floor.breakdown.dp_comm_exposed_s > 0
    assert tiny.step_time_s == floor.step_time_s


def test_a_reduction_after_the_backward_is_exposed_whole():
    """overlap_grad_reduce False (Megatron-LM's LocalDDP of 2021), by hand: pp 1, ZeRO 0, fp16 buffers: one
    all-reduce of the whole 2-byte buffer after the backward, nothing hidden; with pp 2 stage 1 ends its backward
    bwd_0 before stage 0 does, so max(ar_0, ar_1 - bwd_0) is exposed."""
    job = JobSpec(global_batch=16, seq_len=1024, dtype="fp16", grad_reduce="fp16", overlap_grad_reduce=False)
    flat = CostModel(MODEL, HW, job).estimate(_plan(dp=4, num_microbatches=4))
    link = comm.group_link(HW, 4, 1)
    assert flat.breakdown.dp_comm_exposed_s == pytest.approx(comm.all_reduce(flat.stages[0].params * 2, 4, link))
    plan = _plan(pp=2, dp=2, num_microbatches=8, layers_per_stage=(4, 4))
    piped = CostModel(MODEL, HW, job).estimate(plan)
    link, (s0, s1) = comm.group_link(HW, 2, 1), piped.stages
    tied = tied_embedding_sync(plan, HW, MODEL, 2)  # the tied embedding's gradient, between the two stages
    want = tied + max(comm.all_reduce(s0.params * 2, 2, link), comm.all_reduce(s1.params * 2, 2, link) - s0.bwd_s)
    assert piped.breakdown.dp_comm_exposed_s == pytest.approx(want)
    overlapped = CostModel(MODEL, HW, JobSpec(global_batch=16, seq_len=1024, dtype="fp16", grad_reduce="fp16"))
    assert overlapped.estimate(_plan(dp=4, num_microbatches=4)).breakdown.dp_comm_exposed_s < \
        flat.breakdown.dp_comm_exposed_s


@pytest.mark.parametrize(("trainer", "pp", "zero", "after"),
                         [("deepspeed", 1, 0, True), ("deepspeed", 1, 1, False), ("deepspeed", 2, 0, True),
                          ("deepspeed", 2, 1, True), ("colossalai", 1, 0, False), ("colossalai", 2, 0, True)])
def test_trainers_that_reduce_after_the_backward(trainer, pp, zero, after):
    """DeepSpeed 0.19's pipeline engine reduces once its schedule has run, and without ZeRO its engine all-reduces
    once loss.backward() returns; Colossal-AI's legacy engine all-reduces in engine.step() with a pipeline, through
    DDP without one (overlap.overlaps_grad_reduce): the exposure is then the one of overlap_grad_reduce False;
    DeepSpeed's ZeRO-1 without a pipeline reduces in its backward hooks (overlap_comm) and gathers the updated
    weights in its step (overlap.gathers_params_in_step), as Megatron without --overlap-param-gather."""
    ds = JobSpec(global_batch=16, seq_len=1024, trainer=trainer, grad_reduce="bf16")
    plan = _plan(pp=pp, dp=4 // pp, zero=zero, num_microbatches=4 * pp, layers_per_stage=even_split(8, pp))
    got = CostModel(MODEL, HW, ds).estimate(plan).breakdown.dp_comm_exposed_s
    unoverlapped = CostModel(MODEL, HW, replace(ds, overlap_grad_reduce=False)).estimate(plan)
    overlapped = CostModel(MODEL, HW, replace(ds, trainer="megatron", overlap_param_gather=False)).estimate(plan)
    want = unoverlapped if after else overlapped
    assert got == want.breakdown.dp_comm_exposed_s
    assert overlapped.breakdown.dp_comm_exposed_s < unoverlapped.breakdown.dp_comm_exposed_s


@pytest.mark.parametrize("pp", [2, 4])
def test_1f1b_stage_memory_holds_p_minus_i_microbatches(pp):
    """Narayanan et al. 2021: under 1F1B stage i keeps p - i micro-batches of activations."""
    plan = _plan(pp=pp, layers_per_stage=even_split(8, pp))
    cm = CostModel(MODEL, HW, JOB)
    est = cm.estimate(plan)
    per_layer = cm.layer(1, 1, 1, False).act.none
    for i, stage in enumerate(est.stages):
        assert stage.memory.activations == (pp - i) * stage.layers * per_layer


def test_zero1_shards_the_optimizer_states_over_dp():
    """ZeRO-1 / Megatron's distributed optimizer: 12 bytes/param of fp32 master weights and Adam moments are
    split over the dp ranks; weights (2) and fp32 gradients (4) stay whole."""
    cm = CostModel(MODEL, HW, JOB)
    plain = cm.estimate(_plan(dp=4, num_microbatches=4)).stages[0]
    zero1 = cm.estimate(_plan(dp=4, num_microbatches=4, zero=1)).stages[0]
    assert plain.memory.optimizer == 12 * plain.params
    assert zero1.memory.optimizer == pytest.approx(12 * plain.params / 4, abs=64)
    assert zero1.memory.weights == plain.memory.weights == 2 * plain.params
    assert zero1.memory.gradients == plain.memory.gradients == 4 * plain.params


def test_fits_compares_the_peak_stage_with_usable_memory():
    from dataclasses import replace

    est = CostModel(MODEL, HW, JOB).estimate(_plan())
    assert est.fits
    peak = est.peak_memory_bytes
    tight = replace(HW, memory_bytes=peak + HW.memory_reserve_bytes)
    assert CostModel(MODEL, tight, JOB).estimate(_plan()).fits
    short = replace(HW, memory_bytes=peak + HW.memory_reserve_bytes - 1)
    assert not CostModel(MODEL, short, JOB).estimate(_plan()).fits


def test_megatrons_interleaved_schedule_waits_only_on_warm_up_and_cool_down_sends():
    """overlap_p2p_comm: the steady state's sends run beside the passes, so each pass carries the warmed-up
    share of its hop (pp 4, vpp 2, 16 micro-batches: rank 0 warms up 2*3 + 4 = 10 of 32 forwards)."""
    plan = _plan(pp=4, layers_per_stage=(2, 2, 2, 2), schedule="interleaved", vpp=2)
    overlapped = CostModel(MODEL, HW, JOB).estimate(plan)
    blocking = CostModel(MODEL, HW, replace(JOB, overlap_p2p=False)).estimate(plan)
    assert overlapped.p2p_exposed == 10 / 32 and blocking.p2p_exposed == 1.0
    assert blocking.breakdown.pp_comm_s > 0
    assert overlapped.breakdown.pp_comm_s == pytest.approx(10 / 32 * blocking.breakdown.pp_comm_s, rel=1e-12)
    assert overlapped.step_time_s < blocking.step_time_s


def test_zero1_weights_gathered_in_the_step_are_exposed_whole():
    """DeepSpeed's ZeRO-1/2 and Megatron without --overlap-param-gather all-gather the updated weights inside the
    optimizer step: on one stage the exposure is the bucketed reduction plus the whole buffer's all-gather, where
    Megatron's overlapped gather hides its buckets behind the next forward."""
    plan = _plan(dp=4, num_microbatches=4, zero=1)
    job = JobSpec(global_batch=16, seq_len=1024)
    hidden = CostModel(MODEL, HW, job).estimate(plan)
    in_step = CostModel(MODEL, HW, replace(job, overlap_param_gather=False)).estimate(plan)
    deepspeed = CostModel(MODEL, HW, replace(job, trainer="deepspeed")).estimate(plan)
    stage, link = in_step.stages[0], comm.group_link(HW, 4, 1)
    reduce = comm.bucketed_exposure(stage.params * job.grad_bytes, plan.bucket_size * job.grad_bytes, stage.bwd_s,
                                    lambda b: comm.reduce_scatter(b, 4, link))
    gather = comm.all_gather(stage.params * 2, 4, link)
    assert in_step.breakdown.dp_comm_exposed_s == pytest.approx(reduce + gather)
    assert hidden.breakdown.dp_comm_exposed_s < in_step.breakdown.dp_comm_exposed_s
    assert deepspeed.breakdown.dp_comm_exposed_s > hidden.breakdown.dp_comm_exposed_s


def test_weak_scaling_to_thousands_of_data_parallel_ranks_stays_flat_with_megatrons_bucket():
    """Llama 3.1 8B as NeMo runs it (tp1 pp1 cp2, distributed optimizer, 16 sequences per data-parallel rank) on 8 to
    4096 H100s: with Megatron's own bucket, max(40M, 1M x dp), the number of collectives stays bounded, so only
    the per-collective latency (log over nodes for trees, one network hop per node for rings) and the last bucket
    grow, and the step stays within 5% of 8 GPUs'. With a fixed 40M bucket the ~200 reduce-scatters and all-gathers
    each pay a ring over 1024 nodes: the exposed sync then grows with dp (what the issue saw on held-out series)."""
    from autotune.catalog import load_hardware, load_model
    from autotune.specs.plan import default_bucket

    model, hw = load_model("llama3.1-8b"), load_hardware("h100-sxm")
    steps, fixed = [], []
    for gpus in (8, 64, 512, 4096):
        dp = gpus // 2
        job = JobSpec(global_batch=8 * gpus, seq_len=8192)
        plan = Plan(tp=1, pp=1, dp=dp, cp=2, mbs=1, num_microbatches=16, zero=1, layers_per_stage=(32,),
                    bucket_size=default_bucket("megatron", dp))
        cm = CostModel(model, hw, job)
        steps.append(cm.estimate(plan).step_time_s)
        fixed.append(cm.estimate(replace(plan, bucket_size=40_000_000)).step_time_s)
    assert all(abs(s / steps[0] - 1) < 0.05 for s in steps), steps
    assert fixed[-1] > 1.5 * fixed[0], fixed


def test_the_bucket_floor_reaches_mla_and_expert_matrices():
    """The floor is the smallest weight matrix of a block on a GPU: DeepSeek-V3's key/value down-projection (7168 x
    (512 + 64)), not its attention output (reviewer: 132M took the emitted bucket off Megatron's 40M)."""
    from autotune.catalog import load_model
    assert memory.whole_tensor_bucket(load_model("deepseek-v3"), 1) == 7168 * 576
    assert memory.whole_tensor_bucket(load_model("gpt-oss-120b"), 1) == 2880 * 2880  # an expert's matrix
    assert memory.whole_tensor_bucket(load_model("llama3-8b"), 2) == 4096 * 4096 // 2
