"""Model specs: the strict autotune format, the lenient Hugging Face reader, the catalog."""

from __future__ import annotations

import json
import re

import pytest

from autotune.catalog import load_hardware, load_model, model_names
from autotune.errors import SpecError
from autotune.specs.model import model_from_dict, model_from_hf_config

BASE = {"name": "m", "num_layers": 2, "hidden_size": 256, "num_heads": 4, "ffn_hidden_size": 1024,
        "vocab_size": 1000, "activation": "gelu", "norm": "layernorm", "tied_embeddings": True}


def test_minimal_model_gets_documented_defaults():
    m = model_from_dict(dict(BASE), "m.json")
    assert (m.num_kv_heads, m.head_dim, m.bias, m.dropout, m.causal, m.position_embedding) == (
        4, 64, "none", False, True, "rope")
    assert m.q_width == m.kv_width == 256 and not m.gated


def test_block_and_position_keys_of_a_model_file():
    """A Pythia-style block (RoPE on a quarter of each head, attention beside the MLP) and ALiBi; the defaults are
    Llama's (whole-head RoPE, attention then MLP)."""
    neox = model_from_dict({**BASE, "rotary_fraction": 0.25, "parallel_block": True}, "m.json")
    alibi = model_from_dict({**BASE, "position_embedding": "alibi"}, "m.json")
    plain = model_from_dict(dict(BASE), "m.json")
    assert (neox.rotary_fraction, neox.parallel_block, plain.rotary_fraction, plain.parallel_block) == (
        0.25, True, 1.0, False)
    assert (alibi.position_embedding, alibi.max_position_embeddings) == ("alibi", 0)


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
    ({"rotary_fraction": 1.5}, r"rotary_fraction must be in \(0, 1\], got 1\.5"),
    ({"rotary_fraction": 0}, "rotary_fraction must be a number > 0"),
    ({"rotary_fraction": 0.5, "position_embedding": "alibi"}, "rotary_fraction 0.5 needs position_embedding 'rope'"),
    ({"parallel_block": 1}, "parallel_block must be true or false"),
    ({"position_embedding": "nope"}, "position_embedding must be one of rope, learned, alibi"),
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


