"""Megatron-LM's mixture-of-experts and multi-head latent attention flags read back (the inverse of
emit/megatron_moe.py), kept apart from the dense flags in megatron_args.py.

Names and defaults are Megatron-LM core_r0.16's (megatron/training/arguments.py _add_moe_args and _add_mla_args):
--moe-layer-freq is an int N (layer i is MoE when i % N == 0) or a Python list expression with one 0/1 per
layer; --kv-lora-rank defaults to 32, --qk-head-dim to 128, --qk-pos-emb-head-dim to 64, --v-head-dim to 128,
--q-lora-rank to none (a full-rank query projection).
"""

from __future__ import annotations

import re
from typing import Any

from autotune.check.reading import ordinal
from autotune.errors import SpecError
from autotune.specs.limits import MAX_LAYERS, check_max

#: Flags that take one value and that this reader uses.
MOE_VALUE = frozenset("""
--moe-layer-freq --q-lora-rank --kv-lora-rank --qk-head-dim --qk-pos-emb-head-dim --v-head-dim
--moe-expert-capacity-factor --mtp-num-layers --moe-router-num-groups --moe-router-group-topk
--moe-router-topk-scaling-factor
""".split())
#: Switches this reader uses.
MOE_SWITCH = frozenset("--multi-latent-attention --moe-grouped-gemm --moe-router-force-load-balancing "
                       "--moe-pad-expert-input-to-capacity --moe-router-enable-expert-bias "
                       "--overlap-moe-expert-parallel-comm".split())
#: Routing, loss and fusion settings that do not change the plan or its cost (recognised, ignored).
MOE_NEUTRAL_VALUE = frozenset("""
--moe-router-load-balancing-type --moe-aux-loss-coeff --moe-z-loss-coeff
--moe-router-dtype --moe-router-bias-update-rate
--moe-input-jitter-eps --moe-token-drop-policy --mscale --mscale-all-dim --mtp-loss-scaling-factor
""".split())
MOE_NEUTRAL_SWITCH = frozenset("""
--moe-router-pre-softmax --moe-permute-fusion --moe-router-fusion
--moe-shared-expert-overlap --moe-per-layer-logging --moe-enable-deepep
""".split())

#: Megatron-LM's argparse defaults for the latent-attention sizes (arguments.py _add_mla_args).
MLA_DEFAULTS = {"--kv-lora-rank": 32, "--qk-head-dim": 128, "--qk-pos-emb-head-dim": 64, "--v-head-dim": 128}
_TERM = re.compile(r"\[([01](?:,[01])*)\](?:\*(\d+))?")


def layer_pattern(text: str, num_layers: int, flag: str = "--moe-layer-freq") -> list[int]:
    """--moe-layer-freq as one 0/1 per layer: an int N (Megatron: layer i is MoE when i % N == 0), or a list
    expression of the forms Megatron's examples use, '([0]*3+[1]*58)' or '[0,1,0,1]' (read without eval); the
    list form of another per-layer flag (`flag`: --window-attn-skip-freq) alike."""
    flat = text.replace(" ", "")
    if re.fullmatch(r"\d+", flat):
        step = int(flat)
        if step < 1:
            raise SpecError(f"{flag} {text}: a layer frequency must be >= 1")
        return [1 if i % step == 0 else 0 for i in range(num_layers)]
    body = flat[1:-1] if flat.startswith("(") and flat.endswith(")") else flat
    bits: list[int] = []
    for term in body.split("+"):
        match = _TERM.fullmatch(term)
        if match is None:
            raise SpecError(f"{flag} {text!r}: use an integer or a list expression such as "
                            "'([0]*3+[1]*58)' (one 0 or 1 per layer)")
        repeat = int(match.group(2) or 1)
        if repeat > num_layers:
            raise SpecError(f"{flag} {text!r}: a repeat of {repeat} exceeds --num-layers {num_layers}")
        bits += [int(b) for b in match.group(1).split(",")] * repeat
    if len(bits) != num_layers:
        raise SpecError(f"{flag} {text!r} gives {len(bits)} layers, --num-layers {num_layers}; give one "
                        "entry per layer")
    if not any(bits) and flag == "--moe-layer-freq":
        raise SpecError(f"--moe-layer-freq {text!r} has no MoE layer; drop --num-experts for a dense model")
    return bits


def _pattern_of(first: int, step: int, num_layers: int) -> list[int]:
    """ModelSpec's pattern: `first` dense layers, then the last layer of every group of `step` is MoE."""
    return [0 if i < first else int((i - first) % step == step - 1) for i in range(num_layers)]


