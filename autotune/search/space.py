"""The search space: every valid combination of degrees, batching, schedule and memory savers.

The planner splits a plan into an outer part enumerated here (degrees, micro-batching, schedule, base
recomputation, ZeRO stage, sequence parallelism) and an inner part CP-SAT decides (layers per stage, layers
under full recomputation, gradient bucket size). Divisibility rules sit next to the generator that obeys them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from autotune.costmodel.epoverlap import paired_share
from autotune.errors import InvalidPlanError, SpecError
from autotune.search.experts import expert_options, moe_sequence_parallel
from autotune.specs.experts import deepep_group_issue
from autotune.specs.job import JobSpec, state_zero_stages
from autotune.specs.model import ModelSpec
from autotune.specs.plan import DEFAULT_BUCKET, default_bucket
from autotune.specs.trainers import TrainerCaps, deepspeed_split, expert_layout_issue
from autotune.specs.tpgrid import check_tp_shapes, tp_mode_degrees

#: Gradient bucket sizes the planner chooses from, in parameters, beside the trainer's own default at the candidate's
#: dp (bucket_menu).
BUCKETS = (10_000_000, 20_000_000, 40_000_000, 80_000_000, 160_000_000, 320_000_000)
MAX_VPP = 8
MAX_CP = 16
#: Micro-batches larger than this many tokens per GPU only add activation memory: the GEMMs of a real model
#: are already at full efficiency (pin --mbs to go beyond it).
MAX_MICROBATCH_TOKENS = 65536
#: Schedules searched unless --schedule says otherwise. v-half is left out: autotune's V-Half order is a greedy
#: list schedule that halves activation memory but, with a backward longer than the forward, keeps a larger
#: bubble than ZB-H1, so it wins only where memory binds, while its weak bounds tripled the search time.
DEFAULT_SCHEDULES = ("1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """Restrictions on each dimension; None leaves it free."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    dp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    schedule: tuple[str, ...] | None = None
    recompute: tuple[str, ...] | None = None
    zero: tuple[int, ...] | None = None
    vocab: tuple[str, ...] | None = None
    sequence_parallel: tuple[bool, ...] | None = None
    layers_per_stage: tuple[int, ...] | None = None
    tp_mode: tuple[str, ...] | None = None
    tp_overlap: tuple[bool, ...] | None = None
    ep_overlap: tuple[bool, ...] | None = None
    """Tensor-parallel modes to consider; None means 1-D only (the mode every trainer but Colossal-AI runs)."""
    buckets: tuple[int, ...] | None = None
    """Gradient bucket sizes; None: BUCKETS and the trainer's own default at each candidate's dp (bucket_menu)."""
    allow_idle: bool = False
    """Let a plan leave GPUs unused (tp*pp*dp*cp < GPUs)."""
    allow_cross_node_tp: bool = False
    """Let tp exceed the GPUs of one node."""
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees (MoE models; None = every one the layout rules allow, search/experts.py)."""
    etp: tuple[int, ...] | None = None
    """Expert-tensor-parallel degrees (MoE models; None = 1 or tp)."""
    trainer: TrainerCaps | None = None
    """Only what this trainer runs (specs/trainers.py); None: everything autotune models."""


def for_trainer(space: SearchSpace, caps: TrainerCaps | None) -> SearchSpace:
    """The space restricted to what the trainer runs; one without a gradient-bucket setting keeps the default
    bucket (the one `check` reads its configs with)."""
    if caps is not None and not caps.gradient_buckets:
        return replace(space, trainer=caps, buckets=(DEFAULT_BUCKET,))
    return replace(space, trainer=caps)


def bucket_menu(space: SearchSpace, trainer: str, dp: int) -> tuple[int, ...]:
    """The gradient buckets a candidate of data-parallel degree dp chooses from: the space's, or BUCKETS and, past
    the largest of them, the bucket the trainer runs by default at that dp (Megatron's grows with dp so that at
    thousands of ranks the latency of its collectives stays bounded: specs/plan.default_bucket). A default inside
    BUCKETS' range is left to them: one more size costs the solver a choice on every candidate (scale took 40% longer)
    for a step within the grid's spacing."""
    if space.buckets is not None:
        return space.buckets
    own = default_bucket(trainer, dp)
    return BUCKETS if own <= BUCKETS[-1] else (*BUCKETS, own)


