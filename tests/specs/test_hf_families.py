"""specs/hf_families.py: config.json families that leave their MLP, norm, biases or key/value heads implicit, and
GPT-2-style keys. Parameter counts are pinned to the published totals (user-tester: StarCoder2-15B read as a gated
RMSNorm model without biases, 21.7B; Falcon's multi-query heads ignored; GPT-J refused as learned positions)."""

from __future__ import annotations

import pytest

from autotune.costmodel.memory import total_params
from autotune.errors import SpecError
from autotune.specs.hf_config import model_from_hf_config

#: bigcode/starcoder2-15b's config.json (the shape keys; published total 15.96B on its model card)
STARCODER2_15B = {"model_type": "starcoder2", "hidden_act": "gelu_pytorch_tanh", "hidden_size": 6144,
                  "intermediate_size": 24576, "num_attention_heads": 48, "num_key_value_heads": 4,
                  "num_hidden_layers": 40, "vocab_size": 49152, "norm_type": "layer_norm", "use_bias": True,
                  "sliding_window": 4096, "rope_theta": 100000, "tie_word_embeddings": False}
#: EleutherAI/gpt-j-6b config.json (GPT-2-style keys, rotary; 6,053,381,344 parameters in its README)
GPT_J_6B = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "n_positions": 2048, "rotary": True,
            "rotary_dim": 64, "vocab_size": 50400, "tie_word_embeddings": False}
#: EleutherAI/gpt-neox-20b's config.json (20,554,567,680 parameters, the GPT-NeoX-20B paper's Table 1 rounds 20.55B)
GPT_NEOX_20B = {"model_type": "gpt_neox", "hidden_act": "gelu", "hidden_size": 6144, "intermediate_size": 24576,
                "num_attention_heads": 64, "num_hidden_layers": 44, "vocab_size": 50432, "tie_word_embeddings": False,
                "use_parallel_residual": True, "rotary_pct": 0.25}


#: bigscience/bloom's config.json (n_layer, hidden_size, n_head; 176,247,271,424 parameters on its model card)
BLOOM_176B = {"model_type": "bloom", "n_layer": 70, "hidden_size": 14336, "n_head": 112, "vocab_size": 250880}
#: facebook/opt-6.7b's config.json (ffn_dim, relu; 6,658,473,984 parameters)
OPT_6_7B = {"model_type": "opt", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
            "ffn_dim": 16384, "vocab_size": 50272, "max_position_embeddings": 2048, "activation_function": "relu"}
#: bigcode/starcoder's config.json (GPT-2-style keys, multi-query; 15.5B on its model card)
STARCODER_15B = {"model_type": "gpt_bigcode", "n_layer": 40, "n_embd": 6144, "n_head": 48, "n_inner": 24576,
                 "n_positions": 8192, "vocab_size": 49152, "multi_query": True}


@pytest.mark.parametrize(("config", "published", "rel"), [
    (STARCODER2_15B, 15_957_889_024, 1e-4), (GPT_NEOX_20B, 20_554_567_680, 0), (OPT_6_7B, 6_658_473_984, 0),
    (BLOOM_176B, 176_247_271_424, 1e-5), (STARCODER_15B, 15.5e9, 0.005),
    # GPT-J's attention has no biases, only its MLP (costed with every linear's, 4h a layer more) and one norm a
    # block; its README's 6,053,381,344 is 2.5M above the modules' weights summed by hand (6,050,882,784)
    (GPT_J_6B, 6_053_381_344, 5e-4)], ids=["starcoder2", "neox", "opt", "bloom", "starcoder", "gptj"])