def pattern_fields(bits: list[int], flag: str, notes: list[str]) -> dict[str, int]:
    """first_dense_layers and moe_layer_freq of a 0/1 layer pattern. autotune's models put dense layers first and
    then every moe_layer_freq-th layer MoE; a pattern of another shape (Megatron's int N puts MoE first in each
    group) is costed as the pattern of that shape with as many MoE layers, which costs the same (the cost model
    counts layers of each kind; it does not place them), and noted."""
    n, moe = len(bits), sum(bits)
    ones = [i for i, b in enumerate(bits) if b]
    for step in range(1, n + 1):  # the first MoE layer ends the first group: first = its index - (step - 1)
        first = ones[0] - (step - 1)
        if first < 0:
            break
        if _pattern_of(first, step, n) == bits:
            return {"first_dense_layers": first, "moe_layer_freq": step}
    gaps = [b - a for a, b in zip(ones, ones[1:])]
    step = min(set(gaps), key=lambda g: (-gaps.count(g), g)) if gaps else 1  # the commonest spacing
    first = max(0, n - (moe + 1) * step + 1)  # the fewest dense-first layers that leave `moe` groups
    if (n - first) // step != moe:
        step, first = 1, n - moe
    notes.append(f"{flag}: {moe} MoE layers of {n}; costed as {first} dense layers, then every "
                 f"{'' if step == 1 else f'{ordinal(step)} '}layer MoE (the same count: autotune costs layers by kind, "
                 "not by position)")
    return {"first_dense_layers": first, "moe_layer_freq": step}


def moe_model_fields(args: dict[str, Any], num_layers: int, experts: int, notes: list[str], as_int
                     ) -> dict[str, Any]:
    """The layer pattern of an MoE model (--moe-layer-freq, default 1: every layer) and the notes on what the
    cost model prices differently from the flags (expert GEMMs one by one, token capacity)."""
    check_max(num_layers, MAX_LAYERS, "the number of layers", "pretrain_gpt.py arguments")
    bits = layer_pattern(str(args.get("--moe-layer-freq", "1")), num_layers)
    fields = pattern_fields(bits, f"--moe-layer-freq {args.get('--moe-layer-freq', '1')}", notes)
    # group-limited routing, a training choice (check/understood.py TRAINING_FIELDS): 0 where the flags are absent
    fields.update(moe_router_groups=0, moe_router_group_topk=0,
                  router_bias=bool(args.get("--moe-router-enable-expert-bias")))
    groups, chosen = (as_int(args, flag, 0) for flag in ("--moe-router-num-groups", "--moe-router-group-topk"))
    if chosen and not groups:
        raise SpecError("--moe-router-group-topk needs --moe-router-num-groups (megatron-core refuses group-limited "
                        "routing without it); add it, or drop both")
    if chosen:  # megatron-core limits the groups only with a group top-k
        if experts % groups or chosen > groups:
            raise SpecError(f"--moe-router-num-groups {groups} / --moe-router-group-topk {chosen}: the groups must "
                            f"divide the {experts} experts and the top-k groups be at most all of them "
                            "(megatron-core asserts both); fix them")
        fields.update(moe_router_groups=groups, moe_router_group_topk=chosen)
    if not args.get("--moe-grouped-gemm"):
        notes.append("no --moe-grouped-gemm: Megatron runs each local expert's MLP in turn; costed as grouped "
                     "GEMMs (faster)")
    return fields