@pytest.mark.parametrize(("changes", "message"), [
    ({"rope_theta": -5}, "rope_theta must be a number > 0, got -5"),
    ({"rope_theta": "abc"}, 'rope_theta must be a number > 0, got "abc"'),
    ({"rms_norm_eps": 0}, "rms_norm_eps must be a number > 0, got 0"),
    ({"initializer_range": -0.01}, "initializer_range must be a number > 0"),
    ({"rope_scaling": "llama3"}, "rope_scaling must be an object"),
    ({"rope_scaling": {"type": "dynamic", "factor": 4}}, "rope_scaling type 'dynamic' is not one autotune knows"),
    ({"rope_scaling": {"rope_type": "llama3"}}, "rope_scaling factor must be a number > 0 and <= 1024, got null"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": -8}}, "rope_scaling factor must be"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 1e9}}, "rope_scaling factor must be"),
    ({"num_key_value_heads": 0}, "num_key_value_heads must be > 0, got 0"),
    # the attention window's keys (user-tester): each wrong value named, not defaulted or dropped
    ({"head_dim": 0}, "head_dim must be > 0, got 0"),
    ({"sliding_window": 10**30}, "sliding_window 1000000000000000000000000000000 exceeds the maximum of 2,147,483,648"),
    ({"sliding_window": 64, "use_sliding_window": "no"}, 'use_sliding_window must be true or false, got "no"'),
    ({"sliding_window": 64, "sliding_window_pattern": 0}, "sliding_window_pattern 0 must be a whole number >= 1"),
    ({"sliding_window": 64, "sliding_window_pattern": "6"}, 'sliding_window_pattern "6" must be a whole number'),
    ({"sliding_window": 64, "layer_types": "sliding"}, "layer_types must list one of sliding_attention or "
                                                       "full_attention per layer, got 'sliding'"),
    ({"sliding_window": 64, "layer_types": ["foo"] * 32}, "layer_types entry 'foo' is not one autotune models"),
    ({"sliding_window": 64, "layer_types": [1] * 32}, "layer_types entry 1 is not one autotune models"),
])
def test_hf_config_values_that_cannot_be_used_are_named(changes, message):
    """A value a config.json gives but autotune cannot carry into the launch configs is a one-line error naming the
    key, never a silent default (the emitters write these values out)."""
    with pytest.raises(SpecError, match=re.escape(message)):
        model_from_hf_config({**LLAMA3_8B_CONFIG, **changes}, "config.json")


def test_whole_json_numbers_count_as_counts_and_a_null_head_dim_is_transformers_default():
    """62.0 layers are 62 (as autotune's own files take 4.0), so the window still applies; head_dim null is
    hidden / heads, as transformers takes it."""
    m = model_from_hf_config({**LLAMA3_8B_CONFIG, "num_hidden_layers": 32.0, "sliding_window": 1024.0,
                              "head_dim": None}, "config.json")
    assert (m.num_layers, m.sliding_window, m.sliding_window_layers, m.head_dim) == (32, 1024, 32, 128)


def test_hf_config_null_and_default_rope_scaling_are_none():
    for scaling in (None, {"rope_type": "default"}):
        assert model_from_hf_config({**LLAMA3_8B_CONFIG, "rope_scaling": scaling}, "c.json").rope_scaling == "none"
    yarn = model_from_hf_config({**LLAMA3_8B_CONFIG, "rope_scaling": {"type": "yarn", "factor": 40}}, "c.json")
    assert (yarn.rope_scaling, yarn.rope_scaling_factor) == ("yarn", 40.0)


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


def test_an_empty_model_file_says_it_is_empty(tmp_path):
    """json's 'Expecting value: line 1 column 1' did not say the file was empty (user-tester)."""
    (tmp_path / "config.json").write_text(" \n")
    with pytest.raises(SpecError, match=r"config.json: empty \(no JSON in it\); give the file its content"):
        load_model(str(tmp_path / "config.json"))


def test_a_checkpoint_folder_is_read_through_its_config_json(tmp_path):
    """--model DIR, as transformers' from_pretrained takes a checkpoint folder (user-tester: 'not a catalog model
    or a file' and the whole catalog); a folder without config.json, and --gpu DIR, say what to give."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    assert load_model(str(tmp_path / "ckpt")) == load_model(str(tmp_path / "ckpt" / "config.json"))
    with pytest.raises(SpecError, match=r"is a directory without a config.json; give the model file's path$"):
        load_model(str(tmp_path))
    with pytest.raises(SpecError, match=r"--gpu '.*' is a directory; give a catalog GPU name or a hardware file"):
        load_hardware(str(tmp_path))


def test_every_catalog_model_loads():
    names = model_names()
    assert {"gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b"} <= set(names)
    for name in names:
        assert load_model(name).num_layers > 0


# ----------------------------------------------------------------------------- sliding window, gated clamp
_HF_SMALL = {"num_hidden_layers": 6, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 512,
             "vocab_size": 1000, "hidden_act": "silu"}


def test_gpt_oss_config_gives_the_window_layers_and_clamp_of_the_catalog():
    """GPT-OSS-120B's config.json: sliding_window 128, layer_types alternating from sliding, swiglu_limit 7."""
    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 128,
           "num_experts_per_tok": 4, "vocab_size": 201088, "hidden_act": "silu", "attention_bias": True,
           "tie_word_embeddings": False, "sliding_window": 128, "swiglu_limit": 7.0,
           "layer_types": ["sliding_attention", "full_attention"] * 18}
    parsed, ours = model_from_hf_config(cfg, "config.json"), load_model("gpt-oss-120b")
    assert (parsed.sliding_window, parsed.sliding_window_layers, parsed.glu_clamp) == (128, 18, 7.0)
    assert (ours.sliding_window, ours.sliding_window_layers, ours.glu_clamp) == (128, 18, 7.0)
    assert ours.sliding_share == 0.5


