"""The terms that bring estimates to published H100 runs, each pinned to an independent source: NVIDIA's
tile/wave quantization arithmetic, the FlashAttention-3 paper's H100 chart, Megatron's distributed-optimizer
byte table, Transformer Engine's FP8 and context-parallel kernels, torchtitan's SAC policy, and hand
calculations of the overlap formulas."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.costmodel import comm
from autotune.costmodel.compute import (ATTENTION_BWD_LENGTH_SCALE, attention_length_scale, gemm_wave_efficiency,
                                        op_time)
from autotune.costmodel.estimate import CostModel
from autotune.costmodel.layer import layer_cost, layer_shape
from autotune.costmodel.memory import layer_activations, state_bytes_per_param
from autotune.costmodel.ops import Op, backward_ops, layer_forward_ops
from autotune.costmodel.comm import comm_interference
from autotune.costmodel.stages import zero3_exposed
from autotune.errors import SpecError
from autotune.specs.job import JobSpec, StateBytes
from autotune.specs.plan import Plan, even_split

from ._helpers import gpt_model, toy_hardware

HW = replace(toy_hardware(), sm_count=100)
LLAMA = replace(gpt_model(hidden=1024, heads=16, layers=4), activation="swiglu", norm="rmsnorm", bias="none",
                dropout=False, tied_embeddings=False, position_embedding="rope", max_position_embeddings=0,
                num_kv_heads=4, ffn_hidden_size=2816)


# ----------------------------------------------------------------------------------------- GEMM quantization
def test_wave_efficiency_of_the_8192_cube_on_132_sms():
    """NVIDIA, "Matrix Multiplication Background": 8192 x 8192 in 128 x 256 tiles is 64 x 32 = 2048 tiles, which
    132 SMs run in ceil(2048/132) = 16 waves: 2048 / (16 x 132) = 0.970 of the tile slots do work."""
    assert gemm_wave_efficiency(8192, 8192, 132) == pytest.approx(2048 / (16 * 132))


def test_one_tile_more_than_the_sms_costs_a_whole_wave():
    assert gemm_wave_efficiency(128, 256 * 100, 100) == 1.0
    assert gemm_wave_efficiency(128, 256 * 101, 100) == pytest.approx(101 / 200)


def test_partial_tiles_waste_their_empty_part():
    """m = 64 fills half of a 128-row tile."""
    assert gemm_wave_efficiency(64, 256, 1) == pytest.approx(0.5)
    assert gemm_wave_efficiency(64, 256, 0) == 1.0  # no SM count: no quantization


# ----------------------------------------------------------------------------------------- attention kernels
@pytest.mark.parametrize(("seq", "scale"), [(512, 0.60), (1024, 0.83), (2048, 0.93), (16384, 1.0)])
def test_attention_speed_by_length_follows_the_h100_measurement(seq, scale):
    """profiles/measured/h100-sxm-microbench.json, head dim 128, forward relative to 4k-32k tokens, mean of
    cuDNN and FlashAttention-2: cuDNN 364/578 and FA2 189/336 at 512 (0.60), 478/578 and 276/336 at 1k (0.83),
    560/578 and 299/336 at 2k (0.93); tests/test_efficiency_report.py recomputes them from the file."""
    assert attention_length_scale(seq) == pytest.approx(scale)


def test_attention_backward_loses_more_at_short_queries():
    assert attention_length_scale(2048, ATTENTION_BWD_LENGTH_SCALE) == pytest.approx(0.77)
    assert attention_length_scale(1448.15, ATTENTION_BWD_LENGTH_SCALE) == pytest.approx((0.58 + 0.77) / 2, abs=1e-4)
    assert attention_length_scale(65536, ATTENTION_BWD_LENGTH_SCALE) == 1.0


def test_backward_attention_and_sdpa_use_their_own_efficiencies():
    eff = replace(HW.efficiency, attention=0.6, attention_sdpa=0.3, attention_bwd_ratio=0.5)
    hw = replace(HW, efficiency=eff, kernel_overhead_s=0.0)
    fwd = Op("flash_attention", "attention", 1e12, 1.0, "attention", (4096, 0.0))
    bwd = Op("flash_attention_bwd", "attention", 1e12, 1.0, "attention", (8192, 1.0))
    assert op_time(fwd, hw, "bf16") == pytest.approx(1e12 / (1e14 * 0.6))
    assert op_time(bwd, hw, "bf16") == pytest.approx(1e12 / (1e14 * 0.3))
    assert op_time(fwd, hw, "bf16", "sdpa") == pytest.approx(1e12 / (1e14 * 0.3))


def test_sdpa_cudnn_runs_the_fused_attention_figure_and_pytorchs_other_kernels():
    """"sdpa_cudnn" (torchtitan's own attention: SDPA asked for cuDNN first) prices attention at the cuDNN figure
    Transformer Engine's fused attention has, and GEMMs and memory-bound kernels at PyTorch's, by hand."""
    eff = replace(HW.efficiency, attention=0.6, attention_sdpa=0.3, gemm_torch=0.35, memory_torch=0.4)
    hw = replace(HW, efficiency=eff, kernel_overhead_s=0.0)
    fwd = Op("flash_attention", "attention", 1e12, 1.0, "attention", (4096, 0.0))
    add = Op("add", "elementwise", 0.0, 8e8, "memory")
    assert op_time(fwd, hw, "bf16", "sdpa_cudnn") == pytest.approx(1e12 / (1e14 * 0.6))
    assert op_time(add, hw, "bf16", "sdpa_cudnn") == pytest.approx(8e8 / (1e12 * 0.4))
    gemm = Op("mlp_up", "gemm", 2 * 8192**3, 3 * 2 * 8192**2, "gemm", (8192, 8192, 8192))
    assert op_time(gemm, hw, "bf16", "sdpa_cudnn") == op_time(gemm, hw, "bf16", "sdpa")
    assert op_time(gemm, hw, "bf16", "sdpa_cudnn") > op_time(gemm, hw, "bf16", "fused")


def test_each_trainer_runs_its_own_attention_kernel():
    """Megatron, torchtitan and DeepSpeed cuDNN's (TE's fused attention; torchtitan's sdpa_kernel priority; SDPA's
    own priority from PyTorch 2.9), Colossal-AI FlashAttention-2 (it calls it itself), unless attention_backend
    says; Megatron is never costed with FlashAttention."""
    from autotune.costmodel.compute import attention_kernel

    kernels = {t: attention_kernel(JobSpec(global_batch=8, seq_len=1024, trainer=t))
               for t in ("megatron", "torchtitan", "deepspeed", "colossalai")}
    assert kernels == {"megatron": "fused", "torchtitan": "sdpa_cudnn", "deepspeed": "sdpa_cudnn",
                       "colossalai": "sdpa"}
    pinned = JobSpec(global_batch=8, seq_len=1024, trainer="torchtitan", attention_backend="flash")
    assert attention_kernel(pinned) == "sdpa" and pinned.runs_attention == "flash"
    assert attention_kernel(replace(pinned, trainer="deepspeed", attention_backend="cudnn")) == "sdpa_cudnn"
    with pytest.raises(SpecError, match="--attention-backend flash: Megatron's attention is costed as"):
        JobSpec(global_batch=8, seq_len=1024, attention_backend="flash")
    with pytest.raises(SpecError, match="--attention-backend must be one of cudnn, flash, got 'xformers'"):
        JobSpec(global_batch=8, seq_len=1024, trainer="deepspeed", attention_backend="xformers")


def test_every_kernel_pays_the_launch_gap():
    hw = replace(HW, kernel_overhead_s=3e-6)
    op = Op("add", "elementwise", 0.0, 8e8, "memory")
    assert op_time(op, hw, "bf16") == pytest.approx(8e8 / (1e12 * 0.8) + 3e-6)


# ----------------------------------------------------------------------------------------- FP8 and eager kernels
def _shape(**kw):
    job = JobSpec(global_batch=8, seq_len=1024, **kw)
    return layer_shape(LLAMA, job, tp=1, cp=1, mbs=1, sp=False)


def test_fp8_adds_a_cast_transpose_per_linear_input_and_output_gradient():
    """Transformer Engine casts each linear layer's 16-bit input to an FP8 copy and an FP8 transpose (read 2,
    write 1 + 1 bytes per element), and the output gradient likewise in the backward; the norms and the
    activation write their output in FP8 themselves (LayerNormLinear, LayerNormMLP), leaving the two writes."""
    shape = _shape(dtype="fp8")
    fwd = layer_forward_ops(LLAMA, shape)
    casts = {op.name: op.bytes for op in fwd if op.name.endswith("_fp8_cast")}
    t, h = 1024, 1024
    assert casts == {"qkv_proj_fp8_cast": 2 * t * h, "out_proj_fp8_cast": 4 * t * LLAMA.q_width,
                     "mlp_up_fp8_cast": 2 * t * h, "mlp_down_fp8_cast": 2 * t * LLAMA.ffn_hidden_size}
    eager = layer_forward_ops(LLAMA, _shape(dtype="fp8", fused_kernels=False))
    assert all(op.bytes == 4 * op.flops / 2 for op in eager if op.name.endswith("_fp8_cast"))
    bwd_casts = [op for op in backward_ops(fwd, LLAMA, shape) if op.name.endswith("_fp8_cast")]
    assert sorted(op.bytes for op in bwd_casts) == sorted(
        [4 * t * (LLAMA.q_width + 2 * LLAMA.kv_width), 4 * t * h, 4 * t * 2 * LLAMA.ffn_hidden_size, 4 * t * h])


def test_fp8_keeps_the_saved_linear_inputs_in_one_byte():
    """The four GEMM inputs (QKV, out-projection, MLP up, MLP down) are saved as FP8 copies: one byte each
    instead of two; everything else stays 16-bit."""
    bf16, fp8 = layer_activations(LLAMA, _shape()), layer_activations(LLAMA, _shape(dtype="fp8"))
    t = 1024
    saved = t * (LLAMA.hidden_size + LLAMA.q_width + LLAMA.hidden_size + LLAMA.ffn_hidden_size)
    assert bf16.none - fp8.none == saved


def test_eager_rmsnorm_is_a_chain_of_fp32_passes():
    """PyTorch's composite rms_norm: (e+4) + (4+4) + 4 + (4+4) + (4+e) + (e+e) bytes per element."""
    fused = next(op for op in layer_forward_ops(LLAMA, _shape()) if op.name == "input_norm")
    eager = next(op for op in layer_forward_ops(LLAMA, _shape(fused_kernels=False)) if op.name == "input_norm")
    n, h = 1024 * 1024, 1024
    assert fused.bytes == 4 * n + 2 * h
    assert eager.bytes == 36 * n + 2 * h


