"""What is trained: the shape of a decoder (or encoder) Transformer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from autotune.errors import SpecError
from autotune.specs._strict import boolean, check_keys, choice, positive_float, positive_int
from autotune.specs.limits import MAX_LAYERS, check_max, check_name

Activation = Literal["gelu", "swiglu", "geglu"]
ACTIVATIONS = ("gelu", "swiglu", "geglu")
NORMS = ("layernorm", "rmsnorm")
BIASES = ("none", "qkv", "all")
POSITIONS = ("rope", "learned")


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
    position_embedding: Literal["rope", "learned"] = "rope"
    """Rotary embeddings (an element-wise op per layer) or a learned table (max_position x h weights)."""
    max_position_embeddings: int = 0
    """Rows of the learned position table (0 for rope)."""
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
    """Router score function: softmax over experts (Mixtral, Qwen, GPT-OSS) or sigmoid (DeepSeek-V3)."""
    expert_bias: bool = False
    """Expert linear layers carry biases (GPT-OSS)."""
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
    source: str = ""
    """Where the shape comes from."""
    # Training hyperparameters the launch files need (not the cost model): defaults are the RoPE paper's base,
    # the common RMSNorm/LayerNorm epsilon and GPT-2's init std, which Hugging Face configs also default to.
    rope_theta: float = 10000.0
    """RoPE base (Llama 3: 500000; Qwen2.5: 1000000)."""
    rope_scaling: Literal["none", "llama3"] = "none"
    """RoPE frequency scaling: llama3 = Llama 3.1's (low 1, high 4, original context 8192)."""
    rope_scaling_factor: float = 1.0
    """The scaling factor (Llama 3.1: 8)."""
    norm_eps: float = 1e-5
    """Epsilon of the normalization layers."""
    init_std: float = 0.02
    """Standard deviation of the weight initialization (Hugging Face initializer_range)."""

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
             "max_position_embeddings", "source", "published_params_B", "description", "rope_theta", "rope_scaling",
             "rope_scaling_factor", "norm_eps", "init_std")
ROPE_SCALINGS = ("none", "llama3")
# Mixture-of-experts and MLA keys, kept apart from the list above
_OPTIONAL += ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "num_shared_experts",
              "shared_expert_ffn_hidden_size", "first_dense_layers", "moe_layer_freq", "router", "expert_bias",
              "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
              "published_active_params_B")
ROUTERS = ("softmax", "sigmoid")
_MOE_INTS = ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "num_shared_experts", "shared_expert_ffn_hidden_size",
             "first_dense_layers", "moe_layer_freq")
_MLA_INTS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def _count(data: dict[str, Any], key: str, where: str) -> int:
    """A whole number >= 0 (0 = the feature is absent)."""
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise SpecError(f"{where}: {key} must be a whole number >= 0, got {value!r}")
    return int(value)


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
    elif any(out.get(k) for k in _MOE_INTS if k != "moe_layer_freq"):
        raise SpecError(f"{where}: MoE fields are given but num_experts is 0; set num_experts")
    if "router" in data:
        out["router"] = choice(data, "router", ROUTERS, where)
    if "expert_bias" in data:
        out["expert_bias"] = boolean(data, "expert_bias", where)
    if out.get("kv_lora_rank"):
        for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if not out.get(key):
                raise SpecError(f"{where}: multi-head latent attention (kv_lora_rank > 0) needs {key} > 0; add it")
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
    moe = _moe_fields(data, positive_int(data, "num_layers", where), where)
    if moe.get("kv_lora_rank"):  # MLA: every head has its own key and value; head_dim is the query/key width
        kv, head_dim = heads, moe["qk_nope_head_dim"] + moe["qk_rope_head_dim"]
    return ModelSpec(
        name=check_name(data["name"], "name", where),
        num_layers=check_max(positive_int(data, "num_layers", where), MAX_LAYERS, "num_layers", where),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        ffn_hidden_size=positive_int(data, "ffn_hidden_size", where),
        vocab_size=positive_int(data, "vocab_size", where),
        activation=choice(data, "activation", ACTIVATIONS, where),  # type: ignore[arg-type]
        norm=choice(data, "norm", NORMS, where),  # type: ignore[arg-type]
        tied_embeddings=boolean(data, "tied_embeddings", where),
        bias=choice(data, "bias", BIASES, where) if "bias" in data else "none",  # type: ignore[arg-type]
        dropout=boolean(data, "dropout", where) if "dropout" in data else False,
        causal=boolean(data, "causal", where) if "causal" in data else True,
        position_embedding=position,  # type: ignore[arg-type]
        max_position_embeddings=max_pos,
        source=data.get("source", ""),
        rope_theta=positive_float(data, "rope_theta", where) if "rope_theta" in data else 10000.0,
        rope_scaling=choice(data, "rope_scaling", ROPE_SCALINGS, where)  # type: ignore[arg-type]
        if "rope_scaling" in data else "none",
        rope_scaling_factor=positive_float(data, "rope_scaling_factor", where) if "rope_scaling_factor" in data
        else 1.0,
        norm_eps=positive_float(data, "norm_eps", where) if "norm_eps" in data else 1e-5,
        init_std=positive_float(data, "init_std", where) if "init_std" in data else 0.02,
        **moe,
    )


