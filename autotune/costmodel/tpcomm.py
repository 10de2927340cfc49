"""Tensor-parallel communication of one Transformer layer: what each trainer exposes of its all-gathers,
reduce-scatters and all-reduces, with and without overlapping them with the GEMMs beside them (Megatron's
Transformer Engine userbuffers; torchtitan's async TP, which fuses only what Inductor's pattern pass matches).
"""

from __future__ import annotations

from autotune.costmodel import comm
from autotune.costmodel.compute import attention_kernel, op_time, pass_time
from autotune.costmodel.ops import LayerShape, Op
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec


#: The column-parallel linears (input all-gathered under sequence parallelism, input gradient reduced) and the
#: row-parallel ones (output reduce-scattered or all-reduced) of a Megatron block.
COLUMN_PARALLEL = ("qkv_proj", "mlp_up", "shared_up")
ROW_PARALLEL = ("out_proj", "mlp_down", "shared_down")


def gemm_seconds(ops, names: tuple[str, ...], suffix: str, hw: HardwareSpec, job: JobSpec, lookup) -> float:
    wanted = {n + suffix for n in names}
    return pass_time(tuple(op for op in ops if op.kernel == "gemm" and op.name in wanted), hw, job.dtype, lookup,
                     attention_kernel(job)).seconds


def tp_layer_comm(model: ModelSpec, hw: HardwareSpec, job: JobSpec, shape: LayerShape, fwd_ops, bwd_ops,
                   lookup, overlap: bool, blocks: int = 2, timer=None) -> tuple[float, float]:
    """Exposed tensor-parallel communication of one layer, (forward, backward) seconds.

    Megatron's two collectives per pass (Shoeybi et al. 2019); with sequence parallelism each all-reduce is
    an all-gather before and a reduce-scatter after the block, and the backward all-gathers each
    column-parallel input again for its weight gradient (Korthikanti et al. 2022, Sec. 4.2.2) where the trainer
    saves the input shard (regathers_inputs; torchtitan saves the gathered input, and gathers again only when
    it recomputes: recomputed_gathers_s). Megatron issues the backward's input-gradient collectives
    asynchronously, hidden behind the weight-gradient GEMMs (and the re-gather behind the input-gradient
    GEMMs); torchtitan and DeepSpeed run them in line.
    With `overlap` (TE userbuffers, async TP) every collective is split into tp chunks pipelined with the
    GEMM beside it (Wang et al., ASPLOS 2023): one chunk stays exposed, and the rest shows only where the
    collective outlasts the GEMM; the chunked GEMMs' extra time (smaller tiles) is charged too. That is
    Megatron's TE userbuffers, which wrap every tensor-parallel GEMM; torchtitan's async TP fuses only what
    Inductor's pattern pass matches (async_tp_comm). `timer`: the cost model's op time (op_time, memoized),
    for the chunked GEMMs.
    """
    tp = shape.tp
    if tp == 1:
        return 0.0, 0.0
    if overlap and job.trainer != "megatron":
        return async_tp_comm(model, hw, job, shape, fwd_ops, bwd_ops, lookup, blocks, timer)
    nbytes = shape.elem * shape.tokens * model.hidden_size
    link = comm.group_link(hw, tp, 1)
    if shape.sp:
        ag, rs = comm.all_gather(gathered_bytes(job, shape, nbytes), tp, link), comm.reduce_scatter(nbytes, tp, link)
        regather = blocks * ag if regathers_inputs(job) else 0.0
        fwd_c, bwd_inline, bwd_async = blocks * (ag + rs), regather, blocks * (ag + rs)
    else:
        ar = comm.all_reduce(nbytes, tp, link)
        fwd_c, bwd_inline, bwd_async = blocks * ar, 0.0, blocks * ar
    fwd_g = gemm_seconds(fwd_ops, COLUMN_PARALLEL + ROW_PARALLEL, "", hw, job, lookup)
    bwd_g = gemm_seconds(bwd_ops, COLUMN_PARALLEL + ROW_PARALLEL, "_dgrad", hw, job, lookup)
    if overlap:
        fwd = fwd_c / tp + max(0.0, fwd_c * (tp - 1) / tp - fwd_g)
        bwd_c = bwd_inline + bwd_async
        bwd = bwd_c / tp + max(0.0, bwd_c * (tp - 1) / tp - bwd_g)
        return fwd + chunking_cost(fwd_ops, tp, hw, job, timer), bwd + chunking_cost(
            tuple(op for op in bwd_ops if op.name.endswith("_dgrad")), tp, hw, job, timer)
    if job.trainer != "megatron" or not job.async_tp_backward:
        return fwd_c, bwd_inline + bwd_async
    hidden = gemm_seconds(bwd_ops, COLUMN_PARALLEL, "_wgrad", hw, job, lookup) + gemm_seconds(
        bwd_ops, COLUMN_PARALLEL, "_dgrad", hw, job, lookup)
    return fwd_c, bwd_inline + max(0.0, bwd_async - hidden)


