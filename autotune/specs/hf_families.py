"""Hugging Face config.json families whose blocks differ from Llama's in the keys they leave implicit: the MLP
(plain GeLU), the norm (LayerNorm), the biases and Falcon's key/value heads; BLOOM's and OPT's own shape keys;
and GPT-2-style keys (n_layer, n_embd; GPT-J and CodeGen rotate instead of learning positions, StarCoder's
gpt_bigcode has one key/value head). Costed with every linear's bias where a family has only some (GPT-J's MLP),
and two norms a block where a parallel block has one: both within 1e-4 of the parameter count. hf_config.py
reads the rest."""

from __future__ import annotations

from typing import Any

from autotune.errors import SpecError
from autotune.specs._strict import boolean, shown
from autotune.specs.model import ModelSpec, model_from_dict

#: Families whose MLP is one up-projection and a GeLU (c_fc/fc1 + c_proj/fc2, transformers' modeling files),
#: whatever hidden_act names: StarCoder2's gelu_pytorch_tanh is not Gemma's gated unit; Nemotron's up_proj,
#: squared ReLU and down_proj (transformers' models/nemotron/modeling_nemotron.py, NemotronMLP)
PLAIN_MLP_TYPES = ("gpt_neox", "starcoder2", "phi", "falcon", "gptj", "codegen", "bloom", "opt", "gpt_bigcode",
                   "nemotron")
#: Families normalized by LayerNorm (mean and variance) rather than RMSNorm; `norm_type` overrides. Nemotron's
#: NemotronLayerNorm1P is a LayerNorm with a bias (its weight stored less one)
_LAYERNORM_TYPES = ("bert", "gpt2", "opt", "falcon", "gpt_neox", "starcoder2", "phi", "gptj", "codegen", "bloom",
                    "stablelm", "nemotron")
#: Families with biases on every linear layer by default (their `use_bias` / `bias` / `attention_bias` keys win)
_BIASED_TYPES = ("gpt_neox", "starcoder2", "phi", "bloom", "opt", "codegen")
#: Keys of state-space or hybrid layers (Jamba, Mamba, Zamba, Falcon-Mamba): not Transformer blocks
STATE_SPACE_KEYS = ("mamba_d_state", "mamba_expand", "state_size", "ssm_cfg", "attn_layer_period")


#: Families whose block runs attention and the MLP side by side on one input and adds both to the residual
#: (transformers' GPTJBlock, CodeGenBlock, PhiDecoderLayer, CohereDecoderLayer); GPT-NeoX and StableLM by
#: use_parallel_residual (default true, false), Falcon by parallel_attn (default true) or new_decoder_architecture
#: (FalconDecoderLayer adds the attention output to the MLP's when either is set)
_PARALLEL_TYPES = ("gptj", "codegen", "phi", "cohere", "cohere2")
_PARALLEL_KEYS = {"gpt_neox": ("use_parallel_residual", True), "stablelm": ("use_parallel_residual", False),
                  "falcon": ("parallel_attn", True)}
#: The share of a head RoPE rotates where config.json leaves partial_rotary_factor (rotary_pct) out: the
#: families' transformers defaults (GPTNeoXConfig 0.25, PhiConfig 0.5, StableLmConfig 0.25, PersimmonConfig 0.5)
_ROTARY_DEFAULTS = {"gpt_neox": 0.25, "phi": 0.5, "stablelm": 0.25, "persimmon": 0.5}


