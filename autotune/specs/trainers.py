"""What each trainer runs: one capability row per trainer (and per Megatron-LM fork), read by the search and the
emitters alike.

Each row is derived from what the emitters express without a warning (autotune/emit/*.py) and from
../shared/TRAINERS.md; the comment beside a field gives the trainer's own source. `unsupported` lists what a
plan asks that a trainer does not run (the emitter would swap in something weaker), `refusal` what the trainer
rejects outright, and `as_run` the plan the trainer does run instead (for an honest re-estimate).

Forks are rows of their own, searched only when named (`--trainer megatron --fork vocab-parallel`): the
vocabulary-parallel fork (sail-sg/VocabularyParallelism) and the zero-bubble fork
(sail-sg/zero-bubble-pipeline-parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from autotune.errors import SpecError
from autotune.specs.experts import ep_overlap_issue
from autotune.specs.job import JobSpec, state_zero_stages
from autotune.specs.model import ModelSpec
from autotune.specs.overlap import gathers_params_in_step, overlaps_grad_reduce
from autotune.specs.plan import DEFAULT_BUCKET, Plan, is_even_split
from autotune.specs.tpgrid import MODES

Split = Literal["any", "even", "deepspeed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerCaps:
    """What one trainer (or fork) runs exactly as autotune costs it."""

    name: str
    """The name given to --trainer (a fork: 'megatron' with --fork, shown as 'megatron+FORK')."""
    schedules: tuple[str, ...]
    """Pipeline schedules it has (autotune's names)."""
    vocabs: tuple[str, ...]
    """Vocabulary placements: 'ends' (even split), 'balanced' (uneven split), 'parallel' (vocabulary parallelism)."""
    zero_flat: tuple[int, ...]
    """ZeRO/FSDP stages without pipeline parallelism (pp = 1)."""
    zero_pipelined: tuple[int, ...]
    """ZeRO/FSDP stages with pipeline parallelism (pp > 1)."""
    cp: bool
    """Ring-attention context parallelism, as the cost model prices it."""
    cp_with_pp: bool = True
    """cp > 1 together with pp > 1 (False: the trainer refuses the combination)."""
    tp_modes: tuple[str, ...] = ("1d",)
    """Tensor-parallel modes (1-D Megatron style; 2-D/2.5-D/3-D grids)."""
    sequence_parallel: tuple[bool, ...] = (True, False)
    """Sequence-parallel settings it runs."""
    tp_overlap: bool = False
    """TP communication overlapped with the GEMMs."""
    tp_overlap_needs_fused: bool = False
    """The overlap needs fused kernels (torchtitan's async TP lives under torch.compile)."""
    ep_overlap: bool = False
    """The expert all-to-all overlapped with another micro-batch's compute (Megatron's
    --overlap-moe-expert-parallel-comm)."""
    max_vpp: int = 1
    """Most model chunks per pipeline rank of the interleaved schedule (1: none)."""
    split: Split = "any"
    """Layers per stage: 'any' (an explicit layout), 'even' (differing by at most one), 'deepspeed' (exactly
    PipelineModule's partition_method 'type:transformer' split, see deepspeed_split)."""
    selective_recompute: bool = True
    """Selective (attention-only) recomputation."""
    partial_recompute: bool = True
    """Full recomputation of only some layers of each chunk (Megatron's block method)."""
    tied_with_pp: bool = True
    """Tied input and output embeddings together with pipeline parallelism."""
    gradient_buckets: bool = True
    """A gradient-bucket size the config sets (Megatron's --ddp-bucket-size, DeepSpeed's reduce_bucket_size);
    torchtitan's FSDP2 reduces per block and has none, nor does autotune's Colossal-AI config, so their plans keep
    the default bucket."""
    sp_seq_divisor: bool = False
    """seq_len must be divisible by tp (with sequence parallelism) x 2cp: torchtitan's seq_len_divisor; Megatron's
    validate_args asks seq_length % 2cp == 0 and its sequence-parallel scatter asserts tp divides the tokens
    (megatron/core/tensor_parallel/mappings.py)."""
    moe: bool = False
    """Mixture-of-experts models with expert parallelism, as autotune emits them (emit/megatron_moe.py)."""
    moe_models: tuple[str, ...] | None = None
    """The MoE models it builds, by catalog name (None: any; Megatron builds them from flags)."""
    etp_with_ep: bool = True
    """Expert tensor parallelism together with ep > 1. False (torchtitan 0.3: models/common/moe_sharding.py): once
    ep > 1 the experts are split by ep alone (etp 1); with ep 1 they follow the attention's tp (etp = tp)."""
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    """MoE token dispatchers it runs (JobSpec.moe_dispatcher): Megatron adds DeepEP (its flex dispatcher)."""
    optimizer_states: tuple[str, ...] = ("fp32",)
    """Adam state layouts it keeps (JobSpec.optimizer_states): Megatron adds its precision-aware optimizer's
    (megatron-core OptimizerConfig.use_precision_aware_optimizer, exp_avg_dtype, exp_avg_sq_dtype), torchtitan its
    bf16 moments."""
    mtp: bool = False
    """Trains the model's multi-token prediction modules (ModelSpec.mtp_layers): Megatron's --mtp-num-layers.
    Where False the modules are left out of the run, and of its estimate."""
    ep_over_replicas: bool = True
    """Expert-parallel ranks may come from replicated (ZeRO-0) data parallelism. False (torchtitan: the EP region
    is dp_shard x cp x tp, and ZeRO-0 puts dp in dp_replicate, outside it)."""
    source: str = ""
    """Where the row comes from."""

    def zero_stages(self, pp: int) -> tuple[int, ...]:
        """ZeRO stages it runs at this pipeline degree."""
        return self.zero_pipelined if pp > 1 else self.zero_flat


#: Catalog MoE models torchtitan 0.3.0 ships as its own flavors (qwen3 30B-A3B / 235B-A22B, deepseek_v3 671B,
#: gpt_oss 20b / 120b); other MoE models (Mixtral, Llama 4) have no torchtitan model.
TORCHTITAN_MOE_MODELS = ("deepseek-v3", "gpt-oss-120b", "gpt-oss-20b", "qwen3-235b-a22b", "qwen3-30b-a3b")
#: Why DeepSpeed gets no MoE config (emit/deepspeed.py says the same when asked to emit one).
DEEPSPEED_MOE = ("DeepSpeed-MoE's expert parallelism is deepspeed.moe.layer.MoE(ep_size=...) in model code, and "
                 "autotune's DeepSpeed launch (a PipelineModule + mpu training script) builds no MoE layers")
_MEGATRON = TrainerCaps(
    name="megatron", schedules=("1f1b", "interleaved"), vocabs=("ends", "balanced"),
    # --use-distributed-optimizer (1); Megatron FSDP --data-parallel-sharding-strategy optim_grads(_params) (2, 3),
    # which is not used with pipelining
    zero_flat=(0, 1, 2, 3), zero_pipelined=(0, 1), cp=True, tp_overlap=True, ep_overlap=True, max_vpp=8, moe=True,
    sp_seq_divisor=True,
    moe_dispatchers=("alltoall", "deepep"), mtp=True, optimizer_states=("fp32", "bf16", "bf16-moments"),
    source="Megatron-LM core_r0.16: no zero-bubble or V schedule, no vocabulary parallelism (TRAINERS.md 1.1); "
           "any split through --pipeline-model-parallel-layout")
TRAINER_CAPS: dict[str, TrainerCaps] = {
    "megatron": _MEGATRON,
    "torchtitan": TrainerCaps(
        name="torchtitan", schedules=("1f1b", "interleaved"), vocabs=("ends", "balanced"),
        # data_parallel_replicate_degree (0) or FSDP2 resharding after forward (3): no ZeRO-1/2 without a pipeline;
        # with one, FSDP2 without resharding keeps the gathered weights across micro-batches: ZeRO-1's memory and
        # traffic, as the emitter writes it (emit/torchtitan.py) and check reads it back
        # its context parallelism also shards weights, gradients and optimizer state over the cp ranks (FSDP2 over
        # dp_shard x cp), which autotune does not cost: cp is left out
        zero_flat=(0, 3), zero_pipelined=(0, 1), cp=False, tp_overlap=True, tp_overlap_needs_fused=True, max_vpp=8,
        # activation-checkpoint:full covers every layer; its selective AC is per-op, not Megatron's attention-only
        selective_recompute=False, partial_recompute=False, tied_with_pp=False, sp_seq_divisor=True,
        gradient_buckets=False,
        # expert_parallel_degree for the MoE models it ships (emit/torchtitan_mapping.py MOE_REGISTRY)
        moe=True, moe_models=TORCHTITAN_MOE_MODELS, etp_with_ep=False, ep_over_replicas=False,
        # 0.3.0's optimizer.implementation fused_opt_states_bf16: bf16 Adam moments beside fp32 parameters (not 0.2.x)
        optimizer_states=("fp32", "bf16-moments"),
        source="torchtitan 0.3.0: 1F1B and Interleaved1F1B (ZBVZeroBubble keeps 1F1B's memory, not V-Half's); "
               "module_fqns_per_model_part for any split; no vocabulary parallelism; expert_parallel_degree "
               "(no expert TP with ep > 1) for its qwen3, deepseek_v3 and gpt_oss MoE models"),
    "deepspeed": TrainerCaps(
        name="deepspeed", schedules=("1f1b",), vocabs=("ends",),
        # runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"; without ZeRO a
        # pipeline runs engine.py's BF16_Optimizer (a second gradient buffer, fp32 master weights sharded over dp,
        # weights all-gathered after the step), which autotune does not cost: pipelines are planned with ZeRO 1
        zero_flat=(0, 1, 2, 3), zero_pipelined=(1,),
        # its sequence parallelism is DeepSpeed-Ulysses (all-to-all), not the ring attention autotune costs; with a
        # pipeline, deepspeed.initialize takes dp from the topology (dp*cp) and rejects the batch
        cp=False, cp_with_pp=False, split="deepspeed", selective_recompute=False, partial_recompute=False,
        # bf16.bf16_master_weights_and_grads + bf16_optimizer_states (bf16 training, ZeRO 1-3): Megatron's bf16 bytes
        optimizer_states=("fp32", "bf16"),
        source="DeepSpeed 0.19.8: PipelineModule's 1F1B TrainSchedule, partition_method 'type:transformer', "
               "activation_checkpoint_interval (whole layers)"),
    "colossalai": TrainerCaps(
        name="colossalai", schedules=("1f1b",), vocabs=("ends",),
        # the legacy zero config applies with pp 1 only; ZeRO-2/3's sharding strategy is not set by the emitter
        zero_flat=(0, 1), zero_pipelined=(0,), cp=False, tp_modes=MODES, sequence_parallel=(False,),
        split="even", selective_recompute=False, partial_recompute=False, gradient_buckets=False,
        source="Colossal-AI <= 0.3 legacy config: 1-D/2-D/2.5-D/3-D TP, 1F1B, per-layer checkpointing, no CP"),
}
#: Megatron-LM forks, searched only when named with --fork.
FORK_CAPS: dict[str, TrainerCaps] = {
    "vocab-parallel": replace(
        _MEGATRON, name="megatron+vocab-parallel", vocabs=("ends", "balanced", "parallel"),
        # its flags are core_v0.10.0's plus its own (TRAINERS.md section 4): the precision-aware optimizer is not
        # recorded among them, so only fp32 Adam states are planned for it
        moe_dispatchers=("alltoall",), optimizer_states=("fp32",), ep_overlap=False,  # (megatron-core 0.14+)
        source="sail-sg/VocabularyParallelism (HEAD 6191c3b, Megatron-LM core 0.9): --enable-vocab-parallel with "
               "1F1B, pp > 1, untied embeddings (TRAINERS.md section 4)"),
    "zero-bubble": replace(
        _MEGATRON, name="megatron+zero-bubble", schedules=("1f1b", "interleaved", "zb-h1", "v-half"),
        # both forks branch from Megatron-LM before its flex dispatcher; neither records the precision-aware optimizer
        moe_dispatchers=("alltoall",), optimizer_states=("fp32",), ep_overlap=False,
        source="sail-sg/zero-bubble-pipeline-parallelism: ZB-H1 and V-Half (its flags are not recorded: the "
               "launch script does not switch them on)"),
}
#: Which trainer each fork belongs to.
FORK_OF = {"vocab-parallel": "megatron", "zero-bubble": "megatron"}
#: What the Megatron emitter's script runs: the vocabulary-parallel fork's flag is on by default (FORK_ARGS).
EMITTED_CAPS: dict[str, TrainerCaps] = {**TRAINER_CAPS, "megatron": FORK_CAPS["vocab-parallel"]}


def caps_for(trainer: str, fork: str | None = None) -> TrainerCaps:
    """The row for --trainer (and --fork); an unknown name is a one-line error naming the choices."""
    if trainer not in TRAINER_CAPS:
        raise SpecError(f"--trainer {trainer!r}: unknown trainer; use one of {', '.join(TRAINER_CAPS)}")
    if fork is None:
        return TRAINER_CAPS[trainer]
    if fork not in FORK_CAPS:
        raise SpecError(f"--fork {fork!r}: unknown fork; use one of {', '.join(FORK_CAPS)}")
    if FORK_OF[fork] != trainer:
        raise SpecError(f"--fork {fork} is a fork of {FORK_OF[fork]}, not {trainer}; use --trainer {FORK_OF[fork]}")
    return FORK_CAPS[fork]


def deepspeed_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Transformer layers per stage under DeepSpeed's partition_method 'type:...': partition_balanced over 0/1
    weights gives every stage floor(L/pp) layers and the first L mod pp stages one more."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (i < extra) for i in range(pp))


def unsupported(caps: TrainerCaps, plan: Plan, model: ModelSpec, job: JobSpec) -> list[str]:
    """One line for each thing of the plan the trainer does not run as planned (empty: it runs the plan)."""
    p, n = plan, caps.name
    out = []
    if p.schedule not in caps.schedules:
        out.append(f"schedule {p.schedule}: {n} runs {', '.join(caps.schedules)}")
    if p.schedule == "interleaved" and p.vpp > caps.max_vpp:
        out.append(f"vpp {p.vpp}: {n} runs at most {caps.max_vpp} chunk{'s' if caps.max_vpp > 1 else ''} per rank")
    if p.vocab not in caps.vocabs:
        out.append(f"vocab {p.vocab}: {n} places the vocabulary layers as {', '.join(caps.vocabs)}")
    if p.zero not in caps.zero_stages(p.pp):
        out.append(f"zero {p.zero} with pp {p.pp}: {n} runs ZeRO {', '.join(map(str, caps.zero_stages(p.pp)))}")
    if p.cp > 1 and not caps.cp:
        out.append(f"cp {p.cp}: " + {"torchtitan": "torchtitan's context parallelism also shards weights, gradients "
                                                   "and optimizer state over the cp ranks (FSDP2), which autotune "
                                                   "does not cost",
                                     "deepspeed": "DeepSpeed's sequence parallelism is Ulysses (all-to-all), not "
                                                  "the ring attention autotune costs"}.get(
            n, f"{n} has no ring-attention context parallelism"))
    if p.tp_mode not in caps.tp_modes:
        out.append(f"tp_mode {p.tp_mode}: {n} runs {', '.join(caps.tp_modes)} tensor parallelism")
    if p.sequence_parallel not in caps.sequence_parallel:
        out.append(f"sequence_parallel {str(p.sequence_parallel).lower()}: not in {n}")
    if p.tp_overlap and not (caps.tp_overlap and (job.fused_kernels or not caps.tp_overlap_needs_fused)):
        out.append(f"tp_overlap: {n} has no TP communication overlap" + (" without torch.compile (--unfused)"
                                                                          if caps.tp_overlap else ""))
    if p.ep_overlap and not caps.ep_overlap:
        out.append(f"ep_overlap: {n} has no overlap of the expert all-to-all")
    if model.is_moe:
        out += _moe_rules(caps, plan, model)
        if job.moe_dispatcher not in caps.moe_dispatchers and plan.ep * plan.etp > 1:
            out.append(f"the {job.moe_dispatcher} token dispatcher: {n} runs {', '.join(caps.moe_dispatchers)}")
    if job.optimizer_states not in caps.optimizer_states:
        out.append(f"{job.optimizer_states} Adam states: {n} keeps {', '.join(caps.optimizer_states)}")
    elif p.zero not in state_zero_stages(n, job.optimizer_states):
        out.append(f"{job.optimizer_states} Adam states with zero {p.zero}: costed in {n}'s distributed optimizer "
                   "(zero 1) only")
    if model.mtp_layers and not caps.mtp:
        out.append(f"{model.mtp_layers} multi-token prediction module(s): {n} trains none (its figures leave them "
                   "out)")
    out += _layer_rules(caps, plan, model, job)
    return out


def _moe_rules(caps: TrainerCaps, p: Plan, model: ModelSpec) -> list[str]:
    """A mixture-of-experts model: the trainer has it, and its expert layout is one the trainer builds."""
    n = caps.name
    if not caps.moe:
        why = DEEPSPEED_MOE if n == "deepspeed" else f"autotune writes no expert-parallel config for {n}"
        return [f"MoE model: {why}; megatron (and torchtitan for {', '.join(TORCHTITAN_MOE_MODELS)}) run it"]
    if caps.moe_models is not None and model.known_as not in caps.moe_models:
        return [f"MoE model {model.name}: {n} has no such model (its MoE models: {', '.join(caps.moe_models)})"]
    issue = expert_layout_issue(caps, p.tp, p.cp, p.zero, p.ep, p.etp)
    return [issue] if issue else []


def expert_layout_issue(caps: TrainerCaps, tp: int, cp: int, zero: int, ep: int, etp: int) -> str | None:
    """Why the trainer cannot lay the experts out as (ep, etp) beside these degrees; None if it can (Megatron's
    own rules, ep dividing the experts and ep*etp the stage, are the plan's and hold for every trainer)."""
    n = caps.name
    if not caps.etp_with_ep and ep > 1 and etp != 1:
        return f"etp {etp} with ep {ep}: {n} splits the experts by ep alone once ep > 1 (etp 1)"
    if not caps.etp_with_ep and ep == 1 and etp != tp:
        return f"etp {etp} with ep 1: {n} splits the experts like the attention without ep (etp = tp = {tp})"
    if not caps.ep_over_replicas and zero == 0 and (tp * cp) % ep:
        return (f"ep {ep} with ZeRO-0: {n} takes expert-parallel ranks from dp_shard x cp x tp, and ZeRO-0 "
                f"replicates over dp, leaving cp x tp = {tp * cp}; use ZeRO-1/3 or an ep dividing {tp * cp}")
    return None


def _layer_rules(caps: TrainerCaps, p: Plan, model: ModelSpec, job: JobSpec) -> list[str]:
    """The split, the recomputation granularity, tying and sequence divisibility."""
    n, out = caps.name, []
    layers = p.layers_per_stage
    if caps.split == "even" and layers and not is_even_split(layers):
        out.append(f"layers_per_stage {','.join(map(str, layers))}: {n} splits the layers evenly")
    if caps.split == "deepspeed" and layers and layers != deepspeed_split(model.num_layers, p.pp):
        want = deepspeed_split(model.num_layers, p.pp)
        shown = (f"{','.join(map(str, layers))}: {n}'s partition_method gives {','.join(map(str, want))}"
                 if p.pp <= 8 else f"uneven: {n}'s partition_method gives the first {model.num_layers % p.pp} "
                 f"stages {want[0]} layers and the others {want[-1]}")
        out.append(f"layers_per_stage {shown}")
    if p.recompute == "selective" and not caps.selective_recompute:
        out.append(f"recompute selective: {n} recomputes whole layers only")
    if p.recompute_layers is not None and layers and p.recompute_layers < max(layers) // p.vpp \
            and not caps.partial_recompute:
        out.append(f"recompute full on {p.recompute_layers} layer(s) per chunk: {n} recomputes all layers or none")
    if model.tied_embeddings and p.pp > 1 and not caps.tied_with_pp:
        out.append(f"tied embeddings with pp {p.pp}: {n} does not tie them across pipeline stages")
    if (issue := seq_len_issue(caps, p, job.seq_len)) is not None:
        out.append(issue)
    return out


def seq_len_issue(caps: TrainerCaps, p: Plan, seq_len: int) -> str | None:
    """The sequence does not split as the trainer splits it (torchtitan's seq_len_divisor; Megatron's sequence
    parallel scatter): None when it does."""
    divisor = (p.tp if p.sequence_parallel else 1) * (2 * p.cp if p.cp > 1 else 1)
    if caps.sp_seq_divisor and seq_len % divisor:
        return f"seq_len {seq_len}: {caps.name} needs it divisible by tp (sequence parallel) x 2cp = {divisor}"
    return None


def refusal(caps: TrainerCaps, plan: Plan) -> str | None:
    """What the trainer rejects outright (it raises at start-up), as one line with the fix; None if nothing."""
    if plan.pp > 1 and plan.cp > 1 and not caps.cp_with_pp:
        return (f"pp {plan.pp} with cp {plan.cp}: {caps.name} rejects it (with a pipeline, deepspeed.initialize "
                "takes the data-parallel size from the topology, dp x cp, and the batch no longer adds up); use "
                "cp 1 or pp 1")
    return None


def runs_default_bucket(caps: TrainerCaps, plan: Plan) -> bool:
    """Whether the trainer's config runs the default gradient bucket in place of the plan's, where the bucket is
    costed (a data-parallel sync): it sets none (TrainerCaps.gradient_buckets), so `check` reads the default."""
    return not caps.gradient_buckets and plan.bucket_size != DEFAULT_BUCKET and plan.dp * plan.cp > 1


def runs_otherwise(caps: TrainerCaps, plan: Plan, job: JobSpec) -> list[str]:
    """What the trainer's config runs otherwise than `plan` was costed, beside its structure (unsupported): a
    gradient bucket it cannot set, a reduction it runs after the backward where the plan's kernels overlap it, and a
    weights' all-gather it runs in the optimizer step where the plan's trainer hides it behind the next forward.
    One line each (empty: none); a restricted search never meets them (for_trainer keeps the default bucket, and
    the trainer's own kernels cost its reduction)."""
    p, n, out = plan, caps.name, []
    own = replace(job, trainer=n.partition("+")[0])  # a fork's own trainer
    if runs_default_bucket(caps, p):
        out.append(f"bucket {p.bucket_size:,}: {n}'s config sets no gradient bucket (it runs {DEFAULT_BUCKET:,})")
    if p.dp * p.cp > 1 and overlaps_grad_reduce(job, p.pp, p.zero) and not overlaps_grad_reduce(own, p.pp, p.zero):
        out.append(f"gradients reduced during the backward: {n} reduces them after it with pp {p.pp}, zero {p.zero}")
    if p.dp * p.cp > 1 and not gathers_params_in_step(job, p.zero) and gathers_params_in_step(own, p.zero):
        out.append(f"weights gathered behind the next forward: {n} gathers them in its optimizer step with zero "
                   f"{p.zero}")
    return out


def runners(plan: Plan, model: ModelSpec, job: JobSpec) -> list[str]:
    """The trainers (no forks) that run the plan as planned, in table order."""
    return [name for name, caps in TRAINER_CAPS.items()
            if not unsupported(caps, plan, model, job) and not runs_otherwise(caps, plan, job)]


def as_run(caps: TrainerCaps, plan: Plan, model: ModelSpec) -> tuple[Plan, tuple[str, ...]]:
    """The plan the trainer runs in place of `plan` (what its emitter writes, as the cost model sees it) and what
    of the difference the cost model cannot express. Equal to `plan` when the trainer runs it (unsupported and
    runs_otherwise say nothing)."""
    p, notes = plan, []
    if p.schedule not in caps.schedules:  # zb-h1, v-half, interleaved: 1F1B over the same layers per rank
        if p.schedule == "v-half" and "interleaved" in caps.schedules and caps.name == "torchtitan":
            notes.append("v-half runs as torchtitan's ZBVZeroBubble (about 1F1B's activation memory), costed as "
                         "v-half")
        else:
            p = replace(p, schedule="1f1b", vpp=1)
    if p.vocab not in caps.vocabs:
        p = replace(p, vocab="ends" if is_even_split(p.layers_per_stage) else "balanced")
    if p.tp_mode not in caps.tp_modes:
        p = replace(p, tp_mode="1d")
    if runs_default_bucket(caps, p):
        p = replace(p, bucket_size=DEFAULT_BUCKET)
    if p.sequence_parallel not in caps.sequence_parallel:
        p = replace(p, sequence_parallel=False, tp_overlap=False)
    if p.tp_overlap and not caps.tp_overlap:
        p = replace(p, tp_overlap=False)
    if p.recompute == "selective" and not caps.selective_recompute and caps.name != "torchtitan":
        # torchtitan's emitter writes its per-op selective AC, which the cost model prices with torchtitan's
        # kernels (what `check` reads back); the others checkpoint whole layers
        p = replace(p, recompute="full", recompute_layers=None)
    if p.ep_overlap and (not caps.ep_overlap or ep_overlap_issue(p, model)):  # megatron-core's rules, as run
        p = replace(p, ep_overlap=False)
    if p.recompute_layers is not None and p.recompute_layers < max(p.layers_per_stage) // p.vpp \
            and not caps.partial_recompute:
        p = replace(p, recompute_layers=None)
    allowed = caps.zero_stages(p.pp)
    if caps.name == "torchtitan" and (p.dp == 1 or p.zero in (1, 2)):
        # its emitter writes no data parallelism for dp 1, and ZeRO-1/2 as FSDP2 without resharding after forward
        # (gradients and optimizer state sharded, weights gathered once per micro-batch): what `check` reads back
        p = replace(p, zero=0 if p.dp == 1 else (2 if p.pp == 1 else 1))
    elif p.zero not in allowed:  # more sharding where the trainer has it, else less
        p = replace(p, zero=min((z for z in allowed if z > p.zero), default=max(allowed)))
    if p.cp > 1 and not caps.cp:
        if caps.name == "colossalai" and p.num_microbatches % p.cp == 0:
            p = replace(p, dp=p.dp * p.cp, num_microbatches=p.num_microbatches // p.cp, cp=1)
        elif caps.name == "torchtitan":
            notes.append(f"cp {p.cp}: torchtitan also shards the weights over the context-parallel ranks (FSDP2)")
        else:
            notes.append(f"cp {p.cp} runs as {caps.name}'s own sequence parallelism, costed as ring attention")
    if model.is_moe and not caps.etp_with_ep and p.etp != (1 if p.ep > 1 else p.tp):
        p = replace(p, etp=1 if p.ep > 1 else p.tp)  # torchtitan 0.3.x: experts split by ep alone, or over tp
    if caps.split == "deepspeed" and p.layers_per_stage != deepspeed_split(model.num_layers, p.pp):
        notes.append("the planned layers per stage need PipelineModule._partition_layers overridden")
    if caps.split == "even" and not is_even_split(p.layers_per_stage):
        notes.append("the planned uneven split is not expressed")
    return p, tuple(notes)