# ----------------------------------------------------------------------------------------- state bytes
def _state(**job) -> StateBytes:
    return JobSpec(global_batch=8, seq_len=8, **job).state_bytes


@pytest.mark.parametrize("d", [1, 8, 64])
def test_distributed_optimizer_bytes_follow_megatrons_table(d):
    """Megatron-LM docs (distributed optimizer): bf16 params with fp32 grads 6 + 12/d bytes per parameter;
    bf16 params with bf16 grads 4 + 16/d (the optimizer keeps its gradient shard in fp32)."""
    assert sum(state_bytes_per_param(1, d, _state())) == pytest.approx(6 + 12 / d)
    assert sum(state_bytes_per_param(1, d, _state(grad_reduce="bf16"))) == pytest.approx(4 + 16 / d)
    # no distributed optimizer: 2 + 2 + 12, and the fp32 copy of every bf16 gradient the optimizer steps on
    # (megatron-core 0.16 optimizer.py, Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads:
    # `main_param.grad = model_param.main_grad.float()`, a copy of a bf16 buffer, the buffer itself of an fp32 one)
    assert sum(state_bytes_per_param(0, d, _state(grad_reduce="bf16"))) == pytest.approx(2 + 2 + 12 + 4)
    assert sum(state_bytes_per_param(0, d, _state())) == pytest.approx(2 + 4 + 12)