def mla_model_fields(args: dict[str, Any], as_int, notes: list[str]) -> dict[str, Any]:
    """Multi-head latent attention sizes (zeros without --multi-latent-attention, so a config with ordinary
    attention never matches a latent-attention catalog model), and the head width they imply, whatever
    --kv-channels says: queries and keys of qk-head-dim + qk-pos-emb-head-dim, as megatron-core's
    multi_latent_attention.py builds them (its q_head_dim; kv_channels is not read there). With MLA,
    --qk-layernorm builds the latents' norms (gpt_layer_specs: LayerNormLinear up-projections), not per-head
    ones: qk_norm False, and a note where the script leaves them out."""
    if not args.get("--multi-latent-attention"):
        return {"q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0}
    if not args.get("--qk-layernorm"):
        notes.append("--multi-latent-attention without --qk-layernorm: megatron-core then builds no norms on the "
                     "query and key/value latents, which DeepSeek's attention has (q_a/kv_a_layernorm); costed with "
                     "them (add --qk-layernorm to train the published model)")
    size = {flag: as_int(args, flag, default) for flag, default in MLA_DEFAULTS.items()}
    out = {"q_lora_rank": as_int(args, "--q-lora-rank", 0) or 0, "kv_lora_rank": size["--kv-lora-rank"],
           "qk_nope_head_dim": size["--qk-head-dim"], "qk_rope_head_dim": size["--qk-pos-emb-head-dim"],
           "v_head_dim": size["--v-head-dim"]}
    out["head_dim"] = size["--qk-head-dim"] + size["--qk-pos-emb-head-dim"]
    out["qk_norm"] = False
    return out


def capacity(args: dict[str, Any], as_float) -> tuple[float, bool]:
    """(capacity factor, padded): Megatron's --moe-expert-capacity-factor (a negative one means none, as
    TransformerConfig reads it) and --moe-pad-expert-input-to-capacity; (0.0, False) for dropless routing."""
    factor = as_float(args, "--moe-expert-capacity-factor", 0.0) if "--num-experts" in args else 0.0
    if factor == 0 and "--moe-expert-capacity-factor" in args and "--num-experts" in args:
        raise SpecError("--moe-expert-capacity-factor 0: every expert would drop every token; give a factor > 0, "
                        "or a negative one (or none) for dropless routing")
    if args.get("--moe-pad-expert-input-to-capacity") and "--num-experts" in args and factor <= 0:
        raise SpecError("--moe-pad-expert-input-to-capacity without --moe-expert-capacity-factor: megatron-core "
                        "refuses it (moe_expert_capacity_factor must be set); give a factor, or drop the switch")
    factor = max(0.0, factor)
    return factor, bool(args.get("--moe-pad-expert-input-to-capacity")) and factor > 0


def routing_imbalance(args: dict[str, Any]) -> float | None:
    """The busiest expert's load over the mean the config runs: 1.0 with --moe-router-force-load-balancing
    (benchmarks route every token evenly), else None (the cost model's stated default for learned routing)."""
    return 1.0 if args.get("--moe-router-force-load-balancing") and "--num-experts" in args else None


#: megatron-core 0.16's token dispatchers (TransformerConfig.moe_token_dispatcher_type) and load-balancing types
#: (the ones its capacity check and its routers know)
DISPATCHERS = ("allgather", "alltoall", "flex")
BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")


def _moe_flag_rules(args: dict[str, Any]) -> None:
    """megatron-core's refusals of MoE flags a config may give (TransformerConfig.__post_init__)."""
    try:
        ep = int(str(args.get("--expert-model-parallel-size", "1")))  # as argparse reads it ("01" is 1, "+2" 2)
    except ValueError:
        ep = 1  # not a number: the reader names it
    if "--num-experts" not in args and ep > 1:
        raise SpecError(f"--expert-model-parallel-size {ep} without --num-experts: megatron-core refuses expert "
                        "parallelism without experts (num_moe_experts must be non None); add --num-experts or drop it")
    kind = args.get("--moe-token-dispatcher-type")
    if kind is not None and kind not in DISPATCHERS:
        raise SpecError(f"--moe-token-dispatcher-type {kind!r}: use one of {', '.join(DISPATCHERS)}"[:200])
    for chosen in str(args.get("--moe-router-load-balancing-type", "aux_loss")).split():
        if chosen not in BALANCING:
            raise SpecError(f"--moe-router-load-balancing-type {chosen!r}: use one of {', '.join(BALANCING)}"[:200])
    _overlap_flag_rules(args, kind)


def _overlap_flag_rules(args: dict[str, Any], kind: str | None) -> None:
    """megatron-core's rules beside --overlap-moe-expert-parallel-comm that a plan does not hold
    (specs/experts.check_ep_overlap holds the rest): an alltoall or flex dispatcher (Megatron's default is
    allgather), no --moe-shared-expert-overlap beside it, and --delay-wgrad-compute only with it."""
    overlap = bool(args.get("--overlap-moe-expert-parallel-comm"))
    if overlap and "--num-experts" in args and (kind or "allgather") not in ("alltoall", "flex"):
        raise SpecError(f"--overlap-moe-expert-parallel-comm with the {kind or 'allgather (default)'} dispatcher: "
                        "megatron-core overlaps the alltoall and flex dispatchers only; add "
                        "--moe-token-dispatcher-type alltoall")
    if overlap and args.get("--moe-shared-expert-overlap"):
        raise SpecError("--overlap-moe-expert-parallel-comm with --moe-shared-expert-overlap: megatron-core refuses "
                        "the pair; drop --moe-shared-expert-overlap")
    if args.get("--delay-wgrad-compute") and not overlap:
        raise SpecError("--delay-wgrad-compute without --overlap-moe-expert-parallel-comm: megatron-core refuses it; "
                        "add the overlap or drop --delay-wgrad-compute")


def dispatcher(args: dict[str, Any], notes: list[str]) -> str:
    """The MoE token dispatcher as the cost model prices it: flex with the DeepEP backend (Megatron's default
    backend for flex) -> deepep; alltoall -> alltoall; allgather is read as alltoall, with a note. The MoE
    flags megatron-core refuses are refused first (_moe_flag_rules)."""
    _moe_flag_rules(args)
    kind = args.get("--moe-token-dispatcher-type", "allgather" if "--num-experts" in args else "alltoall")
    backend = args.get("--moe-flex-dispatcher-backend", "deepep")
    if args.get("--moe-enable-deepep") and "--num-experts" in args and (kind != "flex" or backend == "hybridep"):
        raise SpecError("--moe-enable-deepep needs --moe-token-dispatcher-type flex and no hybridep backend "
                        "(megatron-core's TransformerConfig refuses it otherwise); write --moe-token-dispatcher-type "
                        "flex --moe-flex-dispatcher-backend deepep")
    if kind == "flex" and backend == "deepep":
        return "deepep"
    if kind != "alltoall" and "--num-experts" in args:
        notes.append(f"--moe-token-dispatcher-type {kind}" + (f" ({backend})" if kind == "flex" else "")
                     + ": costed as the alltoall dispatcher (autotune prices alltoall and DeepEP)")
    return "alltoall"