def test_plain_gelu_layernorm_families_match_their_published_totals(config, published, rel):
    """Exact where the count is published to the parameter: StarCoder2 and BLOOM differ by the norms' biases of
    parallel blocks and the embedding norm, below 1e-4."""
    m = model_from_hf_config(config, "config.json")
    assert (m.activation, m.norm, m.bias) == ("gelu", "layernorm", "all")
    assert total_params(m) == pytest.approx(published, rel=rel)
    assert m.position_embedding == {"opt": "learned", "gpt_bigcode": "learned", "bloom": "alibi"}.get(
        config["model_type"], "rope")
    assert m.num_kv_heads == (1 if config.get("multi_query") else m.num_heads if "num_key_value_heads" not in config
                              else config["num_key_value_heads"])


def test_falcon_reads_its_key_value_heads_and_implicit_mlp():
    """tiiuae/falcon-7b: multi_query (one key/value head), no intermediate_size (FalconMLP is 4h), no hidden_act
    (GeLU), bias false; falcon-40b: new_decoder_architecture with num_kv_heads 8."""
    seven = model_from_hf_config({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
                                  "num_hidden_layers": 32, "vocab_size": 65024, "multi_query": True,
                                  "parallel_attn": True, "bias": False}, "config.json")
    assert (seven.num_kv_heads, seven.ffn_hidden_size, seven.activation, seven.norm, seven.bias) == (
        1, 4 * 4544, "gelu", "layernorm", "none")
    forty = model_from_hf_config({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128,
                                  "num_hidden_layers": 60, "vocab_size": 65024, "num_kv_heads": 8,
                                  "new_decoder_architecture": True, "bias": False}, "config.json")
    assert forty.num_kv_heads == 8
    # FalconAttention: num_kv_heads (default: every head) with the new architecture or without multi_query; an
    # explicit ffn_hidden_size is the MLP's width (reviewer)
    for extra, kv in (({"new_decoder_architecture": True}, 128), ({"multi_query": False, "num_kv_heads": 16}, 16)):
        m = model_from_hf_config({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128,
                                  "num_hidden_layers": 2, "vocab_size": 65024, **extra}, "config.json")
        assert m.num_kv_heads == kv
    wide = model_from_hf_config({"model_type": "falcon", "hidden_size": 4096, "num_attention_heads": 32,
                                 "num_hidden_layers": 2, "vocab_size": 65024, "ffn_hidden_size": 12288}, "config.json")
    assert wide.ffn_hidden_size == 12288


def test_gated_families_keep_their_gated_unit():
    """Gemma's gelu_pytorch_tanh is a gated GeLU; Llama's silu a SwiGLU; both RMSNorm without biases."""
    base = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": 1000}
    gemma = model_from_hf_config({**base, "model_type": "gemma", "hidden_act": "gelu_pytorch_tanh"}, "c")
    llama = model_from_hf_config({**base, "model_type": "llama", "hidden_act": "silu"}, "c")
    assert (gemma.activation, llama.activation) == ("geglu", "swiglu")
    assert (gemma.norm, gemma.bias, llama.norm, llama.bias) == ("rmsnorm", "none", "rmsnorm", "none")


def test_nemotron_reads_as_its_two_matrix_squared_relu_mlp_and_layernorm():
    """transformers' NemotronForCausalLM (nvidia/Minitron-8B-Base's shape; user-tester: hidden_act 'relu2' was
    refused): up_proj and down_proj around a squared ReLU, NemotronLayerNorm1P (weight and bias), no linear biases,
    untied embeddings (NemotronConfig's default). By hand: embeddings 2 x 256000 x 4096; a layer's q and o 4096 x
    6144 each, k and v 4096 x 1024 each, MLP 2 x 4096 x 16384, two norms of 2 x 4096; a final norm of 2 x 4096."""
    config = {"model_type": "nemotron", "hidden_act": "relu2", "hidden_size": 4096, "intermediate_size": 16384,
              "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 32,
              "vocab_size": 256000, "partial_rotary_factor": 0.5}
    model = model_from_hf_config(config, "config.json")
    assert (model.activation, model.norm, model.bias, model.tied_embeddings) == ("gelu", "layernorm", "none", False)
    layer = 2 * 4096 * 6144 + 2 * 4096 * 1024 + 2 * 4096 * 16384 + 2 * 2 * 4096
    assert total_params(model) == 2 * 256000 * 4096 + 32 * layer + 2 * 4096 == 8_271_699_968