@pytest.mark.parametrize(("extra", "want"), [
    ({"model_type": "mistral", "sliding_window": 4096}, (4096, 6)),  # every layer
    ({"model_type": "mistral", "sliding_window": None}, (0, 0)),
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 2}, (0, 0)),
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 2}, (4096, 4)),
    ({"model_type": "gemma2", "sliding_window": 4096, "hidden_act": "gelu_pytorch_tanh"}, (4096, 3)),
    ({"model_type": "gemma3_text", "sliding_window": 512, "sliding_window_pattern": 3,
      "hidden_act": "gelu_pytorch_tanh"}, (512, 4)),  # layers 2 and 5 full
    ({"model_type": "gemma3_text", "sliding_window": 512, "hidden_act": "gelu_pytorch_tanh"}, (512, 5)),  # 1 in 6
    ({"model_type": "qwen3", "sliding_window": None, "layer_types": ["full_attention"] * 6}, (0, 0)),
    ({"model_type": "llama"}, (0, 0)),
])
def test_hf_window_layers_follow_each_familys_rule(extra, want):
    m = model_from_hf_config({**_HF_SMALL, **extra}, "config.json")
    assert (m.sliding_window, m.sliding_window_layers) == want
    assert m.glu_clamp == 0.0


@pytest.mark.parametrize(("change", "message"), [
    ({"glu_clamp": -1.0}, "glu_clamp must be a number >= 0"),
    ({"glu_clamp": "7"}, "glu_clamp must be a number >= 0"),
    ({"glu_clamp": 7.0, "activation": "gelu"}, "glu_clamp 7 needs a gated activation"),
    ({"sliding_window": -4}, "sliding_window must be a whole number >= 0"),
    ({"sliding_window": 128, "sliding_window_layers": 3}, "sliding_window_layers 3 exceeds num_layers 2"),
    ({"sliding_window_layers": 1}, "sliding_window_layers 1 needs sliding_window > 0"),
    ({"sliding_window": 128, "causal": False}, "sliding_window needs causal attention"),
])
def test_bad_window_and_clamp_values_name_the_field(change, message):
    with pytest.raises(SpecError, match=message) as err:
        model_from_dict({**BASE, "activation": "swiglu", **change}, "m.json")
    assert "\n" not in str(err.value)


