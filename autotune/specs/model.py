"""What is trained: the shape of a decoder (or encoder) Transformer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from autotune.errors import SpecError
from autotune.specs._strict import (boolean, check_keys, choice, fraction, nonneg_float, positive_float, positive_int,
                                    shown)
from autotune.specs.limits import MAX_LAYERS, check_max, check_name, int_maximum

Activation = Literal["gelu", "swiglu", "geglu"]
ACTIVATIONS = ("gelu", "swiglu", "geglu")
NORMS = ("layernorm", "rmsnorm")
BIASES = ("none", "qkv", "all")
POSITIONS = ("rope", "learned", "alibi")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A Transformer's shape. Every size is a count of elements, never bytes."""

    name: str
    """Catalog name or the path it was loaded from."""
    num_layers: int
    """Transformer blocks."""
    hidden_size: int
    """Model width h."""
    num_heads: int
    """Query heads a."""
    num_kv_heads: int
    """Key/value heads (== num_heads without grouped-query attention)."""
    head_dim: int
    """Per-head width d (hidden_size / num_heads unless the model says otherwise, e.g. Gemma-2)."""
    ffn_hidden_size: int
    """MLP inner width f (per branch for gated activations)."""
    vocab_size: int
    """Vocabulary V (padded as the trainer pads it, where the source says so)."""
    activation: Activation
    """gelu (two MLP matrices) or a gated unit swiglu/geglu (three matrices)."""
    norm: Literal["layernorm", "rmsnorm"]
    """Normalization type; layernorm has a bias vector, rmsnorm does not."""
    tied_embeddings: bool
    """True when the LM head reuses the input embedding matrix."""
    bias: Literal["none", "qkv", "all"] = "none"
    """Which linear layers carry a bias vector."""
    dropout: bool = False
    """Whether dropout layers exist (they store 1-byte masks, Korthikanti et al. 2022)."""
    causal: bool = True
    """Causal (decoder) attention; flash attention then skips the masked half of the score matrix."""
    position_embedding: Literal["rope", "learned", "alibi"] = "rope"
    """Rotary embeddings (an element-wise op per layer), a learned table (max_position x h weights) or ALiBi's
    per-head score bias (BLOOM: no weights, no op of its own: flash attention adds it in-kernel)."""
    max_position_embeddings: int = 0
    """Rows of the learned position table (0 otherwise)."""
    rotary_fraction: float = 1.0
    """Share of each head RoPE rotates (Pythia 0.25, Phi-2 0.4); costed whole: the kernel reads whole heads."""
    parallel_block: bool = False
    """Attention and MLP side by side on one input (GPT-J, NeoX, Falcon): costed (and emitted) as sequential."""
    # ---- mixture of experts (all 0 for a dense model: nothing below changes a dense model's costs)
    num_experts: int = 0
    """Routed experts per MoE layer (0 = dense MLP in every layer)."""
    moe_top_k: int = 0
    """Routed experts each token is sent to."""
    moe_ffn_hidden_size: int = 0
    """Inner width of one routed expert's MLP (per branch for gated activations)."""
    num_shared_experts: int = 0
    """Always-active shared experts (DeepSeek); they run as one dense MLP beside the routed ones."""
    shared_expert_ffn_hidden_size: int = 0
    """Inner width of ONE shared expert (the shared MLP is num_shared_experts times as wide)."""
    first_dense_layers: int = 0
    """Leading layers with a dense MLP of ffn_hidden_size (DeepSeek's first_k_dense_replace)."""
    moe_layer_freq: int = 1
    """After the dense-first layers, every moe_layer_freq-th layer is MoE (1 = all; Llama 4 Maverick: 2)."""
    router: Literal["softmax", "sigmoid"] = "softmax"
    """Router score function: softmax over experts (Mixtral, Qwen, GPT-OSS) or sigmoid (DeepSeek-V3, Llama 4)."""
    router_bias: bool = False
    """A per-expert bias steers the routing instead of an auxiliary loss (DeepSeek-V3's auxiliary-loss-free
    balancing, config.json topk_method noaux_tc); it needs the sigmoid router."""
    expert_bias: bool = False
    """Expert linear layers carry biases (GPT-OSS)."""
    moe_router_groups: int = 0
    """Group-limited routing: the experts fall in this many equal groups (DeepSeek-V3's n_group 8; 0 = none)."""
    moe_router_group_topk: int = 0
    """...and a token's experts come from at most this many of them (topk_group 4: with a group per node, a token
    reaches at most 4 nodes, DeepSeek-V3's node-limited routing)."""
    moe_router_scaling: float = 1.0
    """Scale of the routed experts' weighted output (routed_scaling_factor; DeepSeek-V3 2.5): a training setting,
    no cost."""
    # ---- multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0 = ordinary attention
    q_lora_rank: int = 0
    """Rank of the query down-projection (0 = a full-rank query projection, DeepSeek-V2-Lite)."""
    kv_lora_rank: int = 0
    """Rank of the compressed key/value latent."""
    qk_rope_head_dim: int = 0
    """Per-head width of the rotary part of queries and keys (the key's is shared by all heads)."""
    qk_nope_head_dim: int = 0
    """Per-head width of the non-rotary part of queries and keys."""
    v_head_dim: int = 0
    """Per-head width of the values."""
    # ---- attention window and activation clamp (0 = absent: nothing below changes a model without them)
    sliding_window: int = 0
    """Keys a windowed layer's query attends to, itself included (Hugging Face sliding_window; GPT-OSS 128,
    Gemma 2 4096); 0 = every layer attends over the whole causal prefix."""
    sliding_window_layers: int = 0
    """Layers that use the window (GPT-OSS: 18 of 36, alternating; Mistral: all); the others attend in full."""
    chunked_attention: bool = False
    """The window is a chunk (Llama 4's attention_chunk_size 8192): a query sees the keys of its own chunk up to
    itself, not the w keys behind it; the layers are sliding_window_layers (Llama 4: 3 of 4, the RoPE ones)."""
    glu_clamp: float = 0.0
    """Clamp limit of the gated unit's two halves (GPT-OSS swiglu_limit 7.0; Megatron
    activation_func_clamp_value); 0 = no clamp."""
    attn_logit_softcap: float = 0.0
    """Soft cap of the attention scores, cap * tanh(score / cap) (Gemma 2: Hugging Face attn_logit_softcapping
    50.0); 0 = none. Not costed (one element-wise op inside the attention kernel); emitters say where their
    config cannot set it."""
    final_logit_softcap: float = 0.0
    """Soft cap of the LM head's logits (Gemma 2: Hugging Face final_logit_softcapping 30.0); 0 = none."""
    qk_norm: bool = False
    """An RMSNorm over every query and key head before RoPE (Qwen3's q_norm and k_norm; Megatron's
    --qk-layernorm)."""
    mtp_layers: int = 0
    """Multi-token prediction modules trained beside the model (DeepSeek-V3: 1; Hugging Face
    num_nextn_predict_layers, Megatron --mtp-num-layers). Each predicts one token further from the last
    layer's output: it embeds the shifted tokens, normalizes both inputs, projects their concatenation 2h -> h,
    runs one Transformer layer of the last layer's kind, then the shared final norm, LM head and a
    cross-entropy, all on the last pipeline stage (costmodel/mtp.py)."""
    source: str = ""
    """Where the shape comes from."""
    catalog_name: str = ""
    """The catalog model this one is exactly (a hub config.json of a catalog model; catalog.load_model sets it):
    the name trainers that ship models by name know it by (known_as); "" for any other."""
    # Training hyperparameters the launch files need (not the cost model): defaults are the RoPE paper's base,
    # the common RMSNorm/LayerNorm epsilon and GPT-2's init std, which Hugging Face configs also default to.
    rope_theta: float = 10000.0
    """RoPE base (Llama 3: 500000; Qwen2.5: 1000000)."""
    rope_scaling: Literal["none", "llama3", "yarn", "linear"] = "none"
    """RoPE frequency scaling: llama3 = Llama 3.1's (low 1, high 4, original context 8192); yarn = YaRN, the
    context extension a released DeepSeek-V3 or GPT-OSS checkpoint carries; linear = position interpolation
    (positions divided by the factor: Gemma 3's global layers). yarn and linear are recorded so that a launch
    config that does not write them says so (emit.rope_scaling_warning)."""
    rope_scaling_factor: float = 1.0
    """The scaling factor (Llama 3.1: 8)."""
    norm_eps: float = 1e-5
    """Epsilon of the normalization layers."""
    init_std: float = 0.02
    """Standard deviation of the weight initialization (Hugging Face initializer_range)."""

    @property
    def known_as(self) -> str:
        """The name a trainer's registry knows this model by: its catalog twin's, else its own."""
        return self.catalog_name or self.name

    @property
    def gated(self) -> bool:
        """Gated MLPs (SwiGLU, GeGLU) have three weight matrices instead of two."""
        return self.activation in ("swiglu", "geglu")

    @property
    def is_moe(self) -> bool:
        """Mixture of experts: some layers route tokens to num_experts expert MLPs."""
        return self.num_experts > 0

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek): keys and values come out of a low-rank latent."""
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts: after the dense-first layers, the last layer of every group
        of moe_layer_freq (Hugging Face's Llama 4 rule (i + 1) % step == 0; the emitters write the pattern out
        layer by layer, so Megatron's own first-of-group convention never applies)."""
        if not self.is_moe:
            return 0
        return (self.num_layers - self.first_dense_layers) // self.moe_layer_freq

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` (0-based) is an MoE layer (the pattern of num_moe_layers)."""
        if not self.is_moe or index < self.first_dense_layers:
            return False
        return (index - self.first_dense_layers) % self.moe_layer_freq == self.moe_layer_freq - 1

    @property
    def sliding_share(self) -> float:
        """Fraction of the layers that attend through the sliding window (0 without one)."""
        return self.sliding_window_layers / self.num_layers if self.sliding_window else 0.0

    @property
    def q_width(self) -> int:
        """Width of all query heads together (a * d)."""
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of all key heads together (kv * d); the values have the same width."""
        return self.num_kv_heads * self.head_dim


_REQUIRED = ("name", "num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size", "activation",
             "norm", "tied_embeddings")
_OPTIONAL = ("schema", "num_kv_heads", "head_dim", "bias", "dropout", "causal", "position_embedding",
             "max_position_embeddings", "source", "catalog_name", "published_params_B", "description", "rope_theta",
             "rope_scaling", "rope_scaling_factor", "norm_eps", "init_std", "rotary_fraction", "parallel_block")
ROPE_SCALINGS = ("none", "llama3", "yarn", "linear")
#: More multi-token prediction modules than any published model trains (DeepSeek-V3: 1)
MAX_MTP_LAYERS = 16
# Mixture-of-experts and MLA keys, kept apart from the list above
_OPTIONAL += ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "num_shared_experts",
              "shared_expert_ffn_hidden_size", "first_dense_layers", "moe_layer_freq", "router", "expert_bias",
              "router_bias", "moe_router_groups", "moe_router_group_topk", "moe_router_scaling", "q_lora_rank",
              "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "published_active_params_B")
# Attention window and gated-unit clamp
_OPTIONAL += ("sliding_window", "sliding_window_layers", "glu_clamp", "qk_norm", "mtp_layers", "attn_logit_softcap",
              "final_logit_softcap", "chunked_attention")
ROUTERS = ("softmax", "sigmoid")
_MOE_INTS = ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "num_shared_experts", "shared_expert_ffn_hidden_size",
             "first_dense_layers", "moe_layer_freq", "moe_router_groups", "moe_router_group_topk")
_MLA_INTS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def _count(data: dict[str, Any], key: str, where: str) -> int:
    """A whole number >= 0 (0 = the feature is absent)."""
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)) or value != int(value) or value < 0:
        raise SpecError(f"{where}: {key} must be a whole number >= 0, got {shown(value)}"[:200])
    return check_max(int(value), int_maximum(key), key, where)


def _moe_fields(data: dict[str, Any], num_layers: int, where: str) -> dict[str, Any]:
    """The mixture-of-experts and MLA keys, checked: an MoE model needs its top-k and expert width, top-k may
    not exceed the experts, MLA needs its ranks and head widths."""
    out: dict[str, Any] = {k: _count(data, k, where) for k in _MOE_INTS + _MLA_INTS if k in data}
    experts = out.get("num_experts", 0)
    if experts:
        for key in ("moe_top_k", "moe_ffn_hidden_size"):
            if not out.get(key):
                raise SpecError(f"{where}: an MoE model ({experts} experts) needs {key} > 0; add it")
        if out["moe_top_k"] > experts:
            raise SpecError(f"{where}: moe_top_k {out['moe_top_k']} exceeds num_experts {experts}; a token is "
                            "routed to at most every expert")
        if out.get("num_shared_experts") and not out.get("shared_expert_ffn_hidden_size"):
            raise SpecError(f"{where}: num_shared_experts needs shared_expert_ffn_hidden_size (one shared "
                            "expert's width); add it")
        if out.get("moe_layer_freq", 1) < 1:
            raise SpecError(f"{where}: moe_layer_freq must be >= 1, got {out['moe_layer_freq']}")
        if out.get("first_dense_layers", 0) >= num_layers:
            raise SpecError(f"{where}: first_dense_layers {out['first_dense_layers']} leaves no MoE layer of "
                            f"{num_layers}; lower it")
        if out.get("moe_layer_freq", 1) > num_layers - out.get("first_dense_layers", 0):
            raise SpecError(f"{where}: moe_layer_freq {out['moe_layer_freq']} (every {out['moe_layer_freq']}-th "
                            f"layer MoE) leaves no MoE layer of {num_layers}; lower it, or drop the expert fields "
                            "for a dense model")
        _check_router_groups(out, experts, where)
    elif any(out.get(k) for k in _MOE_INTS if k != "moe_layer_freq"):
        raise SpecError(f"{where}: MoE fields are given but num_experts is 0; set num_experts")
    if "router" in data:
        out["router"] = choice(data, "router", ROUTERS, where)
    if "expert_bias" in data:
        out["expert_bias"] = boolean(data, "expert_bias", where)
    if "router_bias" in data:
        out["router_bias"] = boolean(data, "router_bias", where)
        if out["router_bias"] and out.get("router", "softmax") != "sigmoid":
            raise SpecError(f"{where}: router_bias (auxiliary-loss-free balancing) needs router 'sigmoid'; set it")
    if "moe_router_scaling" in data:
        scale = data["moe_router_scaling"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1e3:
            raise SpecError(f"{where}: moe_router_scaling must be a number in (0, 1000], got {shown(scale)}")
        out["moe_router_scaling"] = float(scale)
    if out.get("kv_lora_rank"):
        for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if not out.get(key):
                raise SpecError(f"{where}: multi-head latent attention (kv_lora_rank > 0) needs {key} > 0; add it")
    return out


def _check_router_groups(out: dict[str, Any], experts: int, where: str) -> None:
    """Group-limited routing: groups that divide the experts, at most as many chosen as there are, holding at
    least top-k experts between them (or neither field)."""
    groups, chosen = out.get("moe_router_groups", 0), out.get("moe_router_group_topk", 0)
    if groups <= 1 and chosen <= 1:
        return
    if groups < 2 or experts % groups:
        raise SpecError(f"{where}: moe_router_groups {groups} must divide num_experts {experts} into 2 or more "
                        "groups; fix it, or drop both group fields")
    if not 1 <= chosen <= min(groups, out["moe_top_k"]) or chosen * (experts // groups) < out["moe_top_k"]:
        raise SpecError(f"{where}: moe_router_group_topk {chosen} must pick 1..{min(groups, out['moe_top_k'])} "
                        f"groups (at most moe_top_k, each giving top_k / group_topk experts) holding at least "
                        f"moe_top_k {out['moe_top_k']} experts; fix it")


def _window_and_clamp(data: dict[str, Any], num_layers: int, gated: bool, causal: bool,
                      where: str) -> dict[str, Any]:
    """sliding_window, sliding_window_layers (default: every layer, as Mistral's window applies), glu_clamp and
    the logit soft caps, checked: the layers lie in [0, num_layers] and need a window; the window needs causal
    attention (a query sees the window behind it); the clamp needs a gated unit; a cap is >= 0 (0: none)."""
    out: dict[str, Any] = {}
    window = _count(data, "sliding_window", where) if "sliding_window" in data else 0
    layers = _count(data, "sliding_window_layers", where) if "sliding_window_layers" in data else (
        num_layers if window else 0)
    if layers and not window:
        raise SpecError(f"{where}: sliding_window_layers {layers} needs sliding_window > 0; set the window")
    if layers > num_layers:
        raise SpecError(f"{where}: sliding_window_layers {layers} exceeds num_layers {num_layers}; lower it")
    if window and not causal:
        raise SpecError(f"{where}: sliding_window needs causal attention (a query sees the keys behind it); "
                        "drop it or set causal true")
    if window and layers:
        out.update(sliding_window=window, sliding_window_layers=layers)
        if "chunked_attention" in data:
            out["chunked_attention"] = boolean(data, "chunked_attention", where)
    elif data.get("chunked_attention"):
        raise SpecError(f"{where}: chunked_attention needs sliding_window (the chunk) > 0; set it")
    if "glu_clamp" in data:
        clamp = nonneg_float(data, "glu_clamp", where)
        if clamp and not gated:
            raise SpecError(f"{where}: glu_clamp {clamp:g} needs a gated activation (swiglu or geglu); drop it")
        out["glu_clamp"] = clamp
    for key in ("attn_logit_softcap", "final_logit_softcap"):
        if key in data:
            out[key] = nonneg_float(data, key, where)
    return out


def model_from_dict(data: dict[str, Any], where: str) -> ModelSpec:
    """Build a ModelSpec from autotune's own model file format (strict: unknown keys are errors)."""
    check_keys(data, required=_REQUIRED, optional=_OPTIONAL, where=where)
    heads = positive_int(data, "num_heads", where)
    hidden = positive_int(data, "hidden_size", where)
    kv = positive_int(data, "num_kv_heads", where) if "num_kv_heads" in data else heads
    if hidden % heads and "head_dim" not in data:
        raise SpecError(f"{where}: hidden_size {hidden} is not divisible by num_heads {heads}; give head_dim")
    head_dim = positive_int(data, "head_dim", where) if "head_dim" in data else hidden // heads
    if heads % kv:
        raise SpecError(f"{where}: num_heads {heads} must be a multiple of num_kv_heads {kv}")
    position = choice(data, "position_embedding", POSITIONS, where) if "position_embedding" in data else "rope"
    max_pos = positive_int(data, "max_position_embeddings", where) if "max_position_embeddings" in data else 0
    if position == "learned" and not max_pos:
        raise SpecError(f"{where}: position_embedding 'learned' needs max_position_embeddings")
    rotary = fraction(data, "rotary_fraction", where) if "rotary_fraction" in data else 1.0
    if rotary < 1 and position != "rope":
        raise SpecError(f"{where}: rotary_fraction {rotary:g} needs position_embedding 'rope'; drop it")
    moe = _moe_fields(data, positive_int(data, "num_layers", where), where)
    activation = choice(data, "activation", ACTIVATIONS, where)
    causal = boolean(data, "causal", where) if "causal" in data else True
    extra = _window_and_clamp(data, positive_int(data, "num_layers", where), activation in ("swiglu", "geglu"),
                              causal, where)
    if moe.get("kv_lora_rank"):  # MLA: every head has its own key and value; head_dim is the query/key width
        kv, head_dim = heads, moe["qk_nope_head_dim"] + moe["qk_rope_head_dim"]
    mtp = _count(data, "mtp_layers", where) if "mtp_layers" in data else 0
    if mtp and not causal:
        raise SpecError(f"{where}: mtp_layers {mtp} needs a causal language model; drop it or set causal true")
    return ModelSpec(
        name=check_name(data["name"], "name", where),
        num_layers=check_max(positive_int(data, "num_layers", where), MAX_LAYERS, "num_layers", where),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        ffn_hidden_size=positive_int(data, "ffn_hidden_size", where),
        vocab_size=positive_int(data, "vocab_size", where),
        activation=activation,  # type: ignore[arg-type]
        norm=choice(data, "norm", NORMS, where),  # type: ignore[arg-type]
        tied_embeddings=boolean(data, "tied_embeddings", where),
        bias=choice(data, "bias", BIASES, where) if "bias" in data else "none",  # type: ignore[arg-type]
        dropout=boolean(data, "dropout", where) if "dropout" in data else False,
        causal=causal,
        qk_norm=boolean(data, "qk_norm", where) if "qk_norm" in data else False,
        mtp_layers=check_max(mtp, MAX_MTP_LAYERS, "mtp_layers", where),
        position_embedding=position,  # type: ignore[arg-type]
        max_position_embeddings=max_pos,
        rotary_fraction=rotary, parallel_block=boolean(data, "parallel_block", where) if "parallel_block" in data
        else False,
        source=data.get("source", ""),
        catalog_name=check_name(data["catalog_name"], "catalog_name", where) if data.get("catalog_name") else "",
        rope_theta=positive_float(data, "rope_theta", where) if "rope_theta" in data else 10000.0,
        rope_scaling=choice(data, "rope_scaling", ROPE_SCALINGS, where)  # type: ignore[arg-type]
        if "rope_scaling" in data else "none",
        rope_scaling_factor=positive_float(data, "rope_scaling_factor", where) if "rope_scaling_factor" in data
        else 1.0,
        norm_eps=positive_float(data, "norm_eps", where) if "norm_eps" in data else 1e-5,
        init_std=positive_float(data, "init_std", where) if "init_std" in data else 0.02,
        **moe,
        **extra,
    )


def model_from_hf_config(data: dict[str, Any], where: str) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (Llama-style or GPT-2-style keys); other keys are ignored
    (specs/hf_config.py)."""
    from autotune.specs.hf_config import model_from_hf_config as parse  # it builds on model_from_dict above

    return parse(data, where)