def test_state_space_hybrids_are_refused():
    """ai21labs/Jamba-v0.1 interleaves Mamba layers with attention: read as a Transformer it was 92.1B, not 51.6B."""
    jamba = {"model_type": "jamba", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 65536,
             "num_experts": 16, "num_experts_per_tok": 2, "attn_layer_period": 8, "mamba_d_state": 16,
             "mamba_expand": 2}
    with pytest.raises(SpecError, match="state-space \\(Mamba\\) layers, which autotune does not model"):
        model_from_hf_config(jamba, "config.json")


def test_a_dense_model_keeps_its_multi_token_prediction():
    """XiaomiMiMo/MiMo-7B-Base has num_nextn_predict_layers 1 on a dense model: read on the MoE path only, it was
    dropped and the file matched llama3-8b's shape."""
    m = model_from_hf_config({"model_type": "llama", "hidden_act": "silu", "hidden_size": 4096,
                              "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                              "num_hidden_layers": 32, "vocab_size": 128256, "tie_word_embeddings": False,
                              "rope_theta": 500000.0, "num_nextn_predict_layers": 1}, "config.json")
    assert m.mtp_layers == 1 and m.catalog_name != "llama3-8b"


def test_wrong_types_of_routing_and_capping_keys_are_errors_not_dropped():
    """n_group 8.0 / topk_group 4.0 dropped DeepSeek-V3's group-limited routing, and a quoted swiglu_limit or
    final_logit_softcapping was ignored, where "num_experts_per_tok": "2" is an error (user-tester): whole floats
    read as transformers reads them, other types are one-line errors naming the key."""
    from autotune.catalog import load_model

    ds = {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
          "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
          "num_hidden_layers": 61, "vocab_size": 129280, "n_routed_experts": 256, "num_experts_per_tok": 8,
          "n_shared_experts": 1, "first_k_dense_replace": 3, "n_group": 8.0, "topk_group": 4.0, "q_lora_rank": 1536,
          "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
    m = model_from_hf_config(ds, "config.json")
    assert (m.moe_router_groups, m.moe_router_group_topk) == (8, 4)
    assert (m.moe_router_groups, m.moe_router_group_topk) == (load_model("deepseek-v3").moe_router_groups,
                                                              load_model("deepseek-v3").moe_router_group_topk)
    for key, value, message in (("swiglu_limit", "7", 'swiglu_limit "7" must be a number'),
                                ("final_logit_softcapping", "30", 'final_logit_softcapping "30" must be a number'),
                                ("n_group", "eight", 'n_group "eight" must be a whole number >= 1')):
        with pytest.raises(SpecError, match=message):
            model_from_hf_config({**ds, key: value}, "config.json")


def test_olmo2_normalizes_its_queries_and_keys():
    """allenai/OLMo-2-1124-7B's config.json: transformers' Olmo2Attention has q_norm and k_norm, so the model
    reads with them and Megatron's script gets --qk-layernorm (user-tester: it was read without)."""
    olmo2 = {"model_type": "olmo2", "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
             "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 100352,
             "tie_word_embeddings": False}
    model = model_from_hf_config(olmo2, "config.json")
    assert model.qk_norm and (model.activation, model.norm) == ("swiglu", "rmsnorm")
    assert not model_from_hf_config({**olmo2, "model_type": "olmo"}, "config.json").qk_norm


#: microsoft/phi-2's config.json (partial_rotary_factor 0.4; PhiDecoderLayer adds attention and MLP together)
PHI_2 = {"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 32,
         "num_hidden_layers": 32, "vocab_size": 51200, "partial_rotary_factor": 0.4, "hidden_act": "gelu_new",
         "tie_word_embeddings": False}
#: stabilityai/stablelm-2-1_6b's config.json (partial_rotary_factor 0.25, use_parallel_residual false)
STABLELM_2 = {"model_type": "stablelm", "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 32,
              "num_key_value_heads": 32, "num_hidden_layers": 24, "vocab_size": 100352, "partial_rotary_factor": 0.25,
              "use_parallel_residual": False, "hidden_act": "silu"}
FALCON_7B = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
             "vocab_size": 65024, "multi_query": True, "parallel_attn": True, "alibi": False, "bias": False}