# Hugging Face `hidden_act` values and the MLP they imply: Llama/Qwen/Mistral use a gated SiLU (SwiGLU),
# Gemma a gated GeLU (GeGLU); GPT-2/BERT a plain GeLU.
_HF_ACT = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu": "gelu", "gelu_new": "gelu",
           "gelu_fast": "gelu", "relu": "gelu"}
_UNTIED_BY_DEFAULT = ("llama", "mistral", "mixtral", "qwen2", "qwen3")
_GATED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "mixtral", "phi3")


def model_from_hf_config(data: dict[str, Any], where: str) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (Llama-style or GPT-2-style keys); other keys are ignored."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a JSON object")
    if isinstance(data.get("text_config"), dict) and "num_hidden_layers" not in data:
        data = data["text_config"]  # Llama 4 and other multimodal configs: the language model's shape
    if "n_layer" in data:
        return _model_from_gpt2_config(data, where)
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if k not in data]
    if missing:
        raise SpecError(f"{where}: Hugging Face config is missing {', '.join(missing)}; "
                        "a Llama-style config.json needs num_hidden_layers, hidden_size, num_attention_heads, "
                        "intermediate_size and vocab_size")
    act = data.get("hidden_act", data.get("hidden_activation", "silu"))
    if not isinstance(act, str) or act not in _HF_ACT:  # a list or object would not even hash
        raise SpecError(f"{where}: hidden_act {act!r} is not supported; use one of {', '.join(sorted(_HF_ACT))}")
    model_type = str(data.get("model_type", ""))
    moe = _hf_moe_keys(data, model_type, where)
    activation = _HF_ACT[act]
    if activation == "gelu" and model_type in _GATED_MODEL_TYPES:
        activation = "geglu"
    spec = {
        "name": where,
        "num_layers": data["num_hidden_layers"],
        "hidden_size": data["hidden_size"],
        "num_heads": data["num_attention_heads"],
        "num_kv_heads": data.get("num_key_value_heads") or data["num_attention_heads"],
        "ffn_hidden_size": data["intermediate_size"],
        "vocab_size": data["vocab_size"],
        "activation": activation,
        "norm": "layernorm" if model_type in ("bert", "gpt2", "opt", "falcon") else "rmsnorm",
        # transformers' default is tied, but Llama-family configs default to untied
        "tied_embeddings": bool(data.get("tie_word_embeddings", model_type not in _UNTIED_BY_DEFAULT)),
        "bias": "qkv" if data.get("attention_bias") is None and model_type.startswith("qwen2")
        else ("all" if data.get("attention_bias") else "none"),
        "source": f"Hugging Face config {where}",
    }
    if data.get("head_dim"):
        spec["head_dim"] = data["head_dim"]
    spec.update(_hf_training_keys(data))
    spec.update(moe)
    if model_type == "bert":
        spec.update(causal=False, dropout=True, bias="all", position_embedding="learned",
                    max_position_embeddings=data.get("max_position_embeddings", 512))
    return model_from_dict(spec, where)