@pytest.mark.parametrize("d", [1, 8, 64])
def test_precision_aware_optimizer_bytes_follow_megatron_core(d):
    """megatron-core 0.16 with --use-precision-aware-optimizer and bf16 moments (distrib_optimizer.py: exp_avg and
    exp_avg_sq allocated in exp_avg_dtype; the master parameter as an int16 remainder when store_param_remainders
    and bf16; `decoupled_grad = shard_model_grad`, the buffer itself): bf16 weights 2 + gradient buffer g +
    (2 + 2 + 2)/d, by hand. DeepSeek-V3's recipe (bf16 buffer too) gives 4 + 6/d, against 4 + 16/d without."""
    assert sum(state_bytes_per_param(1, d, _state(optimizer_states="bf16"))) == pytest.approx(6 + 6 / d)
    assert sum(state_bytes_per_param(1, d, _state(optimizer_states="bf16", grad_reduce="bf16"))) == \
        pytest.approx(4 + 6 / d)
    # fp16 training has no bf16 weights to share 16 bits with: the master stays fp32 (4 + 2 + 2)
    assert sum(state_bytes_per_param(1, d, _state(optimizer_states="bf16", dtype="fp16"))) == \
        pytest.approx(6 + 8 / d)
    # ZeRO-3 shards all of it: (2 + 2 + 6)/d
    assert sum(state_bytes_per_param(3, d, _state(optimizer_states="bf16", grad_reduce="bf16"))) == \
        pytest.approx(10 / d)


@pytest.mark.parametrize("d", [1, 8, 64])
def test_bf16_moments_keep_fp32_master_weights_and_the_gradient_copy(d):
    """Under a non-delayed fp8 recipe (Megatron-Bridge's default tensorwise) megatron-core's precision-aware
    optimizer keeps an fp32 master (`clone().float()`) and an fp32 gradient copy (`.float()`, the buffer itself when
    it is fp32 already): only the moments shrink, 4 + 4 = 8 bytes, so 4 + (8 + 4)/d with bf16 buffers, against
    4 + 16/d without it."""
    assert sum(state_bytes_per_param(1, d, _state(optimizer_states="bf16-moments", grad_reduce="bf16"))) == \
        pytest.approx(4 + 12 / d)
    assert sum(state_bytes_per_param(1, d, _state(optimizer_states="bf16-moments"))) == pytest.approx(6 + 8 / d)


def test_bf16_optimizer_states_shrink_only_the_optimizer_term():
    """The same plan with bf16 moments: weights and gradients unchanged, the optimizer term 6/12 of fp32's
    (no fp32 gradient copy either way with fp32 buffers), the step time unchanged."""
    plan = Plan(tp=2, pp=2, dp=2, mbs=1, num_microbatches=4, zero=1, layers_per_stage=(2, 2))
    job = JobSpec(global_batch=8, seq_len=4096)
    fp32 = CostModel(LLAMA, HW, job).estimate(plan)
    bf16 = CostModel(LLAMA, HW, replace(job, optimizer_states="bf16")).estimate(plan)
    assert bf16.step_time_s == fp32.step_time_s
    for a, b in zip(fp32.stages, bf16.stages):
        assert (b.memory.weights, b.memory.gradients) == (a.memory.weights, a.memory.gradients)
        assert b.memory.optimizer == pytest.approx(a.memory.optimizer / 2, rel=1e-6)


# ----------------------------------------------------------------------------------------- overlap
def _tp_layer(job: JobSpec, overlap: bool):
    return layer_cost(LLAMA, HW, job, tp=4, cp=1, mbs=1, sp=True, tp_overlap=overlap)