def test_logit_soft_caps_are_read_from_config_json_and_model_files():
    """Gemma 2's attn_logit_softcapping 50 and final_logit_softcapping 30 are carried (emitters warn that their
    configs cannot set them); Gemma 3's null means none; a negative cap is a one-line error."""
    m = model_from_hf_config({**_HF_SMALL, "model_type": "gemma2", "hidden_act": "gelu_pytorch_tanh",
                              "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}, "config.json")
    assert (m.attn_logit_softcap, m.final_logit_softcap) == (50.0, 30.0)
    m = model_from_hf_config({**_HF_SMALL, "model_type": "gemma3_text", "attn_logit_softcapping": None,
                              "final_logit_softcapping": None}, "config.json")
    assert (m.attn_logit_softcap, m.final_logit_softcap) == (0.0, 0.0)
    gemma = load_model("gemma2-9b")
    assert (gemma.attn_logit_softcap, gemma.final_logit_softcap) == (50.0, 30.0)
    assert load_model("llama3-8b").attn_logit_softcap == 0.0
    with pytest.raises(SpecError, match="final_logit_softcap must be a number >= 0") as err:
        model_from_dict({**BASE, "final_logit_softcap": -30}, "m.json")
    assert "\n" not in str(err.value)


def test_window_without_layers_applies_to_every_layer_and_clamp_defaults_off():
    m = model_from_dict({**BASE, "sliding_window": 64}, "m.json")
    assert (m.sliding_window, m.sliding_window_layers, m.sliding_share, m.glu_clamp) == (64, 2, 1.0, 0.0)
    assert model_from_dict(dict(BASE), "m.json").sliding_share == 0.0


def test_the_clamp_is_the_field_not_the_expert_biases():
    """costmodel/moe.py clamps_glu reads glu_clamp: expert biases alone no longer imply the clamp."""
    from dataclasses import replace

    from autotune.costmodel.moe import clamps_glu

    oss = load_model("gpt-oss-120b")
    assert clamps_glu(oss)
    assert not clamps_glu(replace(oss, glu_clamp=0.0))
    assert clamps_glu(replace(oss, expert_bias=False))


@pytest.mark.parametrize("key,value", [("tie_word_embeddings", "false"), ("tie_word_embeddings", 0),
                                       ("attention_bias", "no")])
def test_hf_switches_must_be_json_booleans(key, value):
    """A string "false" was read as true (Python truth): a wrong-typed switch is an error naming the key."""
    with pytest.raises(SpecError, match=f"config.json: {key} must be true or false, got {value!r}"):
        model_from_hf_config({**LLAMA3_8B_CONFIG, key: value}, "config.json")
    assert not model_from_hf_config({**LLAMA3_8B_CONFIG, "tie_word_embeddings": False}, "x").tied_embeddings
    assert model_from_hf_config({**LLAMA3_8B_CONFIG, "tie_word_embeddings": None}, "x").tied_embeddings is False


_MOE_SMALL = {**_HF_SMALL, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
              "moe_intermediate_size": 64}


@pytest.mark.parametrize(("extra", "message"), [
    ({"model_type": "gpt_oss", "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]},
     "layer_types has 2 entries for num_hidden_layers 6; give one per layer"),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window 0 must be a whole number of tokens >= 1"),
    ({**_MOE_SMALL, "decoder_sparse_step": 0}, "an MoE layer step of 0"),
    ({"q_lora_rank": 1536, "kv_lora_rank": None}, "q_lora_rank 1536 without kv_lora_rank"),
    # one message for every top-k that is no count of the experts (said ">= 0" for "two", "> 0" for 0)
    ({**_MOE_SMALL, "num_experts_per_tok": "two"}, 'num_experts_per_tok "two" must be a whole number of experts per '
                                                   "token, 1 to num_experts 8; fix it"),
    ({**_MOE_SMALL, "num_experts_per_tok": 0}, "num_experts_per_tok 0 must be a whole number of experts per token"),
    ({**_MOE_SMALL, "num_experts_per_tok": 9}, "num_experts_per_tok 9 must be a whole number of experts per token"),
    ({**_MOE_SMALL, "num_experts_per_tok": 2.5}, "num_experts_per_tok 2.5 must be a whole number"),
])
def test_hf_config_inconsistencies_are_named(extra, message):
    """What a user-tester's broken config.json files slipped through (2026-11-25): a layer_types list that does not
    cover every layer, a zero window, a zero MoE step (Hugging Face divides by it), latent attention's query rank
    without its key-value rank (which silently dropped MLA)."""
    with pytest.raises(SpecError, match=re.escape(message)):
        model_from_hf_config({**_HF_SMALL, **extra}, "config.json")


#: google/gemma-3-27b-pt's config.json on the Hugging Face hub, its language-model part: the multimodal wrapper
#: (model_type gemma3) gives only the text_config keys that differ from transformers' Gemma3TextConfig defaults
GEMMA3_27B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "initializer_range": 0.02, "mm_tokens_per_image": 256,
              "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                              "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
                              "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
                              "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
              "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27}}


def test_gemma3_multimodal_config_takes_transformers_text_defaults_and_is_the_catalog_model():
    """What the text_config leaves out is transformers 4.50.0's Gemma3TextConfig default (vocab 262208,
    gelu_pytorch_tanh, tied, rope_theta 1e6, every 6th layer global), as transformers itself reads the file; the
    result is the catalog's gemma3-27b field for field, whose parameters match the Gemma 3 report's Table 1
    (tests/costmodel/test_memory.py)."""
    from dataclasses import fields

    m = model_from_hf_config(GEMMA3_27B, "config.json")
    assert (m.vocab_size, m.activation, m.tied_embeddings, m.rope_theta, m.norm_eps) == (
        262208, "geglu", True, 1e6, 1e-6)
    assert (m.sliding_window, m.sliding_window_layers, m.qk_norm) == (1024, 62 - 62 // 6, True)
    assert (m.rope_scaling, m.rope_scaling_factor) == ("linear", 8.0)
    catalog = load_model("gemma3-27b")
    assert [f.name for f in fields(m) if getattr(m, f.name) != getattr(catalog, f.name)] == ["name", "source"]
    # a key the text_config gives wins over the default; a flat gemma3_text config takes them too, as transformers
    # reads it, and a config of no known type does not
    small = model_from_hf_config({"text_config": {**GEMMA3_27B["text_config"], "vocab_size": 1000}}, "c.json")
    assert small.vocab_size == 1000
    assert model_from_hf_config(dict(GEMMA3_27B["text_config"]), "c.json").vocab_size == 262208
    with pytest.raises(SpecError, match="missing vocab_size"):
        model_from_hf_config({k: v for k, v in GEMMA3_27B["text_config"].items() if k != "model_type"}, "c.json")


def test_gemma_gelu_is_gated_in_every_gemma_family_type():
    """Gemma's MLP is gated whatever its hidden_act spelling (transformers' GemmaMLP, Gemma2MLP, Gemma3MLP):
    a flat gemma3_text config saying "gelu" is GeGLU, as its multimodal wrapper's text_config is."""
    for kind in ("gemma", "gemma2", "gemma3", "gemma3_text"):
        m = model_from_hf_config({**_HF_SMALL, "model_type": kind, "hidden_act": "gelu"}, "config.json")
        assert m.activation == "geglu", kind


def test_gemma3_4b_text_config_leaves_its_default_heads_out():
    """google/gemma-3-4b-pt's text_config has no heads, kv heads or head_dim: they equal Gemma3TextConfig's
    defaults (8, 4, 256), which transformers drops when it saves a nested config. Parameters: Gemma 3 report,
    Table 1, 675M embedding + 3,209M non-embedding. A text_config without model_type is the wrapper's kind."""
    from autotune.costmodel.memory import total_params

    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}
    m = model_from_hf_config({"model_type": "gemma3", "text_config": text}, "config.json")
    assert (m.num_heads, m.num_kv_heads, m.head_dim, m.activation, m.qk_norm) == (8, 4, 256, "geglu", True)
    assert total_params(m) == pytest.approx(3.884e9, rel=0.01)
    untyped = {k: v for k, v in text.items() if k != "model_type"}
    assert model_from_hf_config({"model_type": "gemma3", "text_config": untyped}, "config.json") == m
    for bad in ("gemma", [], None, {}):
        with pytest.raises(SpecError, match="text_config must be an object") as err:
            model_from_hf_config({"model_type": "gemma3", "text_config": bad}, "config.json")
        assert "\n" not in str(err.value)


def test_an_unknown_rope_scaling_type_is_one_line_naming_the_ones_known():
    bad = {**GEMMA3_27B, "text_config": {**GEMMA3_27B["text_config"], "rope_scaling": {"rope_type": "dynamic",
                                                                                       "factor": 2.0}}}
    with pytest.raises(SpecError, match=r"rope_scaling type 'dynamic' is not one autotune knows \(llama3, yarn, "
                                        r"linear\)") as err:
        model_from_hf_config(bad, "c.json")
    assert "\n" not in str(err.value)