#: Where each family's config.json keeps the expert count (the first key present wins)
_HF_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _hf_moe_keys(data: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """autotune's MoE and MLA keys from a Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, GPT-OSS or Llama 4 (text)
    config.json; {} for a dense model. A missing field an MoE model needs is an error naming it."""
    experts = next((data[k] for k in _HF_EXPERT_KEYS if data.get(k)), 0)
    out: dict[str, Any] = {}
    if data.get("kv_lora_rank"):  # DeepSeek-V2/V3 multi-head latent attention
        for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if not data.get(key):
                raise SpecError(f"{where}: a multi-head latent attention config needs {key}; add it")
            out[key] = data[key]
        out["q_lora_rank"] = data.get("q_lora_rank") or 0
    if not isinstance(experts, int) or isinstance(experts, bool) or experts <= 1:
        return out
    top_k = data.get("num_experts_per_tok", data.get("experts_per_token"))
    if not top_k:
        raise SpecError(f"{where}: a mixture-of-experts config ({experts} experts) needs num_experts_per_tok; "
                        "add it")
    # Mixtral, GPT-OSS and Llama 4 give the expert width as intermediate_size; Qwen-MoE and DeepSeek as
    # moe_intermediate_size (their intermediate_size is the dense MLP's)
    width = data.get("moe_intermediate_size") or data.get("intermediate_size")
    out.update(num_experts=experts, moe_top_k=top_k, moe_ffn_hidden_size=width)
    if data.get("n_shared_experts"):  # DeepSeek: shared experts as wide as a routed one
        out.update(num_shared_experts=data["n_shared_experts"], shared_expert_ffn_hidden_size=width)
    elif data.get("shared_expert_intermediate_size"):  # Qwen2-MoE: one shared expert of its own width
        out.update(num_shared_experts=1, shared_expert_ffn_hidden_size=data["shared_expert_intermediate_size"])
    elif model_type.startswith("llama4"):  # one shared expert of the routed width; dense layers use _mlp
        out.update(num_shared_experts=1, shared_expert_ffn_hidden_size=width)
    if data.get("intermediate_size_mlp"):
        out["ffn_hidden_size"] = data["intermediate_size_mlp"]
    if data.get("first_k_dense_replace"):
        out["first_dense_layers"] = data["first_k_dense_replace"]
    step = data.get("interleave_moe_layer_step") or data.get("decoder_sparse_step") or data.get("moe_layer_freq")
    if isinstance(step, int) and step > 1:
        out["moe_layer_freq"] = step
    if data.get("mlp_only_layers"):
        raise SpecError(f"{where}: mlp_only_layers {data['mlp_only_layers']} (dense layers among the MoE ones) "
                        "is not modelled; only dense layers before the first MoE layer are")
    if data.get("scoring_func") == "sigmoid":
        out["router"] = "sigmoid"
    if model_type == "gpt_oss":
        out["expert_bias"] = True
    return out


def _hf_training_keys(data: dict[str, Any]) -> dict[str, Any]:
    """RoPE base and scaling, norm epsilon and init std of a Llama-style config.json, where given (Llama 3.1's
    rope_scaling is {"rope_type": "llama3", "factor": 8.0, ...}; other scaling types are not carried)."""
    out: dict[str, Any] = {}
    for key, ours in (("rope_theta", "rope_theta"), ("rms_norm_eps", "norm_eps"), ("layer_norm_eps", "norm_eps"),
                      ("initializer_range", "init_std")):
        if isinstance(data.get(key), (int, float)) and not isinstance(data.get(key), bool) and data[key] > 0:
            out[ours] = float(data[key])
    scaling = data.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "llama3":
        out["rope_scaling"] = "llama3"
        if isinstance(scaling.get("factor"), (int, float)) and scaling["factor"] > 0:
            out["rope_scaling_factor"] = float(scaling["factor"])
    return out


def _model_from_gpt2_config(data: dict[str, Any], where: str) -> ModelSpec:
    """GPT-2/GPT-3 style keys (n_layer, n_embd, n_head, n_inner)."""
    missing = [k for k in ("n_layer", "n_embd", "n_head", "vocab_size") if k not in data]
    if missing:
        raise SpecError(f"{where}: GPT-2 style config is missing {', '.join(missing)}")
    hidden = data["n_embd"]
    spec = {
        "name": where,
        "num_layers": data["n_layer"],
        "hidden_size": hidden,
        "num_heads": data["n_head"],
        "ffn_hidden_size": data.get("n_inner") or 4 * hidden,
        "vocab_size": data["vocab_size"],
        "activation": "gelu",
        "norm": "layernorm",
        "tied_embeddings": bool(data.get("tie_word_embeddings", True)),
        "bias": "all",
        "dropout": True,
        "position_embedding": "learned",
        "max_position_embeddings": data.get("n_positions") or data.get("n_ctx") or 1024,
        "source": f"GPT-2 style config {where}",
    }
    return model_from_dict(spec, where)