def test_tp_overlap_leaves_one_chunk_exposed_when_the_gemms_are_longer():
    """Wang et al. (ASPLOS 2023): a collective decomposed into tp chunks pipelined with its GEMM shows one chunk
    plus whatever the rest outlasts the GEMM. Forward with sequence parallelism: 2 all-gathers and 2
    reduce-scatters of the T x h activation."""
    job = JobSpec(global_batch=8, seq_len=8192)
    link = comm.group_link(HW, 4, 1)
    nbytes = 2 * 8192 * LLAMA.hidden_size
    c = 2 * (comm.all_gather(nbytes, 4, link) + comm.reduce_scatter(nbytes, 4, link))
    plain, over = _tp_layer(job, False), _tp_layer(job, True)
    assert plain.tp_fwd_s == pytest.approx(c)
    gemms = sum(op_time(op, HW, "bf16") for op in layer_forward_ops(LLAMA, layer_shape(LLAMA, job, tp=4, cp=1, mbs=1,
                                                                                           sp=True))
                if op.kernel == "gemm" and op.category == "gemm")
    assert over.tp_fwd_s >= c / 4 + max(0.0, 3 * c / 4 - gemms)
    assert over.tp_fwd_s < plain.tp_fwd_s


def test_transformer_engine_gathers_fp8_and_reduce_scatters_16_bit():
    """Under FP8, Transformer Engine quantizes before it all-gathers (the normalized input, its backward
    re-gather, a row-parallel output gradient: 1 byte per element); the reduce-scatters carry the GEMMs' bf16
    outputs. torchtitan gathers its bf16 activations and casts after."""
    job, hw = JobSpec(global_batch=8, seq_len=8192, dtype="fp8"), replace(HW, peak_flops_fp8=2e14)
    link = comm.group_link(hw, 4, 1)
    elems = 8192 * LLAMA.hidden_size
    fwd = 2 * (comm.all_gather(elems, 4, link) + comm.reduce_scatter(2 * elems, 4, link))
    assert layer_cost(LLAMA, hw, job, tp=4, cp=1, mbs=1, sp=True, tp_overlap=False).tp_fwd_s == pytest.approx(fwd)
    titan = layer_cost(LLAMA, hw, replace(job, trainer="torchtitan"), tp=4, cp=1, mbs=1, sp=True, tp_overlap=False)
    assert titan.tp_fwd_s == pytest.approx(2 * (comm.all_gather(2 * elems, 4, link)
                                                + comm.reduce_scatter(2 * elems, 4, link)))


def test_tp_overlap_userbuffers_are_twelve_layer_inputs_by_hand():
    """Transformer Engine 2.8's initialize_ub registers 12 communicators (qkv/proj/fc1/fc2 x fprop/dgrad/wgrad),
    each a buffer of Megatron's shape (seq x mbs / cp, hidden): bf16, or 1 byte for the 8 gather-side ones under
    FP8; and repeats the 32 MiB + 1 KiB cuBLAS workspace 3 times (2 more copies) on compute capability 9.
    llama3-70b, seq 8192, mbs 1, tp 4: 12 x 8192 x 8192 x 2 bytes = 1.5 GiB. Charged once per GPU, whatever
    its layers: an estimate's peak differs from the same plan without overlap by exactly that."""
    from autotune.catalog import load_hardware, load_model

    model, hw = load_model("llama3-70b"), load_hardware("h100-sxm")
    workspace = 2 * (32 * 2**20 + 1024)
    job = JobSpec(global_batch=64, seq_len=8192)
    cost = layer_cost(model, hw, job, tp=4, cp=1, mbs=1, sp=True, tp_overlap=True)
    assert cost.buffers == 12 * 8192 * 8192 * 2 + workspace
    fp8 = layer_cost(model, hw, replace(job, dtype="fp8"), tp=4, cp=2, mbs=2, sp=True, tp_overlap=True)
    assert fp8.buffers == 8192 * 8192 * (8 * 1 + 4 * 2) + workspace  # (8192 x 2 / 2 rows)
    assert layer_cost(model, hw, job, tp=4, cp=1, mbs=1, sp=True, tp_overlap=False).buffers == 0
    # torchtitan's async TP: torch's symmetric-memory workspace, two reduce-scatter output chunks of 8192/4 rows
    titan = replace(job, trainer="torchtitan")
    assert layer_cost(model, hw, titan, tp=4, cp=1, mbs=1, sp=True, tp_overlap=True).buffers == 2 * 2048 * 8192 * 2
    assert layer_cost(model, hw, replace(job, trainer="deepspeed"), tp=4, cp=1, mbs=1, sp=True,
                      tp_overlap=True).buffers == 0
    plan = Plan(tp=4, pp=4, dp=2, mbs=1, num_microbatches=32, schedule="interleaved", vpp=5,
                layers_per_stage=even_split(80, 4), sequence_parallel=True, tp_overlap=True)
    cm = CostModel(model, hw, job)
    with_ub, without = cm.estimate(plan), cm.estimate(replace(plan, tp_overlap=False))
    assert with_ub.peak_memory_bytes - without.peak_memory_bytes == cost.buffers


