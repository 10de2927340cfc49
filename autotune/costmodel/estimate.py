"""The whole step: pipeline time, exposed data-parallel communication, optimizer, throughput and MFU."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import attrgetter, mul

from autotune.costmodel import comm
from autotune.costmodel.compute import attention_kernel
from autotune.costmodel.epoverlap import ep_overlapped, pairing
from autotune.costmodel.flops import model_flops_per_step
from autotune.costmodel.layer import (LayerCost, VocabCost, blend_layers, dense_layer_cost, layer_cost, layer_shape,
                                      moe_layer_cost, vocab_cost)
from autotune.costmodel.measured import (MeasuredOps, OpCoverage, apply_comm, check_profile_model,
                                         roofline_coverage, step_ops)
from autotune.costmodel.memory import whole_tensor_bucket
from autotune.costmodel.moe import deepep_refusal
from autotune.costmodel.mtp import MtpPasses, mtp_passes, with_mtp
from autotune.costmodel.ops import CATEGORIES
from autotune.costmodel.pipeline import Ticks, Timeline, makespan, simulate
from autotune.costmodel.schedules import exposed_p2p_share
from autotune.costmodel.stagememo import shape_memo
from autotune.costmodel.stages import (StageCost, base_recompute, build_stages, p2p_time, schedule_ticks,
                                      vocab_parallel_comm)
from autotune.errors import SpecError
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import GRAD_BYTES, WEIGHT_BYTES, JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan
from autotune.specs.profile import Profile
from autotune.specs.tpgrid import tp_mode_degrees
from autotune.specs.trainer_jobs import runs_mtp
from autotune.specs.overlap import gathers_params_in_step, overlaps_grad_reduce, reduces_inline

#: Bytes Adam touches per parameter in its step: read the fp32 gradient, read and write the fp32 master
#: weight, m and v, write the 16-bit weight (a memory-bound kernel, paper 5).
ADAM_STEP_BYTES = 4 + 2 * 4 * 3 + 2

#: Distinct pipeline simulations a CostModel remembers (each holds its durations: pp * chunks * 3 floats).
MAKESPAN_CACHE = 4096
#: Bucketed exposures kept per collective, group and bucket (dp_sync_exposed)
EXPOSURE_MEMO = 65536
_time_s, _chunks, _params = attrgetter("time_s"), attrgetter("chunks"), attrgetter("params")  # read in C
_params_and = {"bwd": attrgetter("params", "bwd_s"), "fwd": attrgetter("params", "fwd_s")}  # (_bucketed_over_stages)


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Step time split into additive terms, seen from the slowest (bottleneck) pipeline stage."""

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    bubble_s: float
    dp_comm_exposed_s: float
    optimizer_s: float

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(frozen=True, slots=True)
class Estimate:
    """The cost model's prediction for one plan."""

    plan: Plan
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    stages: tuple[StageCost, ...]
    breakdown: Breakdown
    op_seconds: tuple[tuple[str, float], ...]
    """Per-step compute time of the bottleneck stage by operator category (gemm, attention, norm, ...)."""
    usable_memory_bytes: int
    grads_after_backward: bool = False
    """The data-parallel reduction waits for the backward to end (overlap.overlaps_grad_reduce False)."""
    p2p_exposed: float = 1.0
    """Share of the pipeline sends the passes wait on (schedules.exposed_p2p_share; below 1 where overlapped)."""

    @property
    def peak_memory_bytes(self) -> int:
        return max(s.memory.total for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.usable_memory_bytes

    @property
    def bottleneck(self) -> int:
        return max(range(len(self.stages)), key=lambda i: (self.stages[i].time_s, -i))


class CostModel:
    """Evaluates plans of one (model, hardware, job). Layer and vocabulary costs are memoized per
    (tp, cp, mbs, sp), so evaluating many plans costs little more than assembling their stages."""

    def __init__(self, model: ModelSpec, hw: HardwareSpec, job: JobSpec, profile: Profile | None = None) -> None:
        """With a measured `profile`, op times come from it where it covers them and its measured link tiers
        replace the hardware file's (costmodel/measured.py); the rest stays roofline and datasheet."""
        self.profile = profile
        self.measured: MeasuredOps | None = None
        if profile is not None:
            check_profile_model(profile, model)
            hw = apply_comm(profile, hw)
            self.measured = MeasuredOps(profile) if profile.ops else None
        self.model, self.hw, self.job = model, hw, job
        self.mtp_layers = runs_mtp(model, job)
        if model.is_moe and job.moe_dispatcher == "deepep" and (why := deepep_refusal(hw)):
            raise SpecError(f"--moe-dispatcher deepep: {why}; use --moe-dispatcher alltoall")
        self._layer: dict[tuple[int, int, int, bool, str, bool, int, int], LayerCost] = {}
        self._vocab: dict[tuple, VocabCost] = {}
        self._mtp: dict[tuple[int, int, int, bool], MtpPasses] = {}
        self._op_memo: dict = {}  # op times by shape, shared by every layer cost (compute.memoized_op_time)
        self._ticks: dict[tuple, Ticks] = {}
        self._pipe_comm: dict[tuple, tuple[float, tuple[float, float]]] = {}  # p2p and vocab-parallel, by degrees
        # Plans that differ only in what the pipeline does not see (ZeRO-0 vs 1, buckets, ...) run the same
        # schedule on the same pass times: simulate each distinct one once (bounded: a search meets many).
        self._makespan = lru_cache(maxsize=MAKESPAN_CACHE)(makespan)
        # Plans that differ only in their partition (brute force, partition searches) share their stages' costs
        self._stage_memo: dict[tuple, dict] = {}
        # and plans that differ in what a stage's times (or its state bytes) do not depend on share those
        self._stage_times: dict[tuple, dict] = {}
        self._stage_states: dict[tuple, dict] = {}
        self._exposures: dict[tuple, dict] = {}  # dp_sync_exposed's bucketed exposures by stage shape
        self.model_flops = model_flops_per_step(model, job)
        self.state_bytes = job.state_bytes  # bytes per parameter of the training state, read on every estimate

    def layer(self, tp: int, cp: int, mbs: int, sp: bool, tp_mode: str = "1d", tp_overlap: bool = False,
              ep: int = 1, etp: int = 1, paired: float = 0.0) -> LayerCost:
        """The partition's layer: an MoE model with dense layers places its mean layer (layer.blend_layers);
        with `paired` > 0 (epoverlap.pairing: the share of passes run beside a partner under ep_overlap), with
        that share of its all-to-all overlapped (epoverlap.ep_overlapped)."""
        key = (tp, cp, mbs, sp, tp_mode, tp_overlap, ep, etp, paired)
        if key not in self._layer:
            model = self.model
            if paired:
                self._layer[key] = ep_overlapped(self.layer(*key[:-1]), self.hw, paired)
                return self._layer[key]
            if model.is_moe and model.num_dense_layers and tp_mode == "1d":
                self._layer[key] = blend_layers(self.kind_layer(tp, cp, mbs, sp, tp_overlap, ep, etp, moe=True),
                                                self.kind_layer(tp, cp, mbs, sp, tp_overlap, ep, etp, moe=False),
                                                model.num_dense_layers / model.num_layers, model.moe_layer_freq)
            else:
                self._layer[key] = layer_cost(model, self.hw, self.job, tp=tp, cp=cp, mbs=mbs, sp=sp,
                                              tp_mode=tp_mode, measured=self.measured, tp_overlap=tp_overlap, ep=ep,
                                              etp=etp, op_memo=self._op_memo)
        return self._layer[key]

    def kind_layer(self, tp: int, cp: int, mbs: int, sp: bool, tp_overlap: bool, ep: int, etp: int, *,
                   moe: bool) -> LayerCost:
        """One 1-D tensor-parallel layer of an MoE model, of one kind (the dense one does not depend on ep)."""
        key = (tp, cp, mbs, sp, "moe" if moe else "dense", tp_overlap, ep if moe else 0, etp if moe else 0)
        if key not in self._layer:
            common = dict(tp=tp, cp=cp, mbs=mbs, sp=sp, measured=self.measured, tp_overlap=tp_overlap,
                          op_memo=self._op_memo)
            self._layer[key] = (moe_layer_cost(self.model, self.hw, self.job, ep=ep, etp=etp, **common) if moe
                                else dense_layer_cost(self.model, self.hw, self.job, **common))
        return self._layer[key]

    def vocab(self, tp: int, cp: int, mbs: int, sp: bool, tp_mode: str = "1d", tp_overlap: bool = False,
              ep: int = 1, etp: int = 1, recompute: str = "none") -> VocabCost:
        """The vocabulary layers; with multi-token prediction the output block also holds the MTP modules,
        whose layer depends on the rest of the setting (costmodel/mtp.py)."""
        key = (tp, cp, mbs, sp)
        if key not in self._vocab:
            self._vocab[key] = vocab_cost(self.model, self.hw, self.job, tp=tp, cp=cp, mbs=mbs, sp=sp,
                                          measured=self.measured)
        if not self.mtp_layers:
            return self._vocab[key]
        full = (*key, tp_mode, tp_overlap, ep, etp, recompute)
        if full not in self._vocab:
            shape = layer_shape(self.model, self.job, tp=tp, cp=cp, mbs=mbs, sp=sp)
            if key not in self._mtp:
                self._mtp[key] = mtp_passes(self.model, self.hw, self.job.dtype, shape,
                                            None if self.measured is None else self.measured.lookup(tp, cp),
                                            attention_kernel(self.job))
            self._vocab[full] = with_mtp(self._vocab[key], self._mtp[key],
                                         self.mtp_layer(tp, cp, mbs, sp, tp_mode, tp_overlap, ep, etp), self.model,
                                         shape, recompute)
        return self._vocab[full]

    def mtp_layer(self, tp: int, cp: int, mbs: int, sp: bool, tp_mode: str, tp_overlap: bool, ep: int,
                  etp: int) -> LayerCost:
        """An MTP module's Transformer layer: of the model's last layer's kind (DeepSeek-V3: MoE), not the mean
        layer an MoE model with dense layers places in its partition."""
        model = self.model
        if not model.is_moe or tp_mode != "1d":
            return self.layer(tp, cp, mbs, sp, tp_mode, tp_overlap, ep, etp)
        return self.kind_layer(tp, cp, mbs, sp, tp_overlap, ep, etp, moe=model.is_moe_layer(model.num_layers - 1))

    def op_coverage(self, plan: Plan) -> OpCoverage:
        """Which of the plan's ops (one layer forward and backward, embedding, head) have measured times."""
        tp, mbs, sp = plan.tp, plan.mbs, plan.sequence_parallel
        if plan.tp_mode != "1d":  # a grid layer is the 1-D layer at tp=q, sp, on mbs/act_split (layer.py)
            grid = tp_mode_degrees(plan.tp_mode, plan.tp)
            tp, mbs, sp = grid.q, mbs // grid.act_split, True
        shape = layer_shape(self.model, self.job, tp=tp, cp=plan.cp, mbs=mbs, sp=sp)
        ops = step_ops(self.model, shape)
        return roofline_coverage(ops) if self.measured is None else self.measured.coverage(ops, tp, plan.cp)

    def stages(self, plan: Plan) -> tuple[StageCost, ...]:
        return self._stages(plan, self.ticks(plan))

    def _stages(self, plan: Plan, ticks: Ticks) -> tuple[StageCost, ...]:
        key = (plan.tp, plan.cp, plan.mbs, plan.sequence_parallel)
        layer = self.layer(*key, plan.tp_mode, plan.tp_overlap, plan.ep, plan.etp, pairing(plan))
        vocab = self.vocab(*key, plan.tp_mode, plan.tp_overlap, plan.ep, plan.etp, base_recompute(plan))
        comm_key = (plan.pp, plan.vpp, plan.tp, plan.cp, plan.dp, plan.sequence_parallel, plan.mbs,
                    plan.vocab == "parallel", plan.schedule, plan.num_microbatches)
        if comm_key not in self._pipe_comm:
            tokens = plan.mbs * self.job.seq_len // plan.cp
            vp_comm = (0.0, 0.0)
            if plan.vocab == "parallel":
                vp_comm = vocab_parallel_comm(self.model, self.hw, pp=plan.pp, tp=plan.tp, cp=plan.cp, dp=plan.dp,
                                              tokens=tokens)
            exposed = exposed_p2p_share(self.job, plan.schedule, plan.pp, plan.vpp, plan.num_microbatches)
            self._pipe_comm[comm_key] = p2p_time(plan, self.hw, tokens, self.model.hidden_size, exposed), vp_comm
        p2p_s, vp_comm = self._pipe_comm[comm_key]
        memo = shape_memo((self._stage_memo, self._stage_times, self._stage_states), plan, ticks, p2p_s, vp_comm)
        return build_stages(plan, layer, vocab, self.hw, p2p_s, vp_comm, self.state_bytes, ticks, memo,
                            dense_first=self.dense_first(plan.tp_mode),
                            grads_inline=reduces_inline(self.job, plan.pp, plan.zero))

    def dense_first(self, tp_mode: str) -> int:
        """Dense-first layers a stage may be credited for (stages.build_stages): the model's, for the 1-D layer
        that blends them with its MoE layers (a grid layer is costed without them)."""
        return self.model.first_dense_layers if tp_mode == "1d" else 0

    def timeline(self, plan: Plan) -> Timeline:
        """Every pass of every rank in one step, as the schedule runs them (for the text timeline)."""
        stages = self.stages(plan)
        return simulate(plan.schedule, plan.pp, plan.vpp, plan.num_microbatches, tuple(s.chunks for s in stages),
                        self.ticks(plan))

    def ticks(self, plan: Plan) -> Ticks:
        """The proportions the plan's v-half order is built for (stages.schedule_ticks: they depend on the
        layer and the base recomputation only)."""
        key = (plan.tp, plan.cp, plan.mbs, plan.sequence_parallel, plan.tp_mode, plan.tp_overlap, plan.ep,
               plan.etp, pairing(plan), base_recompute(plan))
        if key not in self._ticks:
            self._ticks[key] = schedule_ticks(plan, self.layer(*key[:-1]))
        return self._ticks[key]

    def dp_sync(self, plan: Plan, stages: tuple[StageCost, ...]) -> float:
        """dp_sync_exposed as the job's trainer runs the reduction and the weights' all-gather."""
        return dp_sync_exposed(plan, self.hw, stages, self.model, self.job.grad_bytes, self._exposures,
                               overlap=overlaps_grad_reduce(self.job, plan.pp, plan.zero),
                               gather_in_step=gathers_params_in_step(self.job, plan.zero))

    def estimate(self, plan: Plan) -> Estimate:
        """Predict step time, throughput and per-stage memory of a plan (assumed valid: see check_plan)."""
        ticks = self.ticks(plan)
        stages = self._stages(plan, ticks)
        m = plan.num_microbatches
        times = list(map(_time_s, stages))
        pipe = self._makespan(plan.schedule, plan.pp, plan.vpp, m, tuple(map(_chunks, stages)), ticks)
        overlap = overlaps_grad_reduce(self.job, plan.pp, plan.zero)
        dp_exposed = self.dp_sync(plan, stages)
        opt = optimizer_time(plan, self.hw, stages)
        step = pipe + dp_exposed + opt
        b = times.index(max(times))  # the first of the slowest
        bs = stages[b]
        breakdown = Breakdown(
            compute_s=m * bs.compute_s, recompute_s=m * bs.recompute_s, tp_comm_s=m * bs.tp_comm_s,
            cp_comm_s=m * bs.cp_comm_s, pp_comm_s=m * bs.pp_comm_s, bubble_s=pipe - m * times[b],
            dp_comm_exposed_s=dp_exposed + m * bs.zero3_comm_s, optimizer_s=opt)
        gpus = plan.num_gpus
        tflops = self.model_flops / step / gpus / 1e12
        return Estimate(
            plan=plan, step_time_s=step, tokens_per_s=self.job.tokens_per_step / step,
            model_tflops_per_gpu=tflops, mfu=tflops * 1e12 / self.hw.peak_flops(self.job.dtype),
            stages=stages, breakdown=breakdown,
            op_seconds=tuple(zip(CATEGORIES, map(mul, repeat(m), bs.by_category))),  # m * t each, in C
            usable_memory_bytes=self.hw.usable_memory_bytes, grads_after_backward=not overlap,
            p2p_exposed=exposed_p2p_share(self.job, plan.schedule, plan.pp, plan.vpp, m))


def dp_sync_exposed(plan: Plan, hw: HardwareSpec, stages: tuple[StageCost, ...], model: ModelSpec,
                    grad_bytes: int = GRAD_BYTES, memo: dict | None = None, overlap: bool = True,
                    gather_in_step: bool = False) -> float:
    """Data-parallel synchronization left exposed at the end (gradients) and start (parameters) of a step.

    Gradients are reduced in buckets while the last micro-batch's backward runs (Megatron's
    overlap_grad_reduce); stage i finishes that backward sum(bwd_j, j < i) before stage 0 does, so that much
    more of its reduction hides. With the distributed optimizer (ZeRO-1/2) gradients are reduce-scattered and
    the updated 16-bit weights all-gathered bucket by bucket during the next step's first forward
    (overlap_param_gather), where stage i starts sum(fwd_j, j < i) late. A tied embedding's gradient is
    all-reduced between the first and last stage after the backward (Megatron's finalize_model_grads).
    `memo`: a dict kept across calls with the same `hw` (a CostModel's), where the exposure of each stage
    shape is remembered per collective, group and bucket, and each group's link. `overlap` False: _unoverlapped.
    `gather_in_step`: the weights' all-gather runs in the optimizer step (overlap.gathers_params_in_step), on each
    stage's whole buffer, as _unoverlapped gathers them.
    """
    exposed = tied_embedding_sync(plan, hw, model, grad_bytes)
    n = plan.dp * plan.cp
    if n == 1 or plan.zero >= 3:
        return exposed
    memo = {} if memo is None else memo
    link = memo.get((comm.group_link, n, plan.tp))  # once per group: every estimate asks, a look-up is a tenth
    if link is None:
        link = memo[comm.group_link, n, plan.tp] = comm.group_link(hw, n, plan.tp)
    reduce = comm.all_reduce if plan.zero == 0 else comm.reduce_scatter
    bucket = memo.get(("bucket", plan.tp, plan.bucket_size))  # at least a whole weight matrix
    if bucket is None:
        bucket = memo["bucket", plan.tp, plan.bucket_size] = max(plan.bucket_size, whole_tensor_bucket(model, plan.tp))
    if not overlap:
        return exposed + _unoverlapped(plan, stages, grad_bytes, reduce, n, link)
    if plan.zero < 2:  # ZeRO-2 reduce-scatters in every micro-batch (stages.zero3_exposed), not once a step
        exposed += _bucketed_over_stages(stages, grad_bytes, bucket, "bwd", lambda b: reduce(b, n, link),
                                         memo.setdefault((reduce, n, plan.tp, grad_bytes, bucket), {}))
    if plan.zero in (1, 2) and gather_in_step:
        exposed += _whole_buffers(stages, WEIGHT_BYTES, comm.all_gather, [s.fwd_s for s in stages], n, link)
    elif plan.zero in (1, 2):
        exposed += _bucketed_over_stages(stages, WEIGHT_BYTES, bucket, "fwd",
                                         lambda b: comm.all_gather(b, n, link),
                                         memo.setdefault((comm.all_gather, n, plan.tp, WEIGHT_BYTES,
                                                          bucket), {}))
    return exposed


def _bucketed_over_stages(stages: tuple[StageCost, ...], bytes_per_param: int, bucket: int, window: str,
                          collective, exposures: dict[tuple[int, float], float]) -> float:
    """max(0, max_i (exposure_i - slack_i)), slack_i = the windows of the stages before i. `exposures`: the
    exposure of each (params, window) under this collective and bucket, kept across calls."""
    times: dict[float, float] = {}  # every stage fills buckets of the same size: time the collective once

    def per_bucket(size: float) -> float:
        if size not in times:
            times[size] = collective(size)
        return times[size]

    worst = slack = 0.0  # stages alike (most of them) expose alike: each shape's exposure is computed once
    last = None
    for shape in map(_params_and[window], stages):  # (params, window), read in C
        if shape == last:  # (one comparison in C)
            # a stage like the one before exposes as much with more slack (w >= 0): it cannot be the worst
            slack += shape[1]
            continue
        last = shape
        exposure = exposures.get(shape)
        if exposure is None:
            if len(exposures) >= EXPOSURE_MEMO:  # bounded, as the other memos: a long search meets many shapes
                exposures.clear()
            params, w = shape
            exposure = exposures[shape] = comm.bucketed_exposure(params * bytes_per_param, bucket * bytes_per_param,
                                                                 w, per_bucket)
        if exposure - slack > worst:  # max(worst, exposure - slack) without the call
            worst = exposure - slack
        slack += shape[1]
    return worst


def _unoverlapped(plan: Plan, stages: tuple[StageCost, ...], grad_bytes: int, reduce, n: int, link) -> float:
    """dp_sync_exposed without overlap (JobSpec.overlap_grad_reduce False): each stage reduces its whole gradient
    buffer in one collective once its backward ends (Megatron-LM's LocalDDP of 2021, allreduce_gradients after
    the pipeline's backward) and gathers its updated weights before its next forward; stage i ends its backward
    sum(bwd_j, j < i) before stage 0 and starts its forward sum(fwd_j, j < i) after, so that much of its
    collective is hidden. A whole buffer is bucketed_exposure's single bucket under no window."""
    phases = [(grad_bytes, reduce, [s.bwd_s for s in stages])] if plan.zero < 2 else []
    if plan.zero in (1, 2):
        phases.append((WEIGHT_BYTES, comm.all_gather, [s.fwd_s for s in stages]))
    return sum(_whole_buffers(stages, nbytes, collective, windows, n, link) for nbytes, collective, windows in phases)


def _whole_buffers(stages: tuple[StageCost, ...], nbytes: int, collective, windows: list[float], n: int,
                   link) -> float:
    """max_i (the collective of stage i's whole buffer - slack_i), slack_i = the windows of the stages before i."""
    worst = slack = 0.0
    for s, w in zip(stages, windows):
        worst = max(worst, collective(s.params * nbytes, n, link) - slack)
        slack += w
    return worst


def tied_embedding_sync(plan: Plan, hw: HardwareSpec, model: ModelSpec, grad_bytes: int = GRAD_BYTES) -> float:
    """All-reduce of the tied word-embedding gradient (V*h/tp; no position table) between the first and the
    last pipeline stage (Megatron's _allreduce_word_embedding_grads)."""
    if not model.tied_embeddings or plan.pp == 1 or plan.schedule == "v-half":  # v-half: both on rank 0
        return 0.0
    link = comm.group_link(hw, plan.pp, plan.tp * plan.cp * plan.dp)
    return comm.all_reduce(model.vocab_size * model.hidden_size // plan.tp * grad_bytes, 2, link)


def optimizer_time(plan: Plan, hw: HardwareSpec, stages: tuple[StageCost, ...]) -> float:
    """Adam step of the slowest stage: memory-bound over the parameters this GPU updates.
    MoE: expert parameters are counted as sharded like the rest (over dp*cp), where Megatron shards them over
    the expert-data-parallel group; the step is a few milliseconds either way and the planner's partition
    model charges it the same way, so the two stay one model."""
    shards = plan.dp * plan.cp if plan.zero >= 1 else 1
    most = max(map(_params, stages))
    return most * ADAM_STEP_BYTES / shards / (hw.hbm_bandwidth * hw.efficiency.memory)