#: Transformer Engine 2.8's userbuffer communicators (pytorch/module/base.py, initialize_ub: its default `methods`
#: name 12 GEMMs of a layer, qkv/proj/fc1/fc2 x fprop/dgrad/wgrad), of which the 8 in layers_all_gather_overlap hold
#: FP8 (uint8) buffers under an FP8 recipe; and the cuBLAS workspace it repeats _NUM_MAX_UB_STREAMS = 3 times for
#: the chunked GEMMs (get_cublas_workspace_size_bytes: 32 MiB + 1 KiB from compute capability 9, else 4 MiB).
USERBUFFER_GEMMS, USERBUFFER_FP8_GEMMS, USERBUFFER_STREAMS = 12, 8, 3


def tp_overlap_buffers(model: ModelSpec, hw: HardwareSpec, job: JobSpec, shape: LayerShape, overlap: bool) -> int:
    """GPU memory TP overlap allocates once, bytes. Megatron's --tp-comm-overlap: each of Transformer Engine's
    userbuffer communicators registers a buffer of initialize_ub's `shape`, which Megatron sets to (seq x mbs /
    cp, hidden) (megatron-bridge 0.3.1 training/initialize.py, _initialize_tp_communicators; Megatron-LM the same),
    in bf16, or 1 byte for the gather-side ones under FP8; plus the cuBLAS workspace's two extra copies. TE's
    default methods (no tp_comm_overlap_cfg): no ring-exchange reduce-scatter, so no 2tp-1 chunk buffers.
    torchtitan's async TP draws on torch's one symmetric-memory workspace per group instead, grown to the largest
    request: a fused reduce-scatter's two output chunks, 2 x (tokens / tp) x hidden (torch 2.13
    distributed/_symmetric_memory/__init__.py, _pipelined_produce_and_all2all; a gather asks for one shard)."""
    if not overlap or shape.tp == 1 or not shape.sp or job.trainer not in ("megatron", "torchtitan"):
        return 0
    rows = shape.tokens * model.hidden_size
    if job.trainer == "torchtitan":
        return int(2 * rows / shape.tp * shape.elem)
    gather = 1 if job.dtype == "fp8" else shape.elem
    buffers = rows * (USERBUFFER_FP8_GEMMS * gather + (USERBUFFER_GEMMS - USERBUFFER_FP8_GEMMS) * shape.elem)
    major = int(hw.compute_capability.split(".")[0]) if hw.compute_capability[:1].isdigit() else 0
    workspace = 32 * 2**20 + 1024 if major >= 9 else 4 * 2**20
    return int(buffers) + (USERBUFFER_STREAMS - 1) * workspace


def gathered_bytes(job: JobSpec, shape: LayerShape, nbytes: float) -> float:
    """Bytes of a sequence-parallel all-gather of `nbytes` of activations. Under FP8, Transformer Engine quantizes
    before it gathers: the normalized input of a column-parallel linear (the forward's gather and the backward's
    re-gather for the weight gradient) and a row-parallel linear's output gradient travel as 1-byte FP8, over
    NCCL and userbuffers alike (transformer_engine 2.8 pytorch/module/layernorm_linear.py and linear.py:
    gather_along_first_dim / fill_userbuffers_buffer_for_all_gather with the quantizer; base.py
    grad_output_preprocess). The reduce-scatters carry the GEMMs' 16-bit outputs. Megatron only: torchtitan's
    gathers move the bf16 activations (async_tp_comm)."""
    if job.dtype == "fp8" and job.trainer == "megatron":
        return nbytes / shape.elem
    return nbytes