def test_megatron_hides_the_backward_input_gradient_collectives_torchtitan_does_not():
    mega = _tp_layer(JobSpec(global_batch=8, seq_len=8192), False)
    titan = _tp_layer(JobSpec(global_batch=8, seq_len=8192, trainer="torchtitan"), False)
    # the backward has the forward's 2 AG + 2 RS; Megatron adds the 2 re-gathers of the saved input shards,
    # torchtitan (which saves the gathered inputs) runs them only when its selective checkpointing recomputes them
    link = comm.group_link(HW, 4, 1)
    nbytes = 2 * 8192 * LLAMA.hidden_size
    ag, rs = comm.all_gather(nbytes, 4, link), comm.reduce_scatter(nbytes, 4, link)
    assert titan.tp_bwd_s == pytest.approx(2 * ag + 2 * rs)
    assert titan.sac_gather_s == pytest.approx(2 * ag)
    assert 2 * ag <= mega.tp_bwd_s < titan.tp_bwd_s


def test_torchtitan_selective_recomputes_half_the_linears_and_the_memory_bound_ops():
    """torchtitan's op-level SAC saves every compute op's output "except every second mm"."""
    job = JobSpec(global_batch=8, seq_len=2048, trainer="torchtitan")
    layer = layer_cost(LLAMA, HW, job, tp=1, cp=1, mbs=1, sp=False)
    ops = layer_forward_ops(LLAMA, layer_shape(LLAMA, job, tp=1, cp=1, mbs=1, sp=False))
    gemms = sum(op_time(op, HW, "bf16") for op in ops if op.kernel == "gemm" and op.category == "gemm")
    mem = sum(op_time(op, HW, "bf16") for op in ops if op.kernel == "memory")
    assert layer.recompute_time("selective") == pytest.approx(gemms / 2 + mem)
    megatron = layer_cost(LLAMA, HW, replace(job, trainer="megatron"), tp=1, cp=1, mbs=1, sp=False)
    assert megatron.recompute_time("selective") == pytest.approx(megatron.attn_fwd_s)


# ----------------------------------------------------------------------------------------- FSDP / ZeRO
def _fsdp_plan(zero: int) -> Plan:
    return Plan(tp=1, pp=1, dp=64, mbs=1, num_microbatches=1, zero=zero, layers_per_stage=(4,))


def test_fsdp_pays_the_collective_latency_once_per_unit():
    """Every wrapped block gathers and scatters on its own: with no compute to hide behind, k units cost k
    collectives of 1/k of the bytes, i.e. (k - 1) more latencies than one big collective."""
    plan = _fsdp_plan(3)
    one = zero3_exposed(plan, HW, 10**9, 0.0, 0.0, 4, units=1)
    ten = zero3_exposed(plan, HW, 10**9, 0.0, 0.0, 4, units=10)
    link = comm.group_link(HW, 64, 1)
    latency = comm.ring_latency(64, link)
    assert ten - one == pytest.approx(9 * 3 * latency)  # gather fwd, gather bwd, scatter


def test_hidden_collectives_slow_the_compute_they_overlap():
    """A running NCCL collective holds one SM per channel: 16 channels of 100 SMs take 16% of the GPU."""
    assert comm_interference(HW) == pytest.approx(0.16)
    plan = _fsdp_plan(3)
    link = comm.group_link(HW, 64, 1)
    gather, scatter = comm.all_gather(2e9, 64, link), comm.reduce_scatter(4e9, 64, link)
    hidden = zero3_exposed(plan, HW, 10**9, 100.0, 100.0, 4)
    assert hidden == pytest.approx(0.16 * (2 * gather + scatter))


def test_zero2_reduce_scatters_every_micro_batch_and_not_again_at_the_end():
    model = gpt_model(layers=4)
    job = JobSpec(global_batch=64, seq_len=1024)
    cm = CostModel(model, HW, job)
    plan = Plan(tp=1, pp=1, dp=8, mbs=1, num_microbatches=8, zero=2, layers_per_stage=(4,))
    stage = cm.estimate(plan).stages[0]
    link = comm.group_link(HW, 8, 1)
    units = 4 + 2  # the blocks, the embedding and the head
    scatter = units * comm.reduce_scatter(stage.params / units * 4, 8, link)
    assert stage.zero3_comm_s == pytest.approx(max(0.0, scatter - stage.bwd_s)
                                               + comm_interference(HW) * min(scatter, stage.bwd_s))


def test_zero2_without_overlap_stalls_the_backward_on_every_reduce_scatter():
    """DeepSpeed's ZeRO-2 without overlap_comm reduce-scatters each bucket on the compute stream: the whole
    scatter of every micro-batch is exposed, however long the backward, and the end-of-step reduction stays
    the parameter all-gather alone."""
    model = gpt_model(layers=4)
    plan = Plan(tp=1, pp=1, dp=8, mbs=1, num_microbatches=8, zero=2, layers_per_stage=(4,))
    link = comm.group_link(HW, 8, 1)
    units = 4 + 2
    stages = {}
    for overlap in (True, False):
        job = JobSpec(global_batch=64, seq_len=1024, trainer="deepspeed", overlap_grad_reduce=overlap)
        stages[overlap] = CostModel(model, HW, job).estimate(plan).stages[0]
    scatter = units * comm.reduce_scatter(stages[False].params / units * 4, 8, link)
    assert stages[False].zero3_comm_s == pytest.approx(scatter)
    assert stages[False].zero3_comm_s > stages[True].zero3_comm_s
    assert zero3_exposed(plan, HW, 10**9, 100.0, 100.0, 4, units=1, inline=True) == pytest.approx(
        comm.reduce_scatter(4e9, 8, link))


