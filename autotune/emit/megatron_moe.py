"""Megatron-LM flags of a mixture-of-experts model and its expert layout (issue 14), kept apart from the dense
flags in megatron.py. Flag names and meanings: Megatron-LM arguments.py (core_r0.16) _add_moe_args and
_add_mla_args; megatron-core 0.16's TransformerConfig / MLATransformerConfig check them."""

from __future__ import annotations

from autotune.emit.runfiles import float_text
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.plan import Plan

Flag = tuple[str, str | None]


def moe_layer_pattern(model: ModelSpec) -> str:
    """--moe-layer-freq as Megatron's list expression, one entry per layer (1 = MoE), e.g. '([0]*3+[1]*58)'.
    Written out layer by layer so Megatron's own reading of an integer frequency never applies."""
    bits = [1 if model.is_moe_layer(i) else 0 for i in range(model.num_layers)]
    runs: list[tuple[int, int]] = []
    for b in bits:
        if runs and runs[-1][0] == b:
            runs[-1] = (b, runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    if len(runs) > 4:  # an interleaved pattern: the explicit list is shorter and as clear
        return "[" + ",".join(map(str, bits)) + "]"
    return "(" + "+".join(f"[{b}]*{n}" for b, n in runs) + ")"


def capacity_flags(job: JobSpec) -> list[Flag]:
    """Token dropping at a capacity factor (dropless without one), and padding every expert to it."""
    if not job.moe_capacity_factor:
        return []
    flags: list[Flag] = [("--moe-expert-capacity-factor", f"{job.moe_capacity_factor:g}")]
    return flags + ([("--moe-pad-expert-input-to-capacity", None)] if job.moe_pad_to_capacity else [])


def dispatcher_flags(plan: Plan, dispatcher: str) -> list[Flag]:
    """The token dispatcher the cost model priced (costmodel/moe.py): alltoall, or DeepEP through the flex
    dispatcher. Megatron's flex dispatcher needs an exchange (TransformerConfig: etp*ep > 1), so without one
    the plain alltoall dispatcher stands (it then moves nothing either)."""
    if dispatcher == "deepep" and plan.ep * plan.etp > 1:
        return [("--moe-token-dispatcher-type", "flex"), ("--moe-flex-dispatcher-backend", "deepep")]
    return [("--moe-token-dispatcher-type", "alltoall")]


def moe_flags(model: ModelSpec, plan: Plan, dispatcher: str = "alltoall", job: JobSpec | None = None) -> list[Flag]:
    """The MoE and MLA flags (none for a dense model with ordinary attention): experts, top-k, expert width,
    the layer pattern, shared experts, the router's score function, the expert layout (ep, etp), grouped GEMMs,
    the token dispatcher autotune's cost model priced (dispatcher_flags) and its overlap."""
    flags: list[Flag] = []
    if model.is_moe:
        flags += [
            ("--num-experts", str(model.num_experts)), ("--moe-router-topk", str(model.moe_top_k)),
            ("--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size)),
            ("--moe-layer-freq", moe_layer_pattern(model)),
            ("--expert-model-parallel-size", str(plan.ep)), ("--expert-tensor-parallel-size", str(plan.etp)),
            ("--moe-grouped-gemm", None), *dispatcher_flags(plan, dispatcher),
            # the all-to-all of one micro-batch beside another's compute, as costed (costmodel/epoverlap.py)
            *([("--overlap-moe-expert-parallel-comm", None)] if plan.ep_overlap else []),
            *(capacity_flags(job) if job is not None else []),
            ("--moe-router-score-function", model.router),
        ]
        if model.num_shared_experts:
            flags.append(("--moe-shared-expert-intermediate-size",
                          str(model.num_shared_experts * model.shared_expert_ffn_hidden_size)))
        if model.router_bias:  # DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias
            flags.append(("--moe-router-enable-expert-bias", None))
        if model.moe_router_groups > 1:  # group-limited (DeepSeek-V3: node-limited) routing, as costed
            flags += [("--moe-router-num-groups", str(model.moe_router_groups)),
                      ("--moe-router-group-topk", str(model.moe_router_group_topk))]
        if model.moe_router_scaling != 1.0:
            flags.append(("--moe-router-topk-scaling-factor", float_text(model.moe_router_scaling)))
    if model.mla:
        flags += [("--multi-latent-attention", None), ("--kv-lora-rank", str(model.kv_lora_rank)),
                  ("--qk-head-dim", str(model.qk_nope_head_dim)),
                  ("--qk-pos-emb-head-dim", str(model.qk_rope_head_dim)), ("--v-head-dim", str(model.v_head_dim))]
        if model.q_lora_rank:
            flags.append(("--q-lora-rank", str(model.q_lora_rank)))
    return flags