def block_keys(data: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """The block's arrangement and position encoding where a family departs from Llama's: a parallel block,
    RoPE on part of each head (GPT-J's and CodeGen's rotary_dim, default 64, of their n_embd / n_head wide heads;
    partial_rotary_factor or GPT-NeoX's rotary_pct), ALiBi (BLOOM; Falcon with alibi true)."""
    out: dict[str, Any] = {}
    keyed = _PARALLEL_KEYS.get(model_type)
    falcon_new = model_type == "falcon" and switch(data, "new_decoder_architecture", False, where)
    if model_type in _PARALLEL_TYPES or falcon_new or (keyed and switch(data, keyed[0], keyed[1], where)):
        out["parallel_block"] = True
    if model_type == "bloom" or (model_type == "falcon" and switch(data, "alibi", False, where)):
        return {**out, "position_embedding": "alibi"}
    key = next((k for k in ("partial_rotary_factor", "rotary_pct") if data.get(k) is not None), None)
    share = _share(data[key], key, where) if key else _ROTARY_DEFAULTS.get(model_type, 1.0)
    if model_type in ("gptj", "codegen") and data.get("rotary_dim", 64) is not None:
        share = _rotary_dim_share(data, where)
    return {**out, "rotary_fraction": share} if share < 1 else out


def _rotary_dim_share(data: dict[str, Any], where: str) -> float:
    """GPT-J's and CodeGen's rotary_dim (default 64) over their head width, n_embd / n_head (whose own checks
    come later: 1 where they are not yet whole numbers)."""
    width, heads = data.get("n_embd"), data.get("n_head")
    if not (isinstance(width, int) and isinstance(heads, int) and heads > 0):
        return 1.0
    rotary_dim = _share(data.get("rotary_dim", 64), "rotary_dim", where)
    if rotary_dim > width // heads:
        raise SpecError(f"{where}: rotary_dim {rotary_dim:g} exceeds the head width {width // heads}; lower it")
    return rotary_dim / (width // heads)


def _share(value: Any, key: str, where: str) -> float:
    """A positive number from config.json (a rotary share or width)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise SpecError(f"{where}: {key} must be a number > 0, got {shown(value)}")
    if key != "rotary_dim" and value > 1:
        raise SpecError(f"{where}: {key} {value:g} must be a share of the head in (0, 1]; fix it")
    return float(value)


def kv_heads(data: dict[str, Any], model_type: str) -> Any:
    """Key/value heads: num_key_value_heads; Falcon's as FalconAttention takes them: num_kv_heads (default: every
    head) with new_decoder_architecture or without multi_query (default true), else one."""
    if data.get("num_key_value_heads") is not None:
        return data["num_key_value_heads"]
    if model_type == "falcon":
        if data.get("new_decoder_architecture") or not data.get("multi_query", True):
            return data["num_attention_heads"] if data.get("num_kv_heads") is None else data["num_kv_heads"]
        return 1
    return data["num_attention_heads"]


def family_keys(data: dict[str, Any]) -> dict[str, Any]:
    """A config.json of a family that names its shape otherwise, in Llama's keys: BLOOM (n_layer, n_embed or
    hidden_size, n_head; a 4h GeLU MLP; ALiBi, read as no position table), OPT (ffn_dim, activation_function;
    learned positions, max_position_embeddings + 2 rows), Falcon (ffn_hidden_size, default 4h)."""
    kind = str(data.get("model_type", ""))
    if kind == "bloom":
        hidden = data.get("hidden_size", data.get("n_embed"))
        out = {k: v for k, v in data.items() if k not in ("n_layer", "n_embed", "n_head")}
        return {**out, "num_hidden_layers": data.get("n_layer", data.get("num_hidden_layers")), "hidden_size": hidden,
                "num_attention_heads": data.get("n_head", data.get("num_attention_heads")),
                "intermediate_size": 4 * hidden if isinstance(hidden, int) else hidden, "hidden_act": "gelu"}
    if kind == "opt":
        return {**data, "intermediate_size": data.get("ffn_dim", data.get("intermediate_size")),
                "hidden_act": data.get("activation_function", "relu")}
    if kind == "falcon" and "intermediate_size" not in data and isinstance(data.get("hidden_size"), int):
        return {**data, "intermediate_size": data.get("ffn_hidden_size") or 4 * data["hidden_size"]}
    return data


def norm_of(model_type: str) -> str:
    """LayerNorm or RMSNorm, by family (transformers builds Starcoder2's LayerNorm whatever its norm_type says)."""
    return "layernorm" if model_type in _LAYERNORM_TYPES else "rmsnorm"


def bias_of(data: dict[str, Any], model_type: str, where: str) -> str:
    """Linear-layer biases: every layer's (`use_bias` StarCoder2, `bias` Falcon, the families with them by
    default), the QKV projection's alone (Qwen2), or none (attention_bias as given)."""
    for key in ("use_bias", "bias"):
        if data.get(key) is not None:
            return "all" if switch(data, key, False, where) else "none"
    if data.get("attention_bias") is None and model_type.startswith("qwen2"):
        return "qkv"
    return "all" if switch(data, "attention_bias", model_type in _BIASED_TYPES, where) else "none"


def model_from_gpt2_config(data: dict[str, Any], where: str) -> ModelSpec:
    """GPT-2/GPT-3 style keys (n_layer, n_embd, n_head, n_inner)."""
    missing = [k for k in ("n_layer", "n_embd", "n_head", "vocab_size") if k not in data]
    if missing:
        raise SpecError(f"{where}: GPT-2 style config is missing {', '.join(missing)}")
    hidden = data["n_embd"]
    rotary = str(data.get("model_type", "")) in ("gptj", "codegen") or bool(data.get("rotary_dim"))
    spec = {
        "name": where,
        "num_layers": data["n_layer"],
        "hidden_size": hidden,
        "num_heads": data["n_head"],
        "ffn_hidden_size": data.get("n_inner") or 4 * hidden,
        "vocab_size": data["vocab_size"],
        "activation": "gelu",
        "norm": "layernorm",
        "tied_embeddings": switch(data, "tie_word_embeddings", not rotary, where),
        "bias": "all",
        "dropout": True,
        "position_embedding": "learned",
        "max_position_embeddings": data.get("n_positions") or data.get("n_ctx") or 1024,
        "source": f"GPT-2 style config {where}",
    }
    if data.get("multi_query"):  # StarCoder 1 (gpt_bigcode): one key/value head
        spec["num_kv_heads"] = 1
    if rotary:  # GPT-J and CodeGen rotate (part of) each head and keep no position table; untied by default
        spec["position_embedding"] = "rope"
        del spec["max_position_embeddings"]
        spec.update(block_keys(data, str(data.get("model_type", "")), where))
    return model_from_dict(spec, where)


def switch(data: dict[str, Any], key: str, default: bool, where: str) -> bool:
    """A true/false key of config.json (`default` when absent or null): a string such as "false" is an error,
    not silently true."""
    return default if data.get(key) is None else boolean(data, key, where)