# ----------------------------------------------------------------------------------------- uneven chunks
def test_interleaved_chunks_of_unequal_layers_are_costed_layer_by_layer():
    """7 layers on a rank with vpp 2 run as chunks of 4 and 3 layers (the emitted layout): on rank 0 the first
    chunk also carries the embedding, so its forward is one layer plus the embedding longer than the second's."""
    model = gpt_model(layers=14)
    job = JobSpec(global_batch=8, seq_len=1024)
    cm = CostModel(model, HW, job)
    plan = Plan(tp=1, pp=2, dp=1, mbs=1, num_microbatches=8, schedule="interleaved", vpp=2,
                layers_per_stage=even_split(14, 2))
    est = cm.estimate(plan)
    layer, vocab = cm.layer(1, 1, 1, False), cm.vocab(1, 1, 1, False)
    f_layer = layer.fwd.seconds + layer.tp_fwd_s + layer.cp_fwd_s
    (f0, _, w0), (f1, _, w1) = est.stages[0].chunks
    assert f0 - f1 == pytest.approx(f_layer + vocab.embed_fwd.seconds + vocab.embed_comm_s / 2)
    assert w0 - w1 == pytest.approx(layer.wgrad_s)


def test_torchtitan_sac_keeps_every_other_linear_output_and_the_sdpa_output():
    """Block input (h), Q (q), V (kv), the first MLP up-projection (f), the SDPA output (q) in 16-bit, and the
    fp32 log-sum-exp per query head: the selective activations torchtitan's op-level SAC keeps."""
    from autotune.costmodel.memory import sac_activations

    shape = _shape()
    t, e = 1024, 2
    expected = e * t * (LLAMA.hidden_size + LLAMA.q_width + LLAMA.kv_width + LLAMA.ffn_hidden_size + LLAMA.q_width
                        + LLAMA.hidden_size) + 4 * t * LLAMA.num_heads
    assert sac_activations(LLAMA, shape) == expected
    titan = layer_cost(LLAMA, HW, JobSpec(global_batch=8, seq_len=1024, trainer="torchtitan"), tp=1, cp=1, mbs=1,
                       sp=False)
    assert titan.act.selective == min(expected, layer_activations(LLAMA, shape).selective)


def test_context_parallel_attention_op_is_one_causal_step_and_unmasked_blocks():
    """Transformer Engine's load-balanced ring with cp 4 on 8192 tokens: each rank holds 2048 queries; its first
    step is causal over them (1/4 of its work), the other three unmasked blocks with a 1024-token side."""
    job = JobSpec(global_batch=8, seq_len=8192)
    for cp, dims in ((1, (8192, 0.0, LLAMA.head_dim)), (4, (2048, 0.0, LLAMA.head_dim, 0.25, 1024))):
        shape = layer_shape(LLAMA, job, tp=1, cp=cp, mbs=1, sp=False)
        flash = [op for op in layer_forward_ops(LLAMA, shape) if op.name == "flash_attention"]
        assert [op.dims for op in flash] == [dims]
        bwd = [op for op in backward_ops(tuple(flash), LLAMA, shape) if op.name == "flash_attention_bwd"]
        assert bwd[0].dims == (dims[0], 1.0, *dims[2:])


def test_torchtitan_vocab_layers_and_sac_recompute_run_pytorch_kernels():
    """torchtitan's embedding, LM head, cross-entropy and SAC recompute run PyTorch's kernels (cuBLAS, ATen),
    so each is the sum of its ops at the "sdpa" figures; Megatron's the same ops at Transformer Engine's. Hand
    check on the embedding forward (memory-bound): bytes / (HBM x memory_torch) + one launch per op."""
    from autotune.costmodel.layer import vocab_cost
    from autotune.costmodel.ops import embedding_forward_ops

    hw = replace(HW, efficiency=replace(HW.efficiency, memory_torch=0.4, gemm_torch=0.3))
    titan_job = JobSpec(global_batch=8, seq_len=1024, trainer="torchtitan")
    titan = vocab_cost(LLAMA, hw, titan_job, tp=1, cp=1, mbs=1, sp=False)
    megatron = vocab_cost(LLAMA, hw, JobSpec(global_batch=8, seq_len=1024), tp=1, cp=1, mbs=1, sp=False)
    ops = embedding_forward_ops(LLAMA, layer_shape(LLAMA, titan_job, tp=1, cp=1, mbs=1, sp=False))
    by_hand = sum(op.bytes / (hw.hbm_bandwidth * 0.4) + hw.kernel_overhead_s for op in ops)
    assert titan.embed_fwd.seconds == pytest.approx(by_hand)
    assert titan.head_fwd.seconds > megatron.head_fwd.seconds  # gemm 0.3 < 0.5, memory 0.4 < 0.8
    titan_layer = layer_cost(LLAMA, hw, titan_job, tp=1, cp=1, mbs=1, sp=False)
    te_figures = layer_cost(LLAMA, HW, titan_job, tp=1, cp=1, mbs=1, sp=False)
    assert titan_layer.selective_s > te_figures.selective_s


