"""Model specs: the strict autotune format, the lenient Hugging Face reader, the catalog."""

from __future__ import annotations

import json

import pytest

from autotune.catalog import load_model, model_names
from autotune.errors import SpecError
from autotune.specs.model import model_from_dict, model_from_hf_config

BASE = {"name": "m", "num_layers": 2, "hidden_size": 256, "num_heads": 4, "ffn_hidden_size": 1024,
        "vocab_size": 1000, "activation": "gelu", "norm": "layernorm", "tied_embeddings": True}


def test_minimal_model_gets_documented_defaults():
    m = model_from_dict(dict(BASE), "m.json")
    assert (m.num_kv_heads, m.head_dim, m.bias, m.dropout, m.causal, m.position_embedding) == (
        4, 64, "none", False, True, "rope")
    assert m.q_width == m.kv_width == 256 and not m.gated


def test_unknown_keys_are_rejected_and_named():
    with pytest.raises(SpecError, match=r"m\.json: unknown key\(s\) hiden_size, rope_base"):
        model_from_dict({**BASE, "hiden_size": 1, "rope_base": 1e4}, "m.json")


def test_missing_keys_are_rejected_and_named():
    data = dict(BASE)
    del data["vocab_size"], data["norm"]
    with pytest.raises(SpecError, match=r"missing key\(s\) norm, vocab_size"):
        model_from_dict(data, "m.json")


@pytest.mark.parametrize(("change", "message"), [
    ({"num_heads": 3}, "not divisible by num_heads 3; give head_dim"),
    ({"num_kv_heads": 3}, "num_heads 4 must be a multiple of num_kv_heads 3"),
    ({"position_embedding": "learned"}, "needs max_position_embeddings"),
    ({"activation": "relu"}, "activation must be one of gelu, swiglu, geglu"),
    ({"num_layers": 0}, "num_layers must be > 0"),
    ({"num_layers": 2.5}, "num_layers must be a whole number"),
    ({"tied_embeddings": "yes"}, "tied_embeddings must be true or false"),
])
def test_bad_values_name_the_field(change, message):
    with pytest.raises(SpecError, match=message):
        model_from_dict({**BASE, **change}, "m.json")


def test_explicit_head_dim_allows_a_non_divisible_width():
    """Gemma-2-9B: h = 3584, 16 heads of 256 (config.json on the Hugging Face hub)."""
    m = model_from_dict({**BASE, "hidden_size": 3584, "num_heads": 16, "head_dim": 256}, "m.json")
    assert m.q_width == 4096


LLAMA3_8B_CONFIG = {  # config.json of meta-llama/Meta-Llama-3-8B, verbatim keys
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
    "use_cache": True, "vocab_size": 128256,
}


def test_hf_config_ignores_extra_keys_and_matches_the_catalog():
    m = model_from_hf_config(dict(LLAMA3_8B_CONFIG), "config.json")
    cat = load_model("llama3-8b")
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_hidden_size",
                  "vocab_size", "activation", "norm", "tied_embeddings", "bias", "dropout", "position_embedding"):
        assert getattr(m, field) == getattr(cat, field), field


def test_hf_config_missing_keys_are_named():
    data = dict(LLAMA3_8B_CONFIG)
    del data["intermediate_size"]
    with pytest.raises(SpecError, match="missing intermediate_size"):
        model_from_hf_config(data, "config.json")


def test_gpt2_style_config():
    """GPT-2 (openai-community/gpt2 config.json): n_layer 12, n_embd 768, n_head 12, n_inner null -> 4h."""
    m = model_from_hf_config({"n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None, "vocab_size": 50257,
                              "n_positions": 1024, "activation_function": "gelu_new", "model_type": "gpt2"}, "gpt2")
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.max_position_embeddings) == (12, 768, 3072, 1024)
    assert m.activation == "gelu" and m.position_embedding == "learned" and m.tied_embeddings


def test_load_model_reads_a_hf_file_and_rejects_unknown_names(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B_CONFIG))
    assert load_model(str(path)).num_kv_heads == 8
    with pytest.raises(SpecError, match="not a catalog model or a file; known models: .*llama3-8b"):
        load_model("no-such-model")


def test_every_catalog_model_loads():
    names = model_names()
    assert {"gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b"} <= set(names)
    for name in names:
        assert load_model(name).num_layers > 0