class Candidate(NamedTuple):
    """The outer part of a plan; CP-SAT completes it with the partition, full recompute and bucket. Immutable
    like the specs; a named tuple because the search builds hundreds of thousands (0.8 us each, where a frozen
    dataclass's __init__ takes 5 us: a quarter of deepseek-v3's search went into building them)."""

    tp: int
    pp: int
    dp: int
    cp: int
    mbs: int
    num_microbatches: int
    schedule: str
    vpp: int
    base: str
    """Recomputation of layers not under full recompute: 'none' or 'selective'."""
    full_min: int
    """Fewest layers per chunk under full recomputation (0 lets the plan use none)."""
    full_max: int
    """Most layers per chunk under full recomputation (0 forbids it)."""
    zero: int
    sp: bool
    vocab: str
    """Vocabulary placement: 'ends' (even split), 'balanced' (free split) or 'parallel' (vocabulary
    parallelism, even split)."""
    tp_mode: str = "1d"
    """Tensor-parallel mode (2-D/2.5-D/3-D grids only when the space asks for them)."""
    tp_overlap: bool = False
    """Tensor-parallel collectives pipelined with the GEMMs (needs sequence parallelism)."""
    ep: int = 1
    """Expert-parallel degree (MoE models; search/experts.py)."""
    etp: int = 1
    """Expert-tensor-parallel degree (MoE models)."""
    ep_overlap: bool = False
    """The expert all-to-all overlapped with another micro-batch's compute (specs.experts.check_ep_overlap)."""

    @property
    def even_only(self) -> bool:
        """The layers split evenly ('ends' and 'parallel')."""
        return self.vocab != "balanced"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def degree_values(n: int, space: SearchSpace) -> list[int]:
    """The values a degree may take with n GPUs left for it and the degrees after it: the divisors of n, or any
    count up to n with idle GPUs allowed (what does not divide n leaves GPUs idle)."""
    return list(range(1, n + 1)) if space.allow_idle else divisors(n)


def _allowed(values: list, pins: tuple | None) -> list:
    return values if pins is None else [v for v in values if v in pins]


def tp_options(model: ModelSpec, gpus: int, gpus_per_node: int, space: SearchSpace) -> list[tuple[str, int]]:
    """(mode, tp) pairs. 1-D: tp divides the query and key/value heads (Megatron) and, by default, stays in a
    node (_in_node). 2-D/2.5-D/3-D: tp is a grid (q^2, d*q^2, q^3) whose side divides the heads and widths; grids
    span nodes by design. The micro-batch rule of a grid is checked per micro-batch size."""
    out = []
    for mode in space.tp_mode or ("1d",):
        if space.trainer is not None and mode not in space.trainer.tp_modes:
            continue
        if mode == "1d":
            limit = None if space.allow_cross_node_tp else gpus_per_node
            values = [d for d in divisors(model.num_heads)
                      if model.num_kv_heads % d == 0 and (limit is None or _in_node(d, limit, gpus))]
        else:
            values = [d for d in degree_values(gpus, space) if d > 1 and grid_fits(mode, d, model)]
        out += [(mode, tp) for tp in _allowed(values, space.tp)]
    return out


def _in_node(tp: int, gpus_per_node: int, gpus: int) -> bool:
    """Whether every tp group sits inside a node: tp fits one, and divides it where the job spans several."""
    return tp <= gpus_per_node and (gpus <= gpus_per_node or gpus_per_node % tp == 0)


def grid_fits(mode: str, tp: int, model: ModelSpec) -> bool:
    """Whether tp forms a grid of this mode that splits the model's heads and widths (any micro-batch aside)."""
    try:
        grid = tp_mode_degrees(mode, tp)
        check_tp_shapes(grid, model, grid.act_split)
    except InvalidPlanError:
        return False
    return True


