"""Hugging Face ``config.json`` files (Llama-, Mistral-, Gemma-, Qwen-, MoE- and GPT-2-style keys) as autotune's
own model format, which specs/model.py checks."""

from __future__ import annotations

import math
import re
from typing import Any

from autotune.errors import SpecError
from autotune.specs._strict import shown
from autotune.specs.hf_families import (PLAIN_MLP_TYPES, STATE_SPACE_KEYS, bias_of, block_keys, family_keys,
                                        kv_heads, model_from_gpt2_config, norm_of, switch)
from autotune.specs.model import ModelSpec, model_from_dict


# Hugging Face `hidden_act` values and the MLP they imply: Llama/Qwen/Mistral use a gated SiLU (SwiGLU),
# Gemma a gated GeLU (GeGLU); GPT-2/BERT a plain GeLU. ReLU and Nemotron's squared ReLU (relu2) are costed as
# GeLU: the same two matrices, and one element-wise pass of the same bytes.
_HF_ACT = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu": "gelu", "gelu_new": "gelu",
           "gelu_fast": "gelu", "relu": "gelu", "relu2": "gelu"}
_UNTIED_BY_DEFAULT = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gpt_neox", "phi", "nemotron")
#: What transformers fills in for a key a config leaves out, by the model_type of the config that holds the
#: shape. transformers saves a nested config without the keys equal to its defaults, so Gemma 3's multimodal
#: config.json files (google/gemma-3-4b/12b/27b) give only those that differ from Gemma3TextConfig's: never
#: vocab_size, and the 4B neither its heads nor head_dim (transformers 4.50.0,
#: models/gemma3/configuration_gemma3.py, Gemma3TextConfig.__init__).
TEXT_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {"gemma3_text": {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 1_000_000.0, "attention_bias": False,
    "sliding_window": 4096, "sliding_window_pattern": 6, "initializer_range": 0.02,
    "attn_logit_softcapping": None, "final_logit_softcapping": None}}
#: The model_type of the text_config a multimodal wrapper builds when its text_config names none
#: (transformers' Gemma3Config makes a Gemma3TextConfig of any text_config dict)
_TEXT_MODEL_TYPES = {"gemma3": "gemma3_text"}
#: Families whose attention normalizes its queries and keys (transformers' q_norm and k_norm: per head, or over
#: the whole projection in OLMo 2, the same bytes and a norm's cost either way)
_QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2")
_GATED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "mixtral",
                      "phi3")