def test_torchtitan_async_tp_pipelines_only_the_collectives_inductor_fuses():
    """torchtitan's async TP is Inductor's micro_pipeline_tp pass (torch/_inductor/fx_passes/micro_pipeline_tp.py):
    an all-gather fuses with the matmuls that take the gathered tensor as their LEFT operand, a reduce-scatter
    with the one matmul that produces its input. Per block of a gated Llama layer, tp = 4, sequence parallel:
    forward: gather -> wqkv / w1,w3 and wo / w2 -> scatter, all four fused, each over its own GEMMs;
    backward: the gather of dY fuses with the row-parallel input-gradient GEMM dY @ W; the attention's input
    gradient is one GEMM (fused wqkv) and its scatter fuses; the MLP's is dX1 + dX3 (an add), so its scatter
    runs in line; the re-gather of each block input (selective checkpointing only) feeds only weight-gradient GEMMs
    (dW = dY^T X, the gathered tensor on the right) and runs in line. Hand calculation of every term from op times
    and collective times."""
    tp = 4
    job = JobSpec(global_batch=8, seq_len=8192, trainer="torchtitan")
    shape = layer_shape(LLAMA, job, tp=tp, cp=1, mbs=1, sp=True)
    fwd_ops = layer_forward_ops(LLAMA, shape)
    bwd_ops = backward_ops(fwd_ops, LLAMA, shape)
    by_name = {op.name: op for op in fwd_ops + bwd_ops if op.kernel == "gemm"}

    def t(name):
        return op_time(by_name[name], HW, "bf16", "sdpa")

    def pipelined(c, g):  # tp chunks: one exposed, the rest behind the GEMM
        return c / tp + max(0.0, c * (tp - 1) / tp - g)

    def chunked_extra(name):  # the GEMM run as tp GEMMs of m/tp rows
        op = by_name[name]
        m, n, k = op.dims
        part = Op(op.name, op.category, op.flops / tp, op.bytes / tp, "gemm", (m / tp, n, k))
        return max(0.0, tp * op_time(part, HW, "bf16", "sdpa") - t(name))

    link = comm.group_link(HW, tp, 1)
    nbytes = 2 * 8192 * LLAMA.hidden_size
    ag, rs = comm.all_gather(nbytes, tp, link), comm.reduce_scatter(nbytes, tp, link)
    fwd = (pipelined(ag, t("qkv_proj")) + pipelined(rs, t("out_proj")) + pipelined(ag, t("mlp_up"))
           + pipelined(rs, t("mlp_down")) + sum(chunked_extra(n) for n in ("qkv_proj", "out_proj", "mlp_up",
                                                                           "mlp_down")))
    bwd = (pipelined(ag, t("out_proj_dgrad")) + pipelined(rs, t("qkv_proj_dgrad"))  # attention
           + pipelined(ag, t("mlp_down_dgrad")) + rs  # MLP: scatter of dX1 + dX3 in line
           + sum(chunked_extra(n) for n in ("out_proj_dgrad", "qkv_proj_dgrad", "mlp_down_dgrad")))
    layer = _tp_layer(job, True)
    assert layer.tp_fwd_s == pytest.approx(fwd)
    assert layer.tp_bwd_s == pytest.approx(bwd)
    assert layer.sac_gather_s == pytest.approx(2 * ag)  # the two re-gathers, in line, under SAC only
    assert layer.tp_bwd_s > 2 * ag + rs  # what no fusion hides stays exposed
    # without sequence parallelism the all-reduces match no pattern: async TP changes nothing
    plain = layer_cost(LLAMA, HW, job, tp=tp, cp=1, mbs=1, sp=False)
    async_ar = layer_cost(LLAMA, HW, job, tp=tp, cp=1, mbs=1, sp=False, tp_overlap=True)
    assert (async_ar.tp_fwd_s, async_ar.tp_bwd_s) == (plain.tp_fwd_s, plain.tp_bwd_s)


def test_torchtitan_async_tp_in_fp8_fuses_no_gather():
    """torchtitan's sharding is dtype-agnostic: the gathers move bf16 activations and torchao's Float8Linear casts
    them to fp8 before its _scaled_mm, so the gathered tensor feeds a cast, not a matmul, and micro_pipeline_tp
    fuses no all-gather; the reduce-scatters of the _scaled_mm outputs still fuse. So fp8 exposes, per layer,
    every gather in full: the forward's two, dY's two (and under SAC the two re-gathers)."""
    tp = 4
    hw = replace(HW, peak_flops_fp8=2 * HW.peak_flops_bf16)
    job = JobSpec(global_batch=8, seq_len=8192, trainer="torchtitan", dtype="fp8")
    fp8 = layer_cost(LLAMA, hw, job, tp=tp, cp=1, mbs=1, sp=True, tp_overlap=True)
    shape = layer_shape(LLAMA, job, tp=tp, cp=1, mbs=1, sp=True)
    fwd_ops = layer_forward_ops(LLAMA, shape)
    by_name = {op.name: op for op in fwd_ops + backward_ops(fwd_ops, LLAMA, shape) if op.kernel == "gemm"}

    def fused(c, name):  # one chunk exposed + the rest beyond the GEMM + the GEMM's m/tp-row chunking
        op = by_name[name]
        m, n, k = op.dims
        g = op_time(op, hw, "fp8", "sdpa")
        part = Op(op.name, op.category, op.flops / tp, op.bytes / tp, "gemm", (m / tp, n, k))
        return c / tp + max(0.0, c * (tp - 1) / tp - g) + max(0.0, tp * op_time(part, hw, "fp8", "sdpa") - g)

    link = comm.group_link(hw, tp, 1)
    nbytes = 2 * 8192 * LLAMA.hidden_size
    ag, rs = comm.all_gather(nbytes, tp, link), comm.reduce_scatter(nbytes, tp, link)
    assert fp8.tp_fwd_s == pytest.approx(2 * ag + fused(rs, "out_proj") + fused(rs, "mlp_down"))
    assert fp8.tp_bwd_s == pytest.approx(2 * ag + fused(rs, "qkv_proj_dgrad") + rs)
    assert fp8.sac_gather_s == pytest.approx(2 * ag)