@pytest.mark.parametrize(("config", "position", "rotary", "parallel"), [
    (GPT_NEOX_20B, "rope", 0.25, True),  # rotary_pct 0.25, use_parallel_residual true
    ({k: v for k, v in GPT_NEOX_20B.items() if k not in ("rotary_pct", "use_parallel_residual")}, "rope", 0.25,
     True),  # GPTNeoXConfig's defaults: rotary_pct 0.25, use_parallel_residual true
    ({**GPT_NEOX_20B, "use_parallel_residual": False, "partial_rotary_factor": 0.5}, "rope", 0.5, False),
    (GPT_J_6B, "rope", 64 / 256, True),  # rotary_dim 64 of a 4096/16 = 256-wide head; GPTJBlock is parallel
    ({**GPT_J_6B, "rotary_dim": None}, "rope", 1.0, True),  # null: GPT-J rotates the whole head
    (PHI_2, "rope", 0.4, True), ({k: v for k, v in PHI_2.items() if k != "partial_rotary_factor"}, "rope", 0.5, True),
    (STABLELM_2, "rope", 0.25, False),
    (FALCON_7B, "rope", 1.0, True), ({**FALCON_7B, "parallel_attn": False}, "rope", 1.0, False),
    ({**FALCON_7B, "alibi": True}, "alibi", 1.0, True),  # tiiuae/falcon-rw-1b style
    ({**FALCON_7B, "parallel_attn": False, "new_decoder_architecture": True, "num_kv_heads": 71}, "rope", 1.0,
     True),  # FalconDecoderLayer: new_decoder_architecture or parallel_attn adds attention to the MLP output
    (BLOOM_176B, "alibi", 1.0, False),
    ({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
      "num_hidden_layers": 2, "vocab_size": 100}, "rope", 1.0, False),
], ids=["neox", "neox-defaults", "neox-sequential", "gptj", "gptj-full", "phi2", "phi-default", "stablelm",
        "falcon", "falcon-sequential", "falcon-alibi", "falcon-new-layout", "bloom", "llama"])
def test_block_arrangement_and_position_encoding_are_read(config, position, rotary, parallel):
    """What the cost model costs as Llama's block but a launch config must say or warn about: RoPE on part of
    each head (transformers' partial_rotary_factor / rotary_pct / rotary_dim, with each config class's default),
    attention beside the MLP, ALiBi instead of RoPE."""
    m = model_from_hf_config(config, "config.json")
    assert (m.position_embedding, m.rotary_fraction, m.parallel_block) == (position, pytest.approx(rotary), parallel)


@pytest.mark.parametrize(("change", "message"), [
    ({"rotary_pct": 1.5}, "rotary_pct 1.5 must be a share of the head in (0, 1]"),
    ({"rotary_pct": 0}, "rotary_pct must be a number > 0, got 0"),
    ({"rotary_pct": "quarter"}, "rotary_pct must be a number > 0"),
    ({"use_parallel_residual": "yes"}, "use_parallel_residual"),
])
def test_bad_block_keys_are_one_line_errors_naming_the_key(change, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")
                       .replace("[", r"\[").replace(".", r"\.")):
        model_from_hf_config({**GPT_NEOX_20B, **change}, "config.json")


def test_a_rotary_dim_wider_than_the_head_is_refused():
    with pytest.raises(SpecError, match="rotary_dim 512 exceeds the head width 256"):
        model_from_hf_config({**GPT_J_6B, "rotary_dim": 512}, "config.json")