def _language_model(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The keys that shape the language model: a multimodal wrapper's text_config (Llama 4 keeps
    tie_word_embeddings at the top level, beside it), with what transformers fills in for the keys left out."""
    if "text_config" in data and "num_hidden_layers" not in data:
        text = data["text_config"]
        if not isinstance(text, dict) or not text:
            raise SpecError(f"{where}: text_config must be an object holding the language model's keys "
                            f"(num_hidden_layers, hidden_size, ...), got {text!r}"[:300])
        kind = text.get("model_type") or _TEXT_MODEL_TYPES.get(str(data.get("model_type", "")), "")
        tied = {"tie_word_embeddings": data["tie_word_embeddings"]} if "tie_word_embeddings" in data else {}
        data = {**tied, **text, "model_type": kind} if kind else {**tied, **text}
    return {**TEXT_CONFIG_DEFAULTS.get(str(data.get("model_type", "")), {}), **data}


def model_from_hf_config(data: dict[str, Any], where: str) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (Llama-style or GPT-2-style keys); other keys are ignored."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a JSON object")
    data = family_keys(_language_model(data, where))
    if "n_layer" in data:
        return model_from_gpt2_config(data, where)
    model_type = str(data.get("model_type", ""))
    if ssm := [k for k in STATE_SPACE_KEYS if data.get(k) is not None]:
        raise SpecError(f"{where}: {', '.join(ssm)}: a {model_type or 'state-space'} model has state-space (Mamba) "
                        "layers, which autotune does not model; it plans Transformer blocks only")
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if k not in data]
    if missing:
        raise SpecError(f"{where}: Hugging Face config is missing {', '.join(missing)}; "
                        "a Llama-style config.json needs num_hidden_layers, hidden_size, num_attention_heads, "
                        "intermediate_size and vocab_size")
    act = data.get("hidden_act", data.get("hidden_activation", "gelu" if model_type in PLAIN_MLP_TYPES else "silu"))
    if not isinstance(act, str) or act not in _HF_ACT:  # a list or object would not even hash
        raise SpecError(f"{where}: hidden_act {act!r} is not supported; use one of {', '.join(sorted(_HF_ACT))}")
    moe = _hf_moe_keys(data, model_type, where)
    activation = "gelu" if model_type in PLAIN_MLP_TYPES else _HF_ACT[act]
    if activation == "gelu" and model_type in _GATED_MODEL_TYPES:
        activation = "geglu"
    spec = {
        "name": where,
        "num_layers": data["num_hidden_layers"],
        "hidden_size": data["hidden_size"],
        "num_heads": data["num_attention_heads"],
        "num_kv_heads": kv_heads(data, model_type),
        "ffn_hidden_size": data["intermediate_size"],
        "vocab_size": data["vocab_size"],
        "activation": activation,
        "norm": norm_of(model_type),
        # transformers' default is tied, but Llama-family configs default to untied
        "tied_embeddings": switch(data, "tie_word_embeddings", model_type not in _UNTIED_BY_DEFAULT, where),
        "bias": bias_of(data, model_type, where),
        "source": f"Hugging Face config {where}",
    }
    if data.get("head_dim") is not None:  # null: hidden / heads, as transformers takes it
        spec["head_dim"] = data["head_dim"]
    if model_type in _QK_NORM_TYPES:
        spec["qk_norm"] = True
    spec.update(_hf_training_keys(data, where))
    if data.get("num_nextn_predict_layers"):  # multi-token prediction modules (DeepSeek-V3, MiMo)
        spec["mtp_layers"] = data["num_nextn_predict_layers"]
    spec.update(moe)
    spec.update(_hf_window_and_clamp(data, model_type, where))
    spec.update(block_keys(data, model_type, where))
    if model_type == "opt":  # a learned table with OPT's 2-row offset
        spec.update(position_embedding="learned", max_position_embeddings=data.get("max_position_embeddings", 2048) + 2)
    if model_type == "bert":
        spec.update(causal=False, dropout=True, bias="all", position_embedding="learned",
                    max_position_embeddings=data.get("max_position_embeddings", 512))
    try:
        return model_from_dict(spec, where)
    except SpecError as exc:  # name the config.json key the user wrote, not autotune's field it became
        raise SpecError(_hf_names(str(exc))) from None


#: Families whose config.json gives the expert width apart from the dense MLP's (moe_intermediate_size).
_MOE_WIDTH_APART = ("qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
#: Where each family's config.json keeps the expert count (the first key present wins)
_HF_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _hf_moe_keys(data: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """autotune's MoE and MLA keys from a Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, GPT-OSS or Llama 4 (text)
    config.json; {} for a dense model. A missing field an MoE model needs is an error naming it."""
    key = next((k for k in _HF_EXPERT_KEYS if data.get(k) is not None), None)
    experts = data[key] if key else 0
    if key and (not isinstance(experts, int) or isinstance(experts, bool) or experts < 0):
        raise SpecError(f"{where}: {key} {shown(experts)} must be a whole number of experts (> 1 for a mixture of "
                        "experts); fix it, or drop it for a dense model")
    if key and experts == 0 and data.get("num_experts_per_tok"):
        raise SpecError(f"{where}: {key} 0 with num_experts_per_tok {shown(data['num_experts_per_tok'])}: give the "
                        "expert count (> 1), or drop both for a dense model")
    if experts == 1 and isinstance(data.get("num_experts_per_tok"), int) and data["num_experts_per_tok"] > 1:
        raise SpecError(f"{where}: num_experts_per_tok {data['num_experts_per_tok']} exceeds {key} 1; give the "
                        "expert count, or drop both for a dense model")
    out: dict[str, Any] = {}
    if data.get("q_lora_rank") and not data.get("kv_lora_rank"):  # a query LoRA belongs to latent attention
        raise SpecError(f"{where}: q_lora_rank {shown(data['q_lora_rank'])} without kv_lora_rank: multi-head latent "
                        "attention needs kv_lora_rank (DeepSeek-V3: 512); add it, or drop q_lora_rank")
    if data.get("kv_lora_rank"):  # DeepSeek-V2/V3 multi-head latent attention
        for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if not data.get(key):
                raise SpecError(f"{where}: a multi-head latent attention config needs {key}; add it")
            out[key] = data[key]
        out["q_lora_rank"] = data.get("q_lora_rank") or 0
    if not isinstance(experts, int) or isinstance(experts, bool) or experts <= 1:
        if not any(data.get(k) for k in _HF_EXPERT_KEYS) and data.get("num_experts_per_tok"):
            raise SpecError(f"{where}: num_experts_per_tok {data['num_experts_per_tok']} without an expert count; add "
                            f"{' or '.join(_HF_EXPERT_KEYS)} (> 1), or drop num_experts_per_tok for a dense model")
        return out
    top_k = data.get("num_experts_per_tok", data.get("experts_per_token"))
    if top_k is None:
        raise SpecError(f"{where}: a mixture-of-experts config ({experts} experts) needs num_experts_per_tok; "
                        "add it")
    if (whole := _whole_or_none(top_k)) is None or not 1 <= whole <= experts:  # 2.0 reads as 2, as elsewhere
        name = "num_experts_per_tok" if "num_experts_per_tok" in data else "experts_per_token"
        raise SpecError(f"{where}: {name} {shown(top_k)} must be a whole number of experts per token, 1 to "
                        f"{key} {experts}; fix it")
    # Mixtral, GPT-OSS and Llama 4 give the expert width as intermediate_size; Qwen-MoE and DeepSeek as
    # moe_intermediate_size (their intermediate_size is the dense MLP's)
    if not data.get("moe_intermediate_size") and (model_type in _MOE_WIDTH_APART or data.get("n_routed_experts")):
        raise SpecError(f"{where}: a {model_type} config needs moe_intermediate_size > 0 (an expert's width; its "
                        f"intermediate_size is the dense MLP's), got {shown(data.get('moe_intermediate_size'))}")
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
    groups = None if data.get("n_group") is None else _whole(data["n_group"], "n_group", where, "a whole number >= 1")
    if groups is not None and groups > 1:  # DeepSeek's group-limited routing (8.0 reads as 8, as transformers does)
        if data.get("topk_group") is None:
            raise SpecError(f"{where}: n_group {groups} needs topk_group (the groups a token's experts come from); "
                            "add it")
        out.update(moe_router_groups=groups,
                   moe_router_group_topk=_whole(data["topk_group"], "topk_group", where, "a whole number >= 1"))
    if data.get("routed_scaling_factor") not in (None, 1, 1.0):
        out["moe_router_scaling"] = data["routed_scaling_factor"]
    said = next((k for k in ("interleave_moe_layer_step", "decoder_sparse_step", "moe_layer_freq")
                 if data.get(k) is not None), None)
    step = None if said is None else data[said]
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 1):
        raise SpecError(f"{where}: an MoE layer step of {shown(step)} (interleave_moe_layer_step, decoder_sparse_step "
                        "or moe_layer_freq) must be a whole number >= 1 (1: every layer MoE)")
    layers, first = data.get("num_hidden_layers"), out.get("first_dense_layers", 0)
    if step is not None and isinstance(layers, int) and step > layers - first:
        raise SpecError(f"{where}: {said} {step} (every {step}-th layer MoE) leaves no MoE layer of {layers}; lower "
                        "it, or drop the expert keys for a dense model")
    if step is not None and step > 1:
        out["moe_layer_freq"] = step
    _check_moe_layers(data.get("moe_layers"), step or 1, layers, where)
    dense = data.get("mlp_only_layers")
    if dense is not None and not (isinstance(dense, list) and all(isinstance(i, int) for i in dense)):
        raise SpecError(f"{where}: mlp_only_layers must be a list of layer numbers such as [0, 1], got {shown(dense)}")
    if dense and sorted(dense) == list(range(len(dense))):  # the first k: dense-first
        out["first_dense_layers"] = len(dense)
    elif dense:
        raise SpecError(f"{where}: mlp_only_layers {dense} (dense layers among the MoE ones) is not modelled; only "
                        "dense layers before the first MoE layer are (mlp_only_layers [0, 1, ..., k-1])")
    if data.get("scoring_func") == "sigmoid" or model_type.startswith("llama4"):  # Llama 4: sigmoid of the top-1
        out["router"] = "sigmoid"
    if data.get("topk_method") == "noaux_tc":  # DeepSeek-V3's auxiliary-loss-free balancing bias
        out["router_bias"] = True
    if model_type == "gpt_oss":
        out["expert_bias"] = True
    return out


def _check_moe_layers(given: Any, step: int, layers: Any, where: str) -> None:
    """Llama 4's moe_layers (which layers are MoE; transformers' default: every step-th, from step - 1): autotune
    models that pattern only, so a list that differs, or names no layer, is an error naming it."""
    if given is None or not isinstance(layers, int):
        return
    pattern = list(range(step - 1, layers, step))
    if given == pattern:
        return
    if given == []:
        raise SpecError(f"{where}: moe_layers [] leaves no MoE layer; drop the expert keys for a dense model")
    raise SpecError(f"{where}: moe_layers {shown(given)} is not modelled; only every interleave_moe_layer_step-th "
                    f"layer is ({step}: {pattern[:4]}...): drop moe_layers to plan that pattern")


#: Gemma 3's default local:global pattern (transformers Gemma3TextConfig.sliding_window_pattern): 5 windowed
#: layers, then one full.
_GEMMA3_PATTERN = 6


def _hf_window_and_clamp(data: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """sliding_window, sliding_window_layers, glu_clamp and the logit soft caps from a config.json, where given.
    The windowed layers are counted from `layer_types` ("sliding_attention" entries: GPT-OSS, recent Gemma/Qwen
    configs); without it, from Gemma 3's sliding_window_pattern (every p-th layer full), Gemma 2's alternation
    (even layers windowed), Qwen2's max_window_layers (layers from it on windowed), else every layer (Mistral, Phi-3).
    use_sliding_window false (Qwen2/3) or a null window means none. A window no shorter than the training
    sequence changes no cost (costmodel/ops.py), so Mistral 7B's 4096 is carried but inert at seq <= 4096."""
    out: dict[str, Any] = {}
    for hf, key in (("swiglu_limit", "glu_clamp"), ("attn_logit_softcapping", "attn_logit_softcap"),
                    ("final_logit_softcapping", "final_logit_softcap")):
        value = data.get(hf)  # Gemma 2: 50.0 and 30.0; Gemma 3: null (none); GPT-OSS's clamp 7.0
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SpecError(f"{where}: {hf} {shown(value)} must be a number (or null for none)")
        if value is not None:
            out[key] = value  # model_from_dict checks its range
    use = data.get("use_sliding_window", True)
    if not isinstance(use, bool):
        raise SpecError(f"{where}: use_sliding_window must be true or false, got {shown(use)}"[:200])
    window, layers = data.get("sliding_window"), _whole_or_none(data.get("num_hidden_layers"))
    if data.get("attention_chunk_size") is not None and layers is not None:  # Llama 4
        return {**out, **_chunks(data, layers, where)}
    if window is not None and use:
        window = _whole(window, "sliding_window", where, "a whole number of tokens >= 1, or null for none")
    if not use or not window or layers is None:
        return out
    types = data.get("layer_types")
    if types is not None and not isinstance(types, list):
        raise SpecError(f"{where}: layer_types must list one of {' or '.join(_LAYER_TYPES)} per layer, got "
                        f"{ascii(types)[:60]}")
    if types is not None and len(types) != layers:
        raise SpecError(f"{where}: layer_types has {len(types)} entries for num_hidden_layers {layers}; give one per "
                        "layer")
    if types is not None and (bad := [t for t in types if t not in _LAYER_TYPES]):
        raise SpecError(f"{where}: layer_types entry {ascii(bad[0])[:60]} is not one autotune models; use "
                        f"{' or '.join(_LAYER_TYPES)}")
    pattern, first_full = data.get("sliding_window_pattern"), data.get("max_window_layers")
    if types is not None:
        count = sum(1 for t in types if t == "sliding_attention")
    elif pattern is not None:
        count = layers - layers // _whole(pattern, "sliding_window_pattern", where, "a whole number >= 1")
    elif model_type == "gemma3_text" or model_type == "gemma3":
        count = layers - layers // _GEMMA3_PATTERN
    elif model_type == "gemma2":
        count = (layers + 1) // 2
    elif first_full is not None and "use_sliding_window" in data:
        count = max(0, layers - _whole(first_full, "max_window_layers", where, "a whole number >= 0", 0))
    else:
        count = layers
    if count:
        out.update(sliding_window=window, sliding_window_layers=count)
    return out