def regathers_inputs(job: JobSpec) -> bool:
    """Whether the backward all-gathers each column-parallel input again for its weight gradient whatever the
    recompute setting. Megatron's linears save the input shard and gather it again in backward (megatron/core/
    tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication), and DeepSpeed runs Megatron-
    DeepSpeed's copies of them (its own AutoTP, deepspeed/module_inject/layers.py, has no sequence parallelism).
    torchtitan's gather is an autograd op in front of the linear, whose matmul saves the gathered tensor (eager;
    compiled, the partitioner force-saves collective outputs: torch/_functorch/partitioners.py,
    force_save_collectives), so its backward gathers again only where a recomputation re-runs the gather."""
    return job.trainer != "torchtitan"


def recomputed_gathers_s(model: ModelSpec, hw: HardwareSpec, job: JobSpec, shape: LayerShape,
                         blocks: int = 2) -> float:
    """torchtitan's backward re-gather of the block inputs, seconds: only its selective checkpointing runs it.
    Its op-level SAC saves reduce-scatter outputs, not gathers (distributed/activation_checkpoint.py,
    _get_default_save_ops: every other op is PREFER_RECOMPUTE), so the backward re-runs each block's gather to
    feed the weight-gradient GEMMs, in line. Without checkpointing the gathered inputs are saved (their memory:
    memory.gathered_input_bytes); full checkpointing (FullAC, early_stop=False) re-runs the whole forward, its
    gathers included, which recompute_time('full') already charges with tp_fwd_s, and autograd then saves the
    recomputed gathered tensors, so no further gather runs. Megatron's re-gather sits in tp_bwd_s (0 here)."""
    if shape.tp == 1 or not shape.sp or regathers_inputs(job):
        return 0.0
    nbytes = shape.elem * shape.tokens * model.hidden_size
    return blocks * comm.all_gather(nbytes, shape.tp, comm.group_link(hw, shape.tp, 1))


#: torchtitan's blocks under sequence parallelism: (column-parallel GEMMs fed by the block's all-gather,
#: row-parallel GEMMs whose output is reduce-scattered), attention then MLP (a shared expert's with the MLP's).
ASYNC_TP_BLOCKS = ((("qkv_proj",), ("out_proj",)), (("mlp_up", "shared_up"), ("mlp_down", "shared_down")))


def _pipelined(collective: float, gemm: float, tp: int) -> float:
    """A collective split into tp chunks pipelined with its GEMM: one chunk exposed, plus what the other
    chunks outlast the GEMM by."""
    return collective / tp + max(0.0, collective * (tp - 1) / tp - gemm)