def _mbs_fits(mode: str, tp: int, mbs: int) -> bool:
    return mode == "1d" or mbs % tp_mode_degrees(mode, tp).act_split == 0


def cp_options(job: JobSpec, gpus: int, space: SearchSpace) -> list[int]:
    """cp splits the sequence into 2*cp load-balanced chunks (Megatron requires seq % 2cp == 0)."""
    cap = max(space.cp) if space.cp else MAX_CP
    if space.trainer is not None and not space.trainer.cp:
        cap = 1
    values = [d for d in degree_values(gpus, space) if d <= cap and (d == 1 or job.seq_len % (2 * d) == 0)]
    return _allowed(values, space.cp)


def degree_options(model: ModelSpec, job: JobSpec, gpus: int, gpus_per_node: int,
                   space: SearchSpace) -> Iterator[tuple[str, int, int, int, int]]:
    """(tp_mode, tp, cp, pp, dp) with tp*cp*pp*dp == gpus (or <= with allow_idle, any degree then leaving GPUs
    idle) and dp dividing the batch."""
    for mode, tp in tp_options(model, gpus, gpus_per_node, space):
        for cp in cp_options(job, gpus, space):
            if tp * cp > gpus or (gpus % (tp * cp) and not space.allow_idle):
                continue
            for pp in _allowed(degree_values(gpus // (tp * cp), space), space.pp):
                if pp > model.num_layers or not _trainer_degrees(space.trainer, model, cp, pp):
                    continue
                rest = gpus // (tp * cp * pp)
                dps = [d for d in range(1, rest + 1)] if space.allow_idle else [rest]
                for dp in _allowed(dps, space.dp):
                    if job.global_batch % dp == 0:
                        yield mode, tp, cp, pp, dp


def _trainer_degrees(caps: TrainerCaps | None, model: ModelSpec, cp: int, pp: int) -> bool:
    """The trainer's rules on the degrees alone: cp beside a pipeline, tied embeddings beside a pipeline."""
    if caps is None or pp == 1:
        return True
    return (cp == 1 or caps.cp_with_pp) and (caps.tied_with_pp or not model.tied_embeddings)


def pinned_layers(space: SearchSpace, pp: int, num_layers: int) -> tuple[int, ...] | None:
    """The partition a candidate with this pp must take: --layers-per-stage, or the one split the trainer
    runs (DeepSpeed's partition_method); None leaves it to the solver."""
    if space.layers_per_stage is None and space.trainer is not None and space.trainer.split == "deepspeed":
        return deepspeed_split(num_layers, pp)
    return space.layers_per_stage


def schedule_options(model: ModelSpec, pp: int, m: int, space: SearchSpace) -> list[tuple[str, int]]:
    """1F1B and ZB-H1 (one chunk per rank), interleaved with v chunks where each chunk gets whole layers and
    m % pp == 0 (Megatron), and v-half (two chunks in a V, pp >= 2) when --schedule names it."""
    out = []
    caps = space.trainer
    runs = caps.schedules if caps is not None else ("1f1b", "interleaved", "zb-h1", "v-half")
    max_vpp = min(MAX_VPP, caps.max_vpp) if caps is not None else MAX_VPP
    for name, v in (("1f1b", 1), ("zb-h1", 1), ("v-half", 2)):
        if name not in runs:
            continue
        if name != "1f1b" and (pp < 2 or (name == "v-half" and model.num_layers < 2 * pp)):
            continue
        if name == "v-half" and (space.schedule is None or "v-half" not in space.schedule):
            continue  # searched when asked for: see DEFAULT_SCHEDULES
        if (space.schedule is None or name in space.schedule) and (space.vpp is None or v in space.vpp):
            out.append((name, v))
    if pp >= 2 and m % pp == 0 and (space.schedule is None or "interleaved" in space.schedule) \
            and "interleaved" in runs:
        for v in range(2, max_vpp + 1):
            if model.num_layers % v == 0 and model.num_layers // v >= pp and (space.vpp is None or v in space.vpp):
                out.append(("interleaved", v))
    return out


def recompute_options(model: ModelSpec, pp: int, vpp: int, space: SearchSpace) -> list[tuple[str, int, int]]:
    """(base, fewest, most layers per chunk under full recompute). 'none' and partial/whole 'full' are one
    family (full on 0..all layers of a chunk); 'selective' is its own."""
    pins, caps = space.recompute, space.trainer
    most = model.num_layers // vpp  # a chunk never holds more layers than this
    out = []
    allow_none = pins is None or "none" in pins
    allow_full = pins is None or "full" in pins
    if caps is not None and not caps.partial_recompute:  # whole layers: none, or full on every layer
        out += [("none", 0, 0)] if allow_none else []
        out += [("none", most, most)] if allow_full else []
    elif allow_none or allow_full:
        out.append(("none", 0 if allow_none else 1, most if allow_full else 0))
    if (pins is None or "selective" in pins) and (caps is None or caps.selective_recompute):
        out.append(("selective", 0, 0))
    return out


def enumerate_candidates(model: ModelSpec, job: JobSpec, gpus: int, gpus_per_node: int,
                         space: SearchSpace) -> Iterator[Candidate]:
    """Every outer combination the rules allow, in a fixed order."""
    if space.layers_per_stage is not None and space.pp is not None and len(space.pp) != 1:
        raise SpecError("--layers-per-stage pins the partition, so --pp must be one value")
    deepep = model.is_moe and job.moe_dispatcher == "deepep"
    for mode, tp, cp, pp, dp in degree_options(model, job, gpus, gpus_per_node, space):
        if space.layers_per_stage is not None and len(space.layers_per_stage) != pp:
            continue
        # what depends on the degrees alone is taken once, not per candidate (issue 13: a third of the time
        # went into these calls); the loops below yield in the same order as ones that asked each time
        zeros = _allowed(_zero_options(space.trainer, job, pp), space.zero)
        layouts = {zero: _expert_layouts(model, space, gpus_per_node, deepep, tp, cp, dp, zero) for zero in zeros}
        sps = moe_sequence_parallel(model, tp, [True, False] if tp > 1 and mode == "1d" else [False])
        sp_overlap = [(sp, overlap) for sp in _allowed(_trainer_sp(space.trainer, job, sps, tp, cp),
                                                       space.sequence_parallel)
                      for overlap in _allowed(_overlap_options(space.trainer, job, sp), space.tp_overlap)]
        overlaps = _ep_overlap_options(model, job, space)
        local = job.global_batch // dp
        mbs_options = divisors(local) if space.mbs else [d for d in divisors(local)
                                                         if d * job.seq_len // cp <= MAX_MICROBATCH_TOKENS or d == 1]
        for mbs in _allowed(mbs_options, space.mbs):
            if not _mbs_fits(mode, tp, mbs):
                continue
            m = local // mbs
            for schedule, vpp in schedule_options(model, pp, m, space):
                vocabs = _vocab_options(space, model, pp, schedule)
                for base, fmin, fmax in recompute_options(model, pp, vpp, space):
                    for zero in zeros:
                        for sp, overlap in sp_overlap:
                            for vocab in vocabs:
                                for ep, etp in layouts[zero]:
                                    for ep_overlap in (overlaps(ep, pp, schedule, fmin, vpp, m) if overlaps else OFF):
                                        yield Candidate(tp, pp, dp, cp, mbs, m, schedule, vpp, base, fmin,
                                                        0 if ep_overlap else fmax, zero, sp, vocab, mode, overlap,
                                                        ep, etp, ep_overlap)


def _expert_layouts(model: ModelSpec, space: SearchSpace, gpus_per_node: int, deepep: bool, tp: int, cp: int,
                    dp: int, zero: int) -> list[tuple[int, int]]:
    """(ep, etp) pairs of the degrees that the trainer builds and, with DeepEP, whose group its kernels run over."""
    out = []
    for ep, etp in expert_options(model, tp, cp, dp, space.ep, space.etp):
        if model.is_moe and space.trainer is not None and expert_layout_issue(space.trainer, tp, cp, zero, ep, etp):
            continue  # an expert layout the trainer does not build
        if deepep and deepep_group_issue(ep * etp, gpus_per_node):
            continue  # a group DeepEP's kernels do not run over
        out.append((ep, etp))
    return out


def _zero_options(caps: TrainerCaps | None, job: JobSpec, pp: int) -> list[int]:
    """ZeRO stages: 2 and 3 shard gradients, which a pipeline forbids; those the job's Adam states are costed under
    (JobSpec.state_zero_stages); the trainer's own stages."""
    # the kernels' trainer (check_plan's rule) and the trainer that runs the plan must both keep the states there
    costed = set(job.state_zero_stages) & set(state_zero_stages(job.trainer if caps is None else caps.name,
                                                                job.optimizer_states))
    stages = [z for z in ([0, 1] if pp > 1 else [0, 1, 2, 3]) if z in costed]
    return stages if caps is None else [z for z in stages if z in caps.zero_stages(pp)]


def _trainer_sp(caps: TrainerCaps | None, job: JobSpec, sps: list[bool], tp: int, cp: int) -> list[bool]:
    """Sequence-parallel settings the trainer runs (torchtitan also needs seq_len % (tp x 2cp) == 0)."""
    if caps is None:
        return sps
    ring = 2 * cp if cp > 1 else 1
    return [sp for sp in sps if sp in caps.sequence_parallel
            and not (caps.sp_seq_divisor and job.seq_len % ((tp if sp else 1) * ring))]


def _overlap_options(caps: TrainerCaps | None, job: JobSpec, sp: bool) -> list[bool]:
    """TP overlap needs sequence parallelism, a trainer that has it and, for torchtitan, torch.compile."""
    if not sp:
        return [False]
    if caps is not None and not (caps.tp_overlap and (job.fused_kernels or not caps.tp_overlap_needs_fused)):
        return [False]
    return [True, False]


#: The overlap settings of a candidate that cannot overlap its expert all-to-all
OFF = (False,)


def _ep_overlap_options(model: ModelSpec, job: JobSpec, space: SearchSpace):
    """The expert all-to-all overlap settings of a candidate (ep, pp, schedule, fewest fully recomputed layers,
    vpp, micro-batches):
    on where Megatron runs it (specs.experts.check_ep_overlap), which then bars full recomputation; off always.
    None where no candidate can have it (a dense model, another trainer, pinned off): OFF for all, unasked."""
    caps = space.trainer
    able = model.is_moe and job.trainer == "megatron" and (caps is None or caps.ep_overlap) and \
        model.mtp_layers <= 1 and True in (space.ep_overlap or (True,))
    off = [False] if False in (space.ep_overlap or (False,)) else []
    if not able and off:
        return None

    def options(ep: int, pp: int, schedule: str, fmin: int, vpp: int, m: int) -> list[bool]:
        if able and ep > 1 and fmin == 0 and (schedule == "interleaved" if pp > 1 else not model.mtp_layers) \
                and paired_share(pp, vpp, m) > 0:  # (nothing to pair: one micro-batch, or all in warm-up)
            return [True, *off]
        return off
    return options


def _vocab_options(space: SearchSpace, model: ModelSpec, pp: int, schedule: str) -> list[str]:
    """'ends' forces the even split; 'balanced' leaves the split free (which includes the even one, so it
    subsumes 'ends'); 'parallel' needs pp >= 2, a non-interleaved schedule, untied embeddings and no MTP modules."""
    allowed = space.vocab or ("ends", "balanced", "parallel")
    if space.trainer is not None:
        allowed = tuple(v for v in allowed if v in space.trainer.vocabs)
    out = ["balanced" if "balanced" in allowed else "ends"] if {"ends", "balanced"} & set(allowed) else []
    if "parallel" in allowed and pp >= 2 and schedule != "interleaved" and not model.tied_embeddings \
            and not model.mtp_layers:
        out.append("parallel")
    return out