def _chunks(data: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Llama 4's chunked attention: attention_chunk_size on the RoPE layers, the no_rope_layers entries that are 1
    (transformers' Llama4TextConfig; by default every layer but each no_rope_layer_interval-th, 4)."""
    chunk = _whole(data["attention_chunk_size"], "attention_chunk_size", where, "a whole number of tokens >= 1")
    flags = data.get("no_rope_layers")
    if isinstance(flags, list) and len(flags) == layers and all(f in (0, 1) for f in flags):
        count = sum(flags)
    elif flags:
        raise SpecError(f"{where}: no_rope_layers must give 1 (RoPE, chunked) or 0 (global) for each of the "
                        f"{layers} layers, got {shown(flags)[:60]}")
    else:
        interval = _whole(data.get("no_rope_layer_interval", 4), "no_rope_layer_interval", where,
                          "a whole number >= 1")
        count = layers - layers // interval
    return {"sliding_window": chunk, "sliding_window_layers": count, "chunked_attention": True} if count else {}


#: What a layer_types entry may say (transformers' own names)
_LAYER_TYPES = ("sliding_attention", "full_attention")


def _whole_or_none(value: Any) -> int | None:
    """A whole JSON number (62 or 62.0) as an int, else None (model_from_dict names a bad count)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        return None
    return int(value) if value == int(value) else None


def _whole(value: Any, key: str, where: str, wanted: str, minimum: int = 1) -> int:
    """A config.json count that must be a whole number >= minimum, or a one-line error naming it."""
    whole = _whole_or_none(value)
    if whole is None or whole < minimum:
        raise SpecError(f"{where}: {key} {shown(value)[:60]} must be {wanted}")
    return whole


#: The largest RoPE scaling factor a config.json may give (YaRN's published ones are 4-64)
MAX_ROPE_SCALING_FACTOR = 1024.0


def _hf_training_keys(data: dict[str, Any], where: str) -> dict[str, Any]:
    """RoPE base and scaling, norm epsilon and init std of a Llama-style config.json, where given (Llama 3.1's
    rope_scaling is {"rope_type": "llama3", "factor": 8.0, ...}, DeepSeek-V3's {"type": "yarn", "factor": 40,
    ...}, Gemma 3's {"rope_type": "linear", "factor": 8.0}; YaRN's other settings are not carried). A value that is there but unusable is a one-line error naming
    the key, not a silent default: the emitters write these values into the launch configs."""
    out: dict[str, Any] = {}
    for key, ours in (("rope_theta", "rope_theta"), ("rms_norm_eps", "norm_eps"), ("layer_norm_eps", "norm_eps"),
                      ("initializer_range", "init_std")):
        value = data.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise SpecError(f"{where}: {key} must be a number > 0, got {shown(value)}")
        out[ours] = float(value)
    scaling = data.get("rope_scaling")
    if scaling is None:
        return out
    if not isinstance(scaling, dict):
        raise SpecError(f"{where}: rope_scaling must be an object such as {{\"rope_type\": \"llama3\", \"factor\": "
                        f"8.0}}, got {shown(scaling)}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return out
    if kind not in ("llama3", "yarn", "linear"):
        raise SpecError(f"{where}: rope_scaling type {kind!r} is not one autotune knows (llama3, yarn, linear); "
                        "drop rope_scaling to plan the model without it")
    factor = scaling.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= MAX_ROPE_SCALING_FACTOR:
        raise SpecError(f"{where}: rope_scaling factor must be a number > 0 and <= {MAX_ROPE_SCALING_FACTOR:g}, got "
                        f"{shown(factor)}")
    out.update(rope_scaling=kind, rope_scaling_factor=float(factor))
    return out


#: autotune's ModelSpec fields -> the config.json keys they are read from, for error messages.
_HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads", "ffn_hidden_size": "intermediate_size",
            "moe_top_k": "num_experts_per_tok", "moe_ffn_hidden_size": "moe_intermediate_size",
            "first_dense_layers": "first_k_dense_replace", "mtp_layers": "num_nextn_predict_layers"}


def _hf_names(message: str) -> str:
    return re.sub(r"\b(" + "|".join(_HF_KEYS) + r")\b", lambda m: _HF_KEYS[m.group(1)], message)