def async_tp_comm(model: ModelSpec, hw: HardwareSpec, job: JobSpec, shape: LayerShape, fwd_ops, bwd_ops,
                   lookup, blocks: int, timer=None) -> tuple[float, float]:
    """Exposed tensor-parallel communication under torchtitan's async TP, (forward, backward) seconds.

    torchtitan turns it on only with torch.compile (distributed/compile.py, apply_compile ->
    _maybe_enable_async_tp sets torch._inductor.config._micro_pipeline_tp), so what overlaps is what Inductor's
    post-grad pass torch/_inductor/fx_passes/micro_pipeline_tp.py (micro_pipeline_tp_pass) rewrites, in the
    forward and the backward graph alike, and nothing else:
      - fuse_all_gather_matmul: an all-gather whose result is the LEFT operand of mm(s) (_find_consumer_matmuls;
        a matmul whose B operand descends from the gather is dropped) -> symm_mem.fused_all_gather_matmul. Hit:
        the forward gather of each block's input (feeding wqkv, or w1 and w3 together), and the backward gather
        of a row-parallel output's gradient dY (feeding the input-gradient GEMM dY @ W). Missed: the weight-
        gradient GEMMs, which read the gathered tensor transposed (dW = dY^T X). The backward re-gather of a
        block's input exists only under selective checkpointing, which recomputes the gather (the partitioner
        saves collectives unless an AC region marks them for recompute: torch/_functorch/partitioners.py,
        force_save_collectives; torchtitan's SAC saves reduce-scatter outputs, not gathers: distributed/
        activation_checkpoint.py); it is not in this backward but in the selective recomputation
        (recomputed_gathers_s), in line as without overlap. (Under SAC the MLP's re-gather also feeds the
        recomputed w3, every second mm, and could fuse with it; that is not taken.)
      - fuse_matmul_reduce_scatter: a reduce-scatter whose input is produced by one mm (_find_producer_matmul:
        mm or reshape -> mm -> reshape) -> symm_mem.fused_matmul_reduce_scatter. Hit: the forward reduce-scatter
        after wo and w2; the backward reduce-scatter of a block's input gradient only where that gradient is ONE
        GEMM: the attention's, as torchtitan's llama3 fuses q, k, v into one wqkv linear (models/llama3/
        __init__.py, fuse_qkv=True); a gated MLP's input gradient is dX1 + dX3 (w1 and w3 read the same
        gathered input, models/common/feed_forward.py FeedForward.forward), an add node, so it is reduce-
        scattered in line. The all-reduces of a run without sequence parallelism match nothing.
      - FP8: torchtitan's sharding is dtype-agnostic (protocols/sharding.py, ShardingConfig: "quantization
        (Float8/MXFP8) is orthogonal"), so the gathers move the bf16 activations and torchao's Float8Linear
        (components/quantization/float8.py) casts them to fp8 before its _scaled_mm: the gathered tensor feeds a
        cast kernel, not a matmul, and no all-gather fuses, forward or backward. The reduce-scatters still
        take the _scaled_mm output directly (_ScaledMatmul in _find_producer_matmul) and fuse as in bf16.
    Each fused op pipelines its collective with its own GEMMs only (torch/distributed/_symmetric_memory/
    __init__.py: _pipelined_all_gather_and_consume, _pipelined_produce_and_all2all: tp chunks, one per peer, on
    two streams), so every fused collective costs _pipelined(collective, its GEMMs) and its GEMMs run as tp
    GEMMs of m/tp rows (chunking_cost)."""
    tp = shape.tp
    nbytes = shape.elem * shape.tokens * model.hidden_size
    link = comm.group_link(hw, tp, 1)
    if not shape.sp:  # all-reduces: no pattern matches, they run as without overlap
        ar = comm.all_reduce(nbytes, tp, link)
        return blocks * ar, blocks * ar
    ag, rs = comm.all_gather(nbytes, tp, link), comm.reduce_scatter(nbytes, tp, link)
    gathers_fuse = job.dtype != "fp8"  # an fp8 cast sits between each gather and its matmul
    fwd, bwd, chunked_fwd, chunked_bwd = 0.0, 0.0, [], []
    for i, (column, row) in enumerate(ASYNC_TP_BLOCKS[:blocks]):
        fwd += _pipelined(rs, gemm_seconds(fwd_ops, row, "", hw, job, lookup), tp)
        chunked_fwd += list(row)
        if gathers_fuse:  # the block input's gather with wqkv / w1 and w3, and dY's gather with dY @ W
            fwd += _pipelined(ag, gemm_seconds(fwd_ops, column, "", hw, job, lookup), tp)
            bwd += _pipelined(ag, gemm_seconds(bwd_ops, row, "_dgrad", hw, job, lookup), tp)
            chunked_fwd += list(column)
            chunked_bwd += [n + "_dgrad" for n in row]
        else:
            fwd, bwd = fwd + ag, bwd + ag
        one_input_gemm = i == 0 or not model.gated  # attention: wqkv; a gated MLP: w1 and w3
        if one_input_gemm:
            bwd += _pipelined(rs, gemm_seconds(bwd_ops, column, "_dgrad", hw, job, lookup), tp)
            chunked_bwd += [n + "_dgrad" for n in column]
        else:
            bwd += rs
    fwd += chunking_cost(tuple(op for op in fwd_ops if op.name in chunked_fwd), tp, hw, job, timer)
    bwd += chunking_cost(tuple(op for op in bwd_ops if op.name in chunked_bwd), tp, hw, job, timer)
    return fwd, bwd


def chunking_cost(ops, tp: int, hw: HardwareSpec, job: JobSpec, timer=None) -> float:
    """Extra time of running each linear GEMM as tp GEMMs of m/tp rows (tile and wave quantization), by the
    model's op times (`timer`, or op_time), not a profile's: the difference is the model's quantization."""
    extra, kernel = 0.0, attention_kernel(job)
    if timer is None:
        def timer(op: Op) -> float:
            return op_time(op, hw, job.dtype, kernel)
    for op in ops:
        if op.kernel != "gemm" or op.category != "gemm" or not op.dims or op.name.startswith("expert_"):
            continue  # the expert GEMMs wait for the all-to-all, not a tensor-parallel collective
        m, n, k = op.dims
        part = Op(op.name, op.category, op.flops / tp, op.bytes / tp, "gemm", (m / tp, n, k))
        extra += max(0.0, tp * timer(part) - timer(op))
    return extra