# ------------------------------------------------------------------ torchtitan: the input re-gather per recompute mode
def test_torchtitan_runs_the_input_regather_only_under_selective_checkpointing():
    """tp = 4, sequence parallel, no overlap; every collective moves the T x h activation (T = 8192 tokens, 2 bytes).
    Megatron's linears save the input shard and gather it again in backward (megatron/core/tensor_parallel/
    layers.py), so its backward has the 2 dY gathers, the 2 input-gradient scatters and 2 re-gathers, and full
    recompute adds the forward's 2 gathers + 2 scatters again: 8 gathers. torchtitan's matmul saves the gathered
    input: none = 2 forward + 2 dY gathers (4); selective (SAC saves reduce-scatter outputs, not gathers) re-runs
    the 2 input gathers (6); full re-runs the forward, gathers included, and saves their outputs (6, not 8)."""
    job = JobSpec(global_batch=8, seq_len=8192, trainer="torchtitan")
    titan, mega = _tp_layer(job, False), _tp_layer(replace(job, trainer="megatron", async_tp_backward=False), False)
    link = comm.group_link(HW, 4, 1)
    nbytes = 2 * 8192 * LLAMA.hidden_size
    ag, rs = comm.all_gather(nbytes, 4, link), comm.reduce_scatter(nbytes, 4, link)

    def comm_in(layer, mode):  # the step's TP communication under a recompute mode (compute taken out)
        compute = layer.fwd.seconds + layer.bwd.seconds
        extra = {"none": 0.0, "selective": layer.selective_s if layer.selective_s >= 0 else layer.attn_fwd_s,
                 "full": layer.fwd.seconds}[mode]
        return layer.time(mode) - compute - extra

    assert comm_in(titan, "none") == pytest.approx(4 * ag + 4 * rs)
    assert comm_in(titan, "selective") == pytest.approx(6 * ag + 4 * rs)
    assert comm_in(titan, "full") == pytest.approx(6 * ag + 6 * rs)
    assert comm_in(mega, "none") == pytest.approx(6 * ag + 4 * rs)
    assert comm_in(mega, "full") == pytest.approx(8 * ag + 6 * rs)
    assert mega.sac_gather_s == 0.0
    # no sequence parallelism (all-reduces, nothing gathered) or no tp: nothing to re-gather
    assert layer_cost(LLAMA, HW, job, tp=4, cp=1, mbs=1, sp=False).sac_gather_s == 0.0
    assert layer_cost(LLAMA, HW, job, tp=1, cp=1, mbs=1, sp=False).sac_gather_s == 0.0


@pytest.mark.parametrize("dtype,saved_bytes", [("bf16", 2), ("fp8", 1)])
def test_torchtitan_without_checkpointing_keeps_the_gathered_gemm_inputs(dtype, saved_bytes):
    """Without activation checkpointing torchtitan's QKV and MLP-up matmuls save their all-gathered inputs: per
    block T x h elements instead of Megatron's T x h / tp shard (T = 8192 tokens, h = 1024, tp = 4), at the width
    the saved GEMM inputs have (2 bytes; 1 under FP8): 2 * bytes * 8192 * 1024 * 3/4 more than Megatron's layer.
    Checkpointed layers keep the same (full: the block input; selective: SAC recomputes the gathers)."""
    hw = replace(HW, peak_flops_fp8=2 * HW.peak_flops_bf16)
    job = JobSpec(global_batch=8, seq_len=8192, trainer="torchtitan", dtype=dtype)
    titan = layer_cost(LLAMA, hw, job, tp=4, cp=1, mbs=1, sp=True)
    mega = layer_cost(LLAMA, hw, replace(job, trainer="megatron"), tp=4, cp=1, mbs=1, sp=True)
    assert titan.act.none - mega.act.none == 2 * saved_bytes * 8192 * 1024 * 3 // 4
    assert titan.act.full == mega.act.full
    # not sequence parallel: the input is already whole on every rank, nothing differs
    plain = layer_cost(LLAMA, hw, job, tp=4, cp=1, mbs=1, sp=False)
    assert plain.act.none == layer_cost(LLAMA, hw, replace(job, trainer="megatron"), tp=4, cp=1, mbs=1,
                                        sp=False).act.none
