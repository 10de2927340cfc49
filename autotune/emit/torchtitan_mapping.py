"""The plan in torchtitan's terms, shared by both launch formats (autotune/emit/torchtitan.py writes them) and
read back by autotune/check/torchtitan_toml.py. 0.3.0 and 0.2.x use the same key names
(torchtitan/config/configs.py in 0.3.0, config/job_config.py in 0.2.2), so one mapping serves both:

* data parallelism is FSDP2 (`data_parallel_shard_degree`) or replication (`data_parallel_replicate_degree`);
  there is no ZeRO-1/2, so those map to FSDP2 without resharding after forward (ZeRO-2-like), with a warning;
* the batch: `local_batch_size` is per data-parallel rank per gradient-accumulation step. With pp > 1 one step
  runs the whole pipeline (lbs = mbs x microbatches, `pipeline_parallel_microbatch_size` = mbs); without it,
  lbs = mbs and torchtitan accumulates gbs / (lbs x dp) micro-batches;
* the partition: a split with the same layer count in every virtual stage is `pipeline_parallel_layers_per_stage`
  with no layer-equivalents for the embedding or head (`first/last_stage_less_layers` 0); any other split is
  `module_fqns_per_model_part`, one list per virtual stage in virtual order (stage j*pp + i = chunk j of rank i,
  as torchtitan's looped schedules place them);
* the schedules: 1f1b -> `1F1B`, interleaved -> `Interleaved1F1B`, v-half -> `ZBVZeroBubble` (the V-shaped
  zero-bubble schedule: 2 stages per rank, rank i holding virtual stages i and 2pp-1-i, so the embedding and
  the head both sit on rank 0; it keeps about 1F1B's activation memory, not V-Half's half, hence a warning);
  zb-h1 -> `1F1B` with a warning (torchtitan's zero-bubble schedules all need 2 stages per rank). Vocabulary
  parallelism has no torchtitan setting: the embedding stays in the first virtual stage and the head in the last.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autotune.emit import EmitInput
from autotune.errors import SpecError
from autotune.specs.model import ModelSpec
from autotune.specs.plan import DEFAULT_BUCKET, Plan, normalized

#: autotune catalog models with a torchtitan llama3 twin: (0.3.0 config_registry function, 0.2.x flavor).
REGISTRY = {
    "llama3-8b": ("llama3_8b", "8B"), "llama3.1-8b": ("llama3_8b", "8B"),
    "llama3-70b": ("llama3_70b", "70B"), "llama3.1-70b": ("llama3_70b", "70B"),
    "llama3-405b": ("llama3_405b", "405B"), "llama3.1-405b": ("llama3_405b", "405B"),
}


def float8_on_command_line(model: ModelSpec) -> bool:
    """Whether autotune's 0.3.x launch trains `model` in FP8: the Llama 3 models, through a config function with
    torchtitan's Float8LinearConverter (llama3_405b's own, or one autotune writes beside the script); torchtitan's
    command line has no flag for it."""
    return not model.is_moe and model.known_as in REGISTRY


@dataclass(frozen=True, slots=True)
class MoeModel:
    """A catalog MoE model that torchtitan ships: its module (0.3.0 --module, 0.2.x [model] name), the 0.3.0
    config_registry function ("" where torchtitan has none and the launch writes one on `base`'s recipe) and
    the model_registry flavor (the same name in 0.2.x)."""

    module: str
    config: str
    flavor: str
    base: str = ""


#: Catalog MoE models with a torchtitan twin (specs/trainers.py TORCHTITAN_MOE_MODELS lists the same names).
MOE_REGISTRY = {
    "qwen3-30b-a3b": MoeModel("qwen3", "qwen3_30b_a3b", "30B-A3B"),
    "qwen3-235b-a22b": MoeModel("qwen3", "", "235B-A22B", base="qwen3_30b_a3b"),
    "deepseek-v3": MoeModel("deepseek_v3", "deepseek_v3_671b", "671B"),
    "gpt-oss-120b": MoeModel("gpt_oss", "gpt_oss_120b", "120b"),
    "gpt-oss-20b": MoeModel("gpt_oss", "gpt_oss_20b", "20b"),
}
#: torchtitan's names for autotune's schedules (torch.distributed.pipelining.schedules.get_schedule_class).
SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb-h1": "1F1B", "v-half": "ZBVZeroBubble"}
#: The LM head's module name: `lm_head` in 0.3.0 (models/llama3/__init__.py), `output` in 0.2.x.
HEAD = {"cli": "lm_head", "toml": "output"}


@dataclass(frozen=True, slots=True)
class Mapping:
    """The plan in torchtitan's terms (one format's view); `keys` are (section, key, value) in emit order."""

    keys: tuple[tuple[str, str, object], ...]
    ac_mode: str
    """none | selective | full."""
    ac_option: str | None
    """0.2.x selective_ac_option: "op" or every N-th layer."""
    notes: tuple[str, ...]
    """Comment lines explaining the mapping."""
    warnings: tuple[str, ...]


def virtual_stage_layers(plan: Plan) -> list[int]:
    """Transformer layers of each virtual stage in virtual (model) order: looped schedules put chunk v // pp of
    rank v % pp there; v-half's V puts rank v's first half for v < pp and rank 2pp-1-v's second half after."""
    p, layers = plan.pp, plan.layers_per_stage
    if plan.schedule == "v-half":
        return [layers[v if v < p else 2 * p - 1 - v] // 2 for v in range(2 * p)]
    return [layers[v % p] // plan.vpp for v in range(p * plan.vpp)]


def stage_ranks(plan: Plan) -> list[int]:
    """The pipeline rank that runs each virtual stage (torchtitan's loop or V placement)."""
    p = plan.pp
    if plan.schedule == "v-half":
        return [v if v < p else 2 * p - 1 - v for v in range(2 * p)]
    return [v % p for v in range(p * plan.vpp)]


def module_fqns(plan: Plan, head: str) -> list[list[str]]:
    """torchtitan's `module_fqns_per_model_part` for the plan's partition."""
    parts, first = [], 0
    for v, n in enumerate(virtual_stage_layers(plan)):
        part = [f"layers.{i}" for i in range(first, first + n)]
        first += n
        parts.append((["tok_embeddings"] if v == 0 else []) + part)
    parts[-1] += ["norm", head]
    return parts


def map_plan(inp: EmitInput, fmt: str) -> Mapping:
    """Translate the plan, collecting what torchtitan cannot express exactly."""
    plan, job = normalized(inp.plan), inp.job
    keys: list[tuple[str, str, object]] = []
    notes: list[str] = []
    refuse_missing_moe(inp)
    warnings = _model_warnings(inp, fmt)
    local_batch = plan.mbs * plan.num_microbatches if plan.pp > 1 else plan.mbs
    keys += [("training", "local_batch_size", local_batch), ("training", "global_batch_size", job.global_batch),
             ("training", "seq_len", job.seq_len)]
    if job.dtype == "fp16":
        warnings.append("dtype fp16: torchtitan's mixed precision is bfloat16 or float32 only; emitted bfloat16")
    elif job.dtype == "fp8" and fmt == "cli" and not float8_on_command_line(inp.model):
        warnings.append("dtype fp8: torchtitan 0.3.x enables Float8 through a converter in the config function "
                        "(Float8LinearConverter), not a flag, and autotune writes one only for the Llama 3 models; "
                        "emitted bfloat16 mixed precision")
    keys.append(("training", "mixed_precision_param", "bfloat16"))
    if job.optimizer_states == "bf16-moments" and fmt == "cli":  # fp32 parameters, bf16 Adam moments (0.3.0)
        keys.append(("optimizer", "implementation", "fused_opt_states_bf16"))
    elif job.optimizer_states == "bf16-moments":
        warnings.append("--optimizer-states bf16-moments: torchtitan 0.2.x has no bf16 Adam states (0.3.0's "
                        "optimizer.implementation fused_opt_states_bf16 has); emitted fp32 states, more memory than "
                        "planned")
    if plan.pp > 1 and fmt == "cli":
        keys.append(("training", "disable_cuda_graphs", True))
        notes.append("CUDA graphs do not support pipeline parallelism yet (Trainer.Config): disabled")
    elif inp.model.is_moe and plan.ep > 1 and fmt == "cli":
        keys.append(("training", "disable_cuda_graphs", True))
        notes.append("CUDA graphs do not support the all-to-all token dispatcher (Trainer.Config): disabled")
    warnings += _schedule_warnings(plan)
    keys += _data_parallel(plan, fmt, notes, warnings, inp.model.is_moe)
    keys.append(("parallelism", "tensor_parallel_degree", plan.tp))
    if inp.model.is_moe:
        keys += _experts(plan, fmt, notes, warnings)
    # torch.compile fuses the norms, RoPE, SwiGLU and residual adds the cost model's fused kernels assume;
    # without it (--unfused) they run as PyTorch's eager chains
    keys.append(("compile", "enable", job.fused_kernels))
    if inp.model.is_moe and job.fused_kernels and fmt == "cli":  # deepseek_v3_671b compiles only the loss
        keys.append(("compile", "components", ["model", "loss"]))
    if plan.tp_overlap and not job.fused_kernels:
        warnings.append("tp_overlap: torchtitan's async TP needs torch.compile, which --unfused turns off; emitted "
                        "without async TP")
    if fmt == "cli":  # 0.3.x: async TP lives under compile; always explicit, a config function may turn it on
        keys.append(("compile", "enable_async_tensor_parallel", plan.tp_overlap and job.fused_kernels))
    elif plan.tp_overlap and job.fused_kernels:
        keys.append(("parallelism", "enable_async_tensor_parallel", True))
    if plan.tp > 1 and fmt == "cli":
        keys.append(("parallelism", "enable_sequence_parallel", plan.sequence_parallel))
    elif plan.tp > 1 and not plan.sequence_parallel:
        warnings.append("sequence_parallel false: torchtitan 0.2.x always uses sequence parallelism with TP; "
                        "emitted with it on (less activation memory, same communication volume)")
    divisor = (plan.tp if plan.sequence_parallel or fmt == "toml" else 1) * (2 * plan.cp if plan.cp > 1 else 1)
    if job.seq_len % divisor:
        warnings.append(f"seq_len {job.seq_len}: torchtitan needs it divisible by {divisor} (tp with sequence "
                        "parallelism x 2 cp) and will refuse to start")
    keys.append(("parallelism", "context_parallel_degree", plan.cp))
    keys.append(("parallelism", "pipeline_parallel_degree", plan.pp))
    if plan.pp > 1:
        keys += _pipeline(plan, fmt, notes)
    if plan.bucket_size != DEFAULT_BUCKET:
        notes.append(f"bucket_size {plan.bucket_size}: no torchtitan setting (FSDP2 communicates per transformer "
                     "block)")
    mode, option = _recompute(plan, fmt, warnings)
    return Mapping(keys=tuple(keys), ac_mode=mode, ac_option=option, notes=tuple(notes), warnings=tuple(warnings))


def refuse_missing_moe(inp: EmitInput) -> None:
    """An MoE model torchtitan lacks is refused: a dense llama3 config of it would train something else."""
    m = inp.model
    if m.is_moe and m.known_as not in MOE_REGISTRY:
        ships = ", ".join(f"{name} ({t.module} {t.flavor})" for name, t in MOE_REGISTRY.items())
        raise SpecError(f"--trainer torchtitan: torchtitan 0.3.0 has no model for the mixture of experts {m.name} "
                        f"(its MoE models: {ships}); use --trainer megatron")


def _experts(plan: Plan, fmt: str, notes: list[str], warnings: list[str]) -> list[tuple[str, str, object]]:
    """expert_parallel_degree (both) and 0.2.x expert_tensor_parallel_degree. 0.3.0 has no expert TP once
    ep > 1 (models/common/moe_sharding.py: experts sharded on ep alone, the tp axis splits tokens) and splits
    the experts over tp without ep; 0.2.x takes etp 1 or tp with ep > 1 and ignores it with ep 1."""
    ep, etp, tp = plan.ep, plan.etp, plan.tp
    if ep > 1 and etp not in (1, tp):
        warnings.append(f"etp {etp} with ep {ep}: torchtitan splits experts by ep alone or by ep x tp; emitted "
                        "etp 1 (each GPU holds whole experts; the header's figures are re-estimated so)")
        etp = 1
    elif ep > 1 and etp > 1 and fmt == "cli":
        warnings.append(f"etp {etp} with ep {ep}: torchtitan 0.3.x has no expert tensor parallelism with ep > 1 "
                        "(its experts are split by ep alone); emitted ep alone, etp 1 (the header's figures are "
                        "re-estimated so); the 0.2.x TOML (--torchtitan-format toml) has expert_tensor_parallel_degree")
        etp = 1
    elif ep == 1 and etp != tp:
        warnings.append(f"etp {etp} with ep 1: torchtitan splits the experts over the tp {tp} ranks like the "
                        "attention (etp = tp); emitted that")
    notes.append(f"experts: ep {ep} drawn from dp_shard x cp x tp, FSDP2 over the rest (efsdp); " + (
        f"expert tp {etp}" if ep > 1 else f"experts split over tp {tp} like the attention"))
    keys: list[tuple[str, str, object]] = [("parallelism", "expert_parallel_degree", ep)]
    if fmt == "toml":
        keys.append(("parallelism", "expert_tensor_parallel_degree", etp if ep > 1 else 1))
    return keys


def _model_warnings(inp: EmitInput, fmt: str) -> list[str]:
    m, plan = inp.model, inp.plan
    out: list[str] = []
    if m.is_moe:  # torchtitan's own model of it (MOE_REGISTRY): no llama3 shape to compare
        if m.tied_embeddings and plan.pp > 1:
            out.append("tied embeddings: torchtitan does not support weight tying with pipeline parallelism")
        return out
    if m.known_as not in REGISTRY:
        where = "a config_registry function (TT_CONFIG)" if fmt == "cli" else "a llama3 flavor"
        out.append(f"model {m.name}: not in torchtitan's registry; the launch needs {where} with "
                   f"{model_shape(inp, fmt)}")
    differs = [what for what, bad in (
        (f"{m.activation} MLP", m.activation != "swiglu"), (m.norm, m.norm != "rmsnorm"),
        (f"{m.position_embedding} positions", m.position_embedding != "rope"), (f"{m.bias} biases", m.bias != "none"),
        ("dropout", m.dropout), ("bidirectional attention", not m.causal),
        (f"head_dim {m.head_dim} != dim / heads", m.head_dim * m.num_heads != m.hidden_size),
        ("logit soft-capping", bool(m.attn_logit_softcap or m.final_logit_softcap)),
        ("attention beside the MLP (a parallel block)", m.parallel_block),
        (f"RoPE on {m.rotary_fraction:.0%} of each head", m.rotary_fraction < 1)) if bad]
    if differs:
        out.append(f"model {m.name}: torchtitan's llama3 is a causal RoPE/RMSNorm/SwiGLU decoder without biases or "
                   f"dropout; this model has {', '.join(differs)}, which needs a model of its own")
    if m.tied_embeddings and fmt == "toml":
        out.append("tied embeddings: torchtitan 0.2.x llama3 has no weight tying; the LM head gets its own weights")
    elif m.tied_embeddings and plan.pp > 1:
        out.append("tied embeddings: torchtitan does not support weight tying with pipeline parallelism; the config "
                   "function must untie them (the LM head gets its own weights on the last stage)")
    if m.known_as in REGISTRY and m.position_embedding == "rope" and m.rope_scaling != "llama3":
        out.append(f"model {m.name}: torchtitan's llama3 flavors are Llama 3.1's (RoPE theta 500000 with Llama 3.1 "
                   "frequency scaling); this model's RoPE is unscaled, so its low RoPE frequencies differ")
    return out


def _schedule_warnings(plan: Plan) -> list[str]:
    """What torchtitan's schedules cannot express: ZB-H1, V-Half's memory, vocabulary parallelism."""
    out = []
    if plan.schedule == "zb-h1":
        out.append("schedule zb-h1: torchtitan has no single-stage zero-bubble schedule (InterleavedZeroBubble and "
                   "ZBVZeroBubble need 2 stages per rank); emitted 1F1B with the same stages: no more activation "
                   "memory (ZB-H1 keeps weight-gradient inputs longer), but a larger bubble (weight gradients are "
                   "not deferred into it)")
    elif plan.schedule == "v-half":
        out.append("schedule v-half: torchtitan has no V-Half; emitted ZBVZeroBubble, the V-shaped zero-bubble "
                   "schedule with the same 2 stages per rank in V order: a smaller bubble, but it keeps about 1F1B's "
                   "activation memory, about twice V-Half's, so peak memory exceeds the prediction")
    if plan.vocab == "parallel":
        out.append("vocab parallel: torchtitan cannot split the embedding and LM head over pipeline stages; emitted "
                   "the embedding in the first virtual stage and the norm and LM head in the last (more memory "
                   "there and a slower step than predicted)")
    return out


def model_shape(inp: EmitInput, fmt: str) -> str:
    """The numbers a hand-written torchtitan model config needs (tying only where torchtitan allows it)."""
    m = inp.model
    tied = "tied" if m.tied_embeddings and inp.plan.pp == 1 and fmt == "cli" else "untied"
    return (f"{m.num_layers} layers, dim {m.hidden_size}, {m.num_heads} heads ({m.num_kv_heads} kv), ffn "
            f"{m.ffn_hidden_size}, vocab {m.vocab_size}, {tied} embeddings")


def _data_parallel(plan: Plan, fmt: str, notes: list[str], warnings: list[str],
                   moe: bool = False) -> list[tuple[str, str, object]]:
    """ZeRO 0 -> replicate (DDP); 3 -> FSDP2 resharding after forward; 1/2 -> FSDP2 without (ZeRO-2-like)."""
    dp, zero = plan.dp, plan.zero
    ddp_ok = fmt == "cli" or plan.cp > 1 or plan.tp * plan.pp == 1  # 0.2.x: "DDP has not supported > 1D parallelism"
    if moe and zero == 0 and dp > 1 and (plan.tp * plan.cp) % plan.ep:
        # the expert-parallel ranks come from dp_shard x cp x tp; replicas (dp_replicate) lie outside it
        warnings.append(f"ZeRO-0 with ep {plan.ep}: torchtitan takes expert-parallel ranks from dp_shard x cp x tp "
                        f"only, and cp x tp = {plan.tp * plan.cp} is not a multiple of ep; emitted FSDP2 over the "
                        f"{dp} data-parallel ranks with fsdp_reshard_after_forward never (ZeRO-2-like)")
        notes.append(f"dp {dp}, ZeRO-0 with ep {plan.ep}: FSDP2 without resharding after forward")
        return [("parallelism", "data_parallel_replicate_degree", 1),
                ("parallelism", "data_parallel_shard_degree", dp),
                ("parallelism", "fsdp_reshard_after_forward", "never")]
    if dp == 1 or zero == 3 or (zero == 0 and ddp_ok):
        replicate, shard = (dp, 1) if zero == 0 else (1, dp)
        reshard = "always" if zero == 3 and dp > 1 else None
        notes.append(f"dp {dp}, ZeRO-{zero}: " + ("no data parallelism" if dp == 1 else
                     "FSDP2 (ZeRO-3)" if zero == 3 else "replicated weights (DDP-like)"))
    elif zero == 1 and plan.pp > 1:
        # torch.distributed.pipelining (stage.py, backward_maybe_with_nosync) keeps an FSDP module's weights and
        # gradients unsharded across the micro-batches and reduce-scatters once, at the last: ZeRO-1
        replicate, shard, reshard = 1, dp, "never"
        notes.append(f"dp {dp}, ZeRO-1 with pp {plan.pp}: FSDP2 without resharding; the pipeline schedule keeps "
                     "weights and gradients gathered across micro-batches (ZeRO-1)")
    else:
        replicate, shard, reshard = 1, dp, "never"
        why = ("torchtitan has no ZeRO-1/2" if zero else
               "torchtitan 0.2.x runs DDP only without TP/PP ('DDP has not supported > 1D parallelism')")
        warnings.append(f"ZeRO-{zero} with dp {dp}: {why}; emitted FSDP2 over the {dp} data-parallel ranks with "
                        "fsdp_reshard_after_forward never (ZeRO-2-like: weights are also sharded between steps and "
                        "all-gathered for each micro-batch)")
        notes.append(f"dp {dp}, ZeRO-{zero}: FSDP2 without resharding after forward, the closest to ZeRO-1/2")
    if plan.cp > 1:
        warnings.append(f"cp {plan.cp}: torchtitan applies FSDP2 over the context-parallel ranks too (weights, "
                        f"gradients and optimizer state sharded over dp_shard x cp = {shard * plan.cp} ranks)")
    keys: list[tuple[str, str, object]] = [("parallelism", "data_parallel_replicate_degree", replicate),
                                           ("parallelism", "data_parallel_shard_degree", shard)]
    if reshard:
        keys.append(("parallelism", "fsdp_reshard_after_forward", reshard))
    return keys


def _pipeline(plan: Plan, fmt: str, notes: list[str]) -> list[tuple[str, str, object]]:
    keys: list[tuple[str, str, object]] = [
        ("parallelism", "pipeline_parallel_schedule", SCHEDULES[plan.schedule]),
        ("parallelism", "pipeline_parallel_microbatch_size", plan.mbs)]
    counts = virtual_stage_layers(plan)
    if min(counts) == max(counts) > 0:
        notes.append(f"pipeline: {len(counts)} virtual stages of {counts[0]} layers; embedding and head count as "
                     "no layers")
        return keys + [("parallelism", "pipeline_parallel_layers_per_stage", counts[0]),
                       ("parallelism", "pipeline_parallel_first_stage_less_layers", 0),
                       ("parallelism", "pipeline_parallel_last_stage_less_layers", 0)]
    order = ("V order: stage i < pp is the first half of rank i, stage 2pp-1-i its second half"
             if plan.schedule == "v-half" else "stage j*pp + i = chunk j of rank i")
    notes.append(f"pipeline: layers per virtual stage {','.join(map(str, counts))} ({order})")
    return keys + [("parallelism", "module_fqns_per_model_part", module_fqns(plan, HEAD[fmt]))]


def _recompute(plan: Plan, fmt: str, warnings: list[str]) -> tuple[str, str | None]:
    """Activation checkpointing: (mode, 0.2.x selective_ac_option)."""
    if plan.recompute == "selective":
        warnings.append("recompute selective: torchtitan's selective AC is per-op (saves matmul and attention "
                        "outputs, recomputes every second matmul and the element-wise ops), not Megatron's "
                        "attention-only recompute; activation memory and recompute time differ")
        return "selective", "op"
    if plan.recompute == "none" or plan.recompute_layers is None:
        return plan.recompute, None
    r = plan.recompute_layers
    what = f"recompute full on {r} layer{'s' if r > 1 else ''} per stage"
    if fmt == "toml":
        every = layer_ac_every(plan)
        if every > 1:
            warnings.append(f"{what}: torchtitan has no Megatron block method; emitted layer AC "
                            f"(selective_ac_option \"{every}\": one layer in every {every}, at least {r} per stage)")
            return "selective", str(every)
    version = "0.2.x" if fmt == "toml" else "0.3.x (no per-layer AC frequency)"
    warnings.append(f"{what}: torchtitan {version} cannot recompute part of a stage; emitted full AC on every layer "
                    "(more recompute than predicted)")
    return "full", None


def toml_runs(planned: Plan, plan: Plan) -> Plan:
    """What the 0.2.x TOML runs of `planned`, given `plan`, what torchtitan otherwise runs of it (specs/trainers.py
    as_run): sequence parallelism whenever tp > 1 (its TP plan always shards the norms), and a partial full
    recompute as layer AC, every N-th layer (_recompute: floor(n / N) layers of each chunk)."""
    p = replace(plan, sequence_parallel=plan.tp > 1)
    if planned.ep > 1 and planned.etp == planned.tp > 1:  # its expert_tensor_parallel_degree takes etp = tp
        p = replace(p, etp=planned.etp)
    if p.recompute == "full" and planned.recompute == "full" and planned.recompute_layers is not None:
        every = layer_ac_every(planned)
        chunks = [n for n in virtual_stage_layers(planned) if n > 0]
        p = replace(p, recompute_layers=max(1, min(chunks) // every) if every > 1 else None)
    return normalized(p)


def layer_ac_every(plan: Plan) -> int:
    """0.2.x layer AC's N for a plan recomputing plan.recompute_layers of each chunk: it checkpoints every N-th
    layer, at least floor(n / N) >= r of a chunk's n layers (1: every layer, full AC)."""
    r = plan.recompute_layers or 1
    return max(1, min(n // min(r, n) for n in virtual_stage_layers(plan) if n > 0))
