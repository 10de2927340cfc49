"""How it is parallelized: one point of the search space, and the rules every plan must obey."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Literal

from autotune.errors import InvalidPlanError
from autotune.specs._strict import check_keys
from autotune.specs.experts import check_ep_overlap, check_experts, deepep_group_issue
from autotune.specs.limits import MAX_BUCKET, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, check_max
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.tpgrid import MODES, check_tp_shapes, tp_mode_degrees

Schedule = Literal["1f1b", "interleaved", "zb-h1", "v-half"]
Recompute = Literal["none", "selective", "full"]
Vocab = Literal["ends", "balanced", "parallel"]
SCHEDULES = ("1f1b", "interleaved", "zb-h1", "v-half")
RECOMPUTES = ("none", "selective", "full")
VOCABS = ("ends", "balanced", "parallel")
#: The smallest default DDP bucket of Megatron-Core, 40M parameters, and the bucket autotune costs for trainers that
#: set none (torchtitan, Colossal-AI)
DEFAULT_BUCKET = 40_000_000
#: DeepSpeed's default reduce_bucket_size and allgather_bucket_size, in elements (deepspeed 0.19.8,
#: runtime/zero/config.py: pp_int(5e8))
DEEPSPEED_BUCKET = 500_000_000


def default_bucket(trainer: str, dp: int) -> int:
    """The gradient bucket, in parameters, a trainer runs when its config sets none, at data-parallel degree dp.
    Megatron-Core grows it with dp, max(40M, 1M x dp) over the data-parallel group without context parallelism
    (megatron-core 0.16.1 distributed/distributed_data_parallel.py: "make buckets larger to ensure that chunks used
    in NCCL ring-reduce implementations are large enough to remain bandwidth-bound rather than latency-bound"), so
    the number of collectives a step pays latency on stops growing with dp."""
    if trainer == "megatron":
        return max(DEFAULT_BUCKET, 1_000_000 * dp)
    return DEEPSPEED_BUCKET if trainer == "deepspeed" else DEFAULT_BUCKET


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A complete parallel plan: degrees, batching, schedule, memory savers and the pipeline partition."""

    tp: int
    """Tensor-parallel degree (Megatron 1-D split of every linear layer)."""
    pp: int
    """Pipeline-parallel degree (ranks, not virtual stages)."""
    dp: int
    """Data-parallel degree."""
    cp: int = 1
    """Context-parallel degree (the sequence split over ranks, ring attention)."""
    mbs: int = 1
    """Micro-batch size in sequences."""
    num_microbatches: int = 1
    """Micro-batches per optimizer step on each data-parallel rank."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule."""
    vpp: int = 1
    """Model chunks per pipeline rank: > 1 for the interleaved schedule, 2 for v-half (the V), else 1."""
    recompute: Recompute = "none"
    """Activation recomputation granularity."""
    recompute_layers: int | None = None
    """With full recompute: layers per stage recomputed (Megatron's block method); None = all of them."""
    zero: int = 0
    """ZeRO stage: 1 = distributed optimizer, 2 = also gradients, 3 = also weights (FSDP)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (norm/dropout split over tp; all-reduce becomes RS + AG)."""
    vocab: Vocab = "ends"
    """'ends': embedding on the first stage, LM head + loss on the last, layers split evenly; 'balanced': the
    same placement with uneven layer counts; 'parallel': vocabulary parallelism (paper 4), the embedding and
    the output layer split evenly over all pipeline ranks, layers split evenly."""
    layers_per_stage: tuple[int, ...] = ()
    """Transformer layers on each pipeline rank, first to last."""
    bucket_size: int = DEFAULT_BUCKET
    """Data-parallel gradient bucket, in parameters (Megatron's --ddp-bucket-size)."""
    tp_mode: str = "1d"
    """Tensor-parallel mode: 1-D (Megatron), 2-D (q x q), 2.5-D (d x q x q) or 3-D (q x q x q), paper 2."""
    tp_overlap: bool = False
    """Tensor-parallel collectives overlapped with the GEMMs beside them (Megatron's --tp-comm-overlap with
    Transformer Engine userbuffers, torchtitan's async TP); needs sequence parallelism."""
    ep: int = 1
    """Expert-parallel degree (MoE models): each GPU holds num_experts/ep routed experts and tokens travel to
    them by all-to-all. Megatron folds it into the tp*cp*dp GPUs of a pipeline stage, so it adds no GPUs."""
    etp: int = 1
    """Expert-tensor-parallel degree: each routed expert's MLP split etp ways, independent of the attention's
    tp. Megatron's own default is etp = tp (--expert-tensor-parallel-size unset); autotune's plans always state
    it and the emitters write it out, so 1 here means 1."""
    ep_overlap: bool = False
    """The expert all-to-all of one micro-batch overlapped with the compute of another (Megatron's
    --overlap-moe-expert-parallel-comm: each forward runs beside the previous micro-batch's backward)."""

    @property
    def model_parallel(self) -> int:
        """GPUs holding one replica of the model."""
        return self.tp * self.pp * self.cp

    @property
    def num_gpus(self) -> int:
        """GPUs the plan uses."""
        return self.tp * self.pp * self.dp * self.cp

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of ../shared/CLI.md (keys in a fixed order)."""
        return {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "mbs": self.mbs,
            "num_microbatches": self.num_microbatches, "vpp": self.vpp, "schedule": self.schedule,
            "recompute": self.recompute, "recompute_layers": self.recompute_layers, "zero": self.zero,
            "sequence_parallel": self.sequence_parallel, "vocab": self.vocab,
            "layers_per_stage": list(self.layers_per_stage), "bucket_size": self.bucket_size,
            "tp_mode": self.tp_mode, "tp_overlap": self.tp_overlap,
        } | ({"ep": self.ep, "etp": self.etp} if (self.ep, self.etp) != (1, 1) else {}) | (
            {"ep_overlap": True} if self.ep_overlap else {})

    @property
    def expert_dp(self) -> int:
        """Megatron's expert-data-parallel degree: the tp*cp*dp GPUs of a stage regrouped as etp x ep x edp."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.etp))


_REQUIRED = ("tp", "pp", "dp", "mbs", "num_microbatches", "layers_per_stage")
_OPTIONAL = ("cp", "vpp", "schedule", "recompute", "recompute_layers", "zero", "sequence_parallel", "vocab",
             "bucket_size", "tp_mode", "tp_overlap", "ep", "etp", "ep_overlap")


def plan_from_dict(data: Any, where: str, trainer: str = "megatron") -> Plan:
    """Read a plan object (or a whole `plan --json` document holding one under "plan"); without a bucket_size, the
    gradient bucket `trainer` runs by default at its dp (default_bucket)."""
    if isinstance(data, dict) and isinstance(data.get("plan"), dict):
        data = data["plan"]
    check_keys(data, required=_REQUIRED, optional=_OPTIONAL, where=where)
    ints = {}
    for key in ("tp", "pp", "dp", "cp", "mbs", "num_microbatches", "vpp", "zero", "bucket_size", "ep", "etp"):
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidPlanError(f"{where}: {key} must be an integer, got {value!r}")
            ints[key] = value
    layers = data["layers_per_stage"]
    if not isinstance(layers, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in layers):
        raise InvalidPlanError(f"{where}: layers_per_stage must be a list of integers, got {layers!r}")
    _check_sizes(ints, layers, where)
    extra: dict[str, Any] = {}
    for key, options in (("schedule", SCHEDULES), ("recompute", RECOMPUTES), ("vocab", VOCABS), ("tp_mode", MODES)):
        if key in data:
            if data[key] not in options:
                raise InvalidPlanError(f"{where}: {key} must be one of {', '.join(options)}, got {data[key]!r}")
            extra[key] = data[key]
    for key in ("sequence_parallel", "tp_overlap", "ep_overlap"):
        if key in data:
            if not isinstance(data[key], bool):
                raise InvalidPlanError(f"{where}: {key} must be true or false")
            extra[key] = data[key]
    if data.get("recompute_layers") is not None:
        if not isinstance(data["recompute_layers"], int) or isinstance(data["recompute_layers"], bool):
            raise InvalidPlanError(f"{where}: recompute_layers must be an integer or null")
        extra["recompute_layers"] = data["recompute_layers"]
    ints.setdefault("bucket_size", default_bucket(trainer, ints["dp"]))
    return Plan(layers_per_stage=tuple(layers), **ints, **extra)


def _check_sizes(ints: dict[str, int], layers: list[int], where: str) -> None:
    """The documented maxima (specs/limits.py), before anything is sized from the plan."""
    gpus = 1
    for key in ("tp", "pp", "dp", "cp"):
        gpus *= max(1, check_max(ints.get(key, 1), MAX_GPUS, key, where))
    check_max(gpus, MAX_GPUS, "tp*pp*dp*cp", where)
    check_max(ints.get("num_microbatches", 1), MAX_GLOBAL_BATCH, "num_microbatches", where)
    check_max(ints.get("mbs", 1), MAX_GLOBAL_BATCH, "mbs", where)
    check_max(ints.get("vpp", 1), MAX_LAYERS, "vpp", where)
    check_max(ints.get("ep", 1), MAX_GPUS, "ep", where)
    check_max(ints.get("etp", 1), MAX_GPUS, "etp", where)
    check_max(len(layers), MAX_LAYERS, "len(layers_per_stage)", where)
    check_max(max(layers, default=0), MAX_LAYERS, "layers_per_stage entry", where)


def even_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """The obvious baseline partition: layers as even as possible, extra layers on the middle stages first."""
    base, extra = divmod(num_layers, pp)
    counts = [base] * pp
    # Extra layers go to the middle, away from the stages that carry the vocabulary layers.
    order = sorted(range(pp), key=lambda i: (i in (0, pp - 1), abs(i - (pp - 1) / 2), i))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


@lru_cache(maxsize=4096)  # pure, and asked several times for every stage kind of every estimate (issue 13)
def chunk_layers(n: int, v: int) -> tuple[int, ...]:
    """Transformer layers of each of a rank's v model chunks: n split as evenly as possible, the extra layers on
    the earlier chunks (what Megatron's --pipeline-model-parallel-layout is emitted with)."""
    base, extra = divmod(n, v)
    return tuple(base + (1 if c < extra else 0) for c in range(v))


def is_even_split(layers: tuple[int, ...]) -> bool:
    """Whether stage layer counts differ by at most one (the 'ends' vocabulary placement)."""
    return max(layers) - min(layers) <= 1


def positions_issue(model: ModelSpec, seq_len: int) -> str | None:
    """A learned position table has no row past its length: a longer sequence cannot be trained (None: fine)."""
    if model.position_embedding == "learned" and model.max_position_embeddings and \
            seq_len > model.max_position_embeddings:
        return (f"--seq-len {seq_len} exceeds the {model.max_position_embeddings} learned positions of {model.name} "
                f"(max_position_embeddings); use --seq-len <= {model.max_position_embeddings}")
    return None


def check_plan(plan: Plan, model: ModelSpec, job: JobSpec, num_gpus: int, gpus_per_node: int, *,
               allow_idle: bool = False, allow_cross_node_tp: bool = False) -> None:
    """Raise InvalidPlanError naming the first rule the plan breaks and how to fix it."""
    for key in ("tp", "pp", "dp", "cp", "mbs", "num_microbatches", "vpp", "bucket_size", "ep", "etp"):
        if getattr(plan, key) < 1:
            raise InvalidPlanError(f"{key} must be >= 1, got {getattr(plan, key)}")
    if plan.bucket_size > MAX_BUCKET:  # a typo, not a bucket
        raise InvalidPlanError(f"bucket_size {plan.bucket_size} exceeds {MAX_BUCKET:,} parameters; give a bucket "
                               "of at most a model's size")
    used = plan.num_gpus
    if used != num_gpus and not (allow_idle and used < num_gpus):
        raise InvalidPlanError(f"tp*pp*dp*cp = {plan.tp}*{plan.pp}*{plan.dp}*{plan.cp} = {used} GPUs, but --gpus is "
                               f"{num_gpus}; change a degree so the product is {num_gpus}")
    if plan.tp_mode != "1d":
        _check_grid(plan, model)
    elif model.num_heads % plan.tp or model.num_kv_heads % plan.tp:
        raise InvalidPlanError(f"tp {plan.tp} must divide num_heads {model.num_heads} and num_kv_heads "
                               f"{model.num_kv_heads}; pick a tp that divides both")
    elif plan.tp > gpus_per_node and not allow_cross_node_tp:
        raise InvalidPlanError(f"tp {plan.tp} exceeds the {gpus_per_node} GPUs of a node; use tp <= {gpus_per_node} "
                               "or pass --allow-cross-node-tp")
    elif gpus_per_node % plan.tp and num_gpus > gpus_per_node and not allow_cross_node_tp:
        raise InvalidPlanError(f"tp {plan.tp} does not divide the {gpus_per_node} GPUs of a node, so some tp groups "
                               "would straddle two nodes; pick a tp that divides it or pass --allow-cross-node-tp")
    if (why := positions_issue(model, job.seq_len)) is not None:
        raise InvalidPlanError(why)
    if plan.cp > 1 and job.seq_len % (2 * plan.cp):
        raise InvalidPlanError(f"cp {plan.cp} needs seq_len divisible by 2*cp = {2 * plan.cp} (load-balanced "
                               f"ring attention), got {job.seq_len}")
    if plan.dp * plan.mbs * plan.num_microbatches != job.global_batch:
        raise InvalidPlanError(f"global batch {job.global_batch} != dp {plan.dp} x mbs {plan.mbs} x microbatches "
                               f"{plan.num_microbatches}; pick mbs and microbatches whose product with dp is "
                               f"{job.global_batch}")
    if plan.sequence_parallel and plan.tp == 1:
        raise InvalidPlanError("sequence_parallel needs tp > 1; set it to false")
    if plan.tp_overlap and not plan.sequence_parallel:
        raise InvalidPlanError("tp_overlap overlaps sequence parallelism's all-gathers and reduce-scatters with "
                               "the GEMMs: it needs sequence_parallel true (and tp > 1); set tp_overlap false")
    if plan.zero not in (0, 1, 2, 3):
        raise InvalidPlanError(f"zero must be 0, 1, 2 or 3, got {plan.zero}")
    if plan.zero >= 2 and plan.pp > 1:
        raise InvalidPlanError(f"zero {plan.zero} shards gradients, which autotune does not cost with pipeline "
                               "parallelism (DeepSpeed refuses it; torchtitan's FSDP under pp keeps the gathered "
                               "weights across micro-batches, which zero 1 costs); use zero 0 or 1 with pp > 1")
    if plan.zero not in job.state_zero_stages:
        raise InvalidPlanError(f"{job.optimizer_states} optimizer states are costed in Megatron's distributed "
                               f"optimizer (its precision-aware optimizer needs one; its FSDP keeps fp32 master "
                               f"weights), got zero {plan.zero}; use zero 1 or --optimizer-states fp32")
    _check_partition(plan, model)
    _check_schedule(plan)
    _check_recompute(plan)
    check_experts(plan, model)
    check_ep_overlap(plan, model, job.trainer)
    if model.is_moe and job.moe_dispatcher == "deepep" and (why := deepep_group_issue(plan.ep * plan.etp,
                                                                                        gpus_per_node)):
        raise InvalidPlanError(f"the deepep MoE dispatcher: {why}")


def _check_grid(plan: Plan, model: ModelSpec) -> None:
    """2-D/2.5-D/3-D tensor parallelism: the grid's degree rule and divisibility; these modes span nodes by
    design, and sequence parallelism is a 1-D notion (the grid splits the token rows already)."""
    if plan.tp_mode not in MODES:
        raise InvalidPlanError(f"tp_mode must be one of {', '.join(MODES)}, got {plan.tp_mode!r}")
    check_tp_shapes(tp_mode_degrees(plan.tp_mode, plan.tp), model, plan.mbs)
    if plan.sequence_parallel:
        raise InvalidPlanError(f"sequence_parallel applies to 1-D tensor parallelism; set it to false for "
                               f"tp_mode {plan.tp_mode}")


def _check_partition(plan: Plan, model: ModelSpec) -> None:
    layers = plan.layers_per_stage
    if len(layers) != plan.pp:
        raise InvalidPlanError(f"layers_per_stage has {len(layers)} entries but pp is {plan.pp}; give one per stage")
    if any(n < 0 for n in layers) or sum(layers) != model.num_layers:
        raise InvalidPlanError(f"layers_per_stage {list(layers)} must be >= 0 and sum to num_layers "
                               f"{model.num_layers} (they sum to {sum(layers)})")
    if plan.vocab in ("ends", "parallel") and not is_even_split(layers):
        raise InvalidPlanError(f"vocab '{plan.vocab}' means an even split, but layers_per_stage is {list(layers)}; "
                               "use vocab 'balanced' for an uneven one")
    if plan.vocab == "parallel":
        if plan.pp < 2:
            raise InvalidPlanError("vocab 'parallel' splits the vocabulary layers over pipeline ranks and needs "
                                   "pp >= 2; use vocab 'ends'")
        if plan.schedule == "interleaved":
            raise InvalidPlanError("vocab 'parallel' runs with the 1f1b, zb-h1 or v-half schedule, not "
                                   "interleaved (as the vocabulary-parallel Megatron fork); change one of them")
        if model.tied_embeddings:
            raise InvalidPlanError("vocab 'parallel' needs untied input and output embeddings (the fork requires "
                                   "--untie-embeddings-and-output-weights); use vocab 'ends' or 'balanced'")
        if model.mtp_layers:
            raise InvalidPlanError(f"vocab 'parallel' splits the output layer over the pipeline ranks, but the "
                                   f"model's {model.mtp_layers} multi-token prediction module(s) run whole on the "
                                   "last one; use vocab 'ends' or 'balanced'")


def _check_schedule(plan: Plan) -> None:
    if plan.schedule in ("1f1b", "zb-h1") and plan.vpp != 1:
        raise InvalidPlanError(f"vpp {plan.vpp} needs schedule 'interleaved'; {plan.schedule} has vpp 1")
    if plan.schedule in ("zb-h1", "v-half") and plan.pp < 2:
        raise InvalidPlanError(f"the {plan.schedule} schedule needs pp >= 2; use 1f1b")
    if plan.schedule == "v-half":
        if plan.vpp != 2:
            raise InvalidPlanError(f"v-half places two model chunks per rank in a V: vpp must be 2, got {plan.vpp}")
        if any(n % 2 for n in plan.layers_per_stage):
            fix = ("their total is odd, so no split has that: use another schedule" if sum(plan.layers_per_stage) % 2
                   else "give --layers-per-stage with even counts")
            raise InvalidPlanError(f"v-half splits every rank's layers into two equal chunks: every stage's layer "
                                   f"count must be even, got {list(plan.layers_per_stage)}; {fix}")
    if plan.schedule == "interleaved":
        if plan.pp < 2 or plan.vpp < 2:
            raise InvalidPlanError("the interleaved schedule needs pp >= 2 and vpp >= 2")
        if plan.num_microbatches % plan.pp:
            raise InvalidPlanError(f"the interleaved schedule needs num_microbatches ({plan.num_microbatches}) "
                                   f"divisible by pp ({plan.pp})")


def _check_recompute(plan: Plan) -> None:
    if plan.recompute_layers is None:
        return
    if plan.recompute != "full":
        raise InvalidPlanError("recompute_layers applies only to recompute 'full'; remove it or set recompute full")
    if not 1 <= plan.recompute_layers <= max(plan.layers_per_stage):
        raise InvalidPlanError(f"recompute_layers must be in 1..{max(plan.layers_per_stage)}, "
                               f"got {plan.recompute_layers}")


def largest_chunk(plan: Plan) -> int:
    """Layers of the plan's largest model chunk (chunk_layers puts a rank's extra layers on its first chunks)."""
    return max(max(chunk_layers(n, plan.vpp)) for n in plan.layers_per_stage)


def normalized(plan: Plan) -> Plan:
    """The canonical form of a plan: recompute_layers covering every layer of the largest model chunk (it counts
    per chunk, as Megatron's block method does) means plain full recompute."""
    if plan.recompute_layers is not None and plan.recompute_layers >= largest_chunk(plan):
        return replace(plan, recompute_layers=None)
    return plan
