"""What is trained: the shape of a decoder (or encoder) Transformer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from autotune.errors import SpecError
from autotune.specs._strict import boolean, check_keys, choice, positive_int
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
    source: str = ""
    """Where the shape comes from."""

    @property
    def gated(self) -> bool:
        """Gated MLPs (SwiGLU, GeGLU) have three weight matrices instead of two."""
        return self.activation in ("swiglu", "geglu")

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
             "max_position_embeddings", "source", "published_params_B", "description")


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
    if "n_layer" in data:
        return _model_from_gpt2_config(data, where)
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if k not in data]
    if missing:
        raise SpecError(f"{where}: Hugging Face config is missing {', '.join(missing)}; "
                        "a Llama-style config.json needs num_hidden_layers, hidden_size, num_attention_heads, "
                        "intermediate_size and vocab_size")
    act = data.get("hidden_act", data.get("hidden_activation", "silu"))
    if act not in _HF_ACT:
        raise SpecError(f"{where}: hidden_act {act!r} is not supported; use one of {', '.join(sorted(_HF_ACT))}")
    model_type = str(data.get("model_type", ""))
    experts = data.get("num_local_experts") or data.get("num_experts") or data.get("n_routed_experts")
    if isinstance(experts, int) and experts > 1:
        raise SpecError(f"{where}: a mixture-of-experts model ({experts} experts) is not modelled yet; autotune "
                        "would count it as dense; use a dense model")
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
    if model_type == "bert":
        spec.update(causal=False, dropout=True, bias="all", position_embedding="learned",
                    max_position_embeddings=data.get("max_position_embeddings", 512))
    return model_from_dict(spec, where)


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
