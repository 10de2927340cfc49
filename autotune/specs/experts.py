"""Expert-parallel layout rules of a plan (Megatron's, megatron/core/parallel_state.py and transformer_config.py),
the groups DeepEP's kernels run over, and when Megatron overlaps the expert all-to-all with another micro-batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.errors import InvalidPlanError
from autotune.specs.model import ModelSpec

if TYPE_CHECKING:
    from autotune.specs.plan import Plan


def check_experts(plan: Plan, model: ModelSpec) -> None:
    """Megatron's expert-parallel layout rules (megatron/core/parallel_state.py and transformer_config.py)."""
    ep, etp = plan.ep, plan.etp
    if not model.is_moe:
        if (ep, etp) != (1, 1):
            raise InvalidPlanError(f"ep {ep} / etp {etp} apply to mixture-of-experts models; {model.name} is "
                                   "dense: set ep 1 and etp 1")
        return
    if model.num_experts % ep:
        raise InvalidPlanError(f"ep {ep} must divide num_experts {model.num_experts}; pick an ep that divides it")
    if model.moe_ffn_hidden_size % etp:
        raise InvalidPlanError(f"etp {etp} must divide the expert width moe_ffn_hidden_size "
                               f"{model.moe_ffn_hidden_size}; pick an etp that divides it")
    stage = plan.tp * plan.cp * plan.dp
    if stage % (ep * etp):
        raise InvalidPlanError(f"ep*etp = {ep}*{etp} must divide tp*cp*dp = {stage} (Megatron folds the expert "
                               "groups into a pipeline stage's GPUs); lower ep or etp")
    if plan.tp > 1 and not plan.sequence_parallel:
        raise InvalidPlanError("an MoE model with tp > 1 needs sequence_parallel true (Megatron requires it for "
                               "expert layers); set it")


#: GPUs DeepEP's kernels treat as one node's NVLink peers: rank % 8 is a GPU's NVLink rank, rank // 8 its
#: node (NUM_MAX_NVL_PEERS; deep_ep 1.0.0 on PyPI, csrc/deep_ep.cpp)
DEEPEP_NVL_PEERS = 8
#: Group sizes inside one node that DeepEP's kernels are built for: deep_ep 1.0.0's intranode.cu launches
#: kernels templated on the rank count through SWITCH_RANKS, whose cases are 2, 4 and 8 (csrc/kernels/
#: launch.cuh in DeepEP's repository; the header is not in the PyPI sdist)
DEEPEP_INTRANODE_GROUPS = (2, 4, 8)
#: Group sizes across nodes that DeepEP has dispatch and combine configs for (deep_ep 1.0.0,
#: Buffer.get_dispatch_config asserts the size is one of them; megatron-core's moe/fused_a2a.py calls it)
DEEPEP_INTERNODE_GROUPS = (16, 24, 32, 64, 128, 144, 160)
#: What deepep_group_issue accepts, in words (for the errors that name the fix)
DEEPEP_GROUP_RULE = (f"ep*etp of {', '.join(map(str, DEEPEP_INTRANODE_GROUPS))} inside a node, or of "
                     f"{', '.join(map(str, DEEPEP_INTERNODE_GROUPS))} on nodes of a multiple of 8 GPUs")


def deepep_group_issue(group: int, gpus_per_node: int) -> str:
    """Why DeepEP's normal kernels cannot run over an ETP*EP group of `group` GPUs ("": they can; Megatron's flex
    dispatcher sends over that group, whose ranks are consecutive). Up to 8 GPUs it runs inside one node over
    NVLink, so the group must not straddle nodes; beyond, it runs across nodes of 8 NVLink peers each."""
    if group == 1:
        return ""  # no dispatch: Megatron's flex dispatcher needs ETP*EP > 1 and the model runs no all-to-all
    fix = f"DeepEP needs {DEEPEP_GROUP_RULE}; pick another ep or etp, or use the alltoall dispatcher"
    if group <= DEEPEP_NVL_PEERS:
        if group not in DEEPEP_INTRANODE_GROUPS:
            return f"DeepEP has no kernels for a group of ep*etp = {group} GPUs: {fix}"
        if gpus_per_node % group:
            return f"ep*etp = {group} GPUs straddle nodes of {gpus_per_node}: {fix}"
        return ""
    if gpus_per_node % DEEPEP_NVL_PEERS:
        return (f"ep*etp = {group} spans nodes, and DeepEP takes every {DEEPEP_NVL_PEERS} consecutive GPUs for one "
                f"node's NVLink peers, which nodes of {gpus_per_node} GPUs are not: {fix}")
    if group not in DEEPEP_INTERNODE_GROUPS:
        return f"DeepEP has no configs for a group of ep*etp = {group} GPUs: {fix}"
    return ""


def ep_overlap_issue(plan: Plan, model: ModelSpec, trainer: str = "megatron") -> str:
    """Why the plan's trainer cannot overlap its expert all-to-all ("": it can), check_ep_overlap's message."""
    try:
        check_ep_overlap(plan, model, trainer)
    except InvalidPlanError as exc:
        return str(exc)
    return ""


def check_ep_overlap(plan: Plan, model: ModelSpec, trainer: str) -> None:
    """Megatron's rules for --overlap-moe-expert-parallel-comm (megatron-core 0.16, TransformerConfig
    __post_init__): expert parallelism, no full recomputation, a virtual pipeline when pp > 1 (the overlap lives
    in the interleaved schedule and the unpipelined one), at most one MTP layer and, with one, pp > 1."""
    if not plan.ep_overlap:
        return
    if trainer != "megatron":
        raise InvalidPlanError(f"ep_overlap is Megatron's --overlap-moe-expert-parallel-comm; {trainer} has no "
                               "overlap of the expert all-to-all: set ep_overlap false")
    if not model.is_moe or plan.ep == 1:
        raise InvalidPlanError("ep_overlap overlaps the expert-parallel all-to-all, so it needs an MoE model with "
                               "ep > 1; set ep_overlap false")
    if plan.recompute == "full":
        raise InvalidPlanError("ep_overlap runs without full recomputation (Megatron refuses both); use recompute "
                               "none or selective, or set ep_overlap false")
    if plan.pp > 1 and plan.schedule != "interleaved":
        raise InvalidPlanError("ep_overlap with pp > 1 runs in Megatron's interleaved schedule (it needs a virtual "
                               "pipeline size); use schedule interleaved with vpp >= 2, or set ep_overlap false")
    if model.mtp_layers > 1 or (model.mtp_layers == 1 and plan.pp == 1):
        raise InvalidPlanError(f"ep_overlap takes at most one MTP layer, and then pp > 1 ({model.name} has "
                               f"{model.mtp_layers}, pp {plan.pp}); set ep_overlap false")
