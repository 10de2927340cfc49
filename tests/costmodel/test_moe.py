"""Mixture-of-experts models (issue 14): catalog parameter counts against the publishers' figures, Hugging Face
config.json parsing, bad input, Megatron's expert layout rules, the all-to-all by hand, expert FLOPs and
memory sharding by hand, and the active-parameter FLOP count."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest

from autotune.catalog import load_hardware, load_model
from autotune.costmodel import comm
from autotune.costmodel.estimate import CostModel
from autotune.costmodel.flops import forward_matmul_flops_per_token
from autotune.costmodel.layer import dense_layer_cost, layer_cost, layer_shape
from autotune.costmodel.memory import (active_params, attention_params, expert_params, moe_layer_params,
                                       total_params)
from autotune.costmodel.moe import ROUTED_IMBALANCE, deepep_exchange, groups_hit, moe_comm
from autotune.costmodel.ops import backward_ops, layer_forward_ops
from autotune.errors import InvalidPlanError, SpecError
from autotune.specs.job import JobSpec
from autotune.specs.model import model_from_dict, model_from_hf_config
from autotune.specs.plan import Plan, check_plan, plan_from_dict

# (catalog name, published total B, published active B, whether the publisher counts the input embedding in
# the active figure). Mistral and Qwen count it (12.88B and 22.19B match 12.9B and 22B only with it); OpenAI's
# gpt-oss card says its 5.13B excludes it; DeepSeek's report does not say, and 37B matches without it.
PUBLISHED = (
    ("deepseek-v3", 671, 37, False),
    ("qwen3-235b-a22b", 235, 22, True),
    ("qwen3-30b-a3b", 30.5, 3.3, True),
    ("mixtral-8x7b", 46.7, 12.9, True),
    ("mixtral-8x22b", 141, 39, True),
    ("gpt-oss-120b", 116.83, 5.13, False),
    ("gpt-oss-20b", 20.91, 3.61, False),
    ("llama4-maverick", 400, 17, True),
)


def _matches(computed: float, published: float) -> bool:
    """Within 1%, or within what the printed figure can stand for where that is wider: publishers round or
    truncate to two digits (Qwen prints 3.353B as '3.3B'), so 'x' covers [x - half a unit, x + one unit) of its
    last digit."""
    text = repr(published)
    unit = 10.0 ** -(len(text.split(".")[1]) if "." in text else 0)
    return abs(computed / published - 1) < 0.01 or published - unit / 2 <= computed < published + unit


@pytest.mark.parametrize(("name", "total_b", "active_b", "with_embedding"), PUBLISHED)
def test_catalog_parameter_counts_match_the_publishers(name, total_b, active_b, with_embedding) -> None:
    model = load_model(name)
    assert _matches(total_params(model) / 1e9, total_b)
    assert _matches(active_params(model, input_embedding=with_embedding) / 1e9, active_b)


def test_catalog_counts_within_one_percent_where_the_figure_has_three_digits() -> None:
    """The stricter check where the published figure is precise enough for it."""
    for name, total_b, _, _ in PUBLISHED:
        assert abs(total_params(load_model(name)) / 1e9 / total_b - 1) < 0.01, name
    assert abs(active_params(load_model("gpt-oss-120b"), input_embedding=False) / 5.13e9 - 1) < 0.01
    assert abs(active_params(load_model("gpt-oss-20b"), input_embedding=False) / 3.61e9 - 1) < 0.01
    assert abs(active_params(load_model("mixtral-8x7b")) / 12.9e9 - 1) < 0.01


def test_a_tied_head_stays_active_without_the_input_embedding() -> None:
    """Tied, the LM head is the embedding's matrix: leaving the input embedding out (OpenAI's convention) still
    counts the V x h every token's logits pass through, once; untied, it drops exactly the embedding."""
    from dataclasses import replace

    untied = load_model("mixtral-8x7b")
    tied = replace(untied, tied_embeddings=True)
    vh = untied.vocab_size * untied.hidden_size
    assert active_params(tied, input_embedding=False) == active_params(tied) == active_params(untied) - vh
    assert active_params(untied, input_embedding=False) == active_params(untied) - vh


def test_deepseek_layer_by_hand() -> None:
    """DeepSeek-V3's MLA block and MoE layer, summed by hand from config.json."""
    m = load_model("deepseek-v3")
    h, heads = 7168, 128
    mla = (h * 1536 + 1536 + 1536 * heads * 192 + h * (512 + 64) + 512 + 512 * heads * (128 + 128)
           + heads * 128 * h + 2 * h)
    assert attention_params(m) == mla
    assert expert_params(m) == 3 * h * 2048
    assert moe_layer_params(m) == mla + h * 256 + 3 * h * 2048 + 256 * 3 * h * 2048
    assert m.num_moe_layers == 58 and m.num_dense_layers == 3


def test_expert_weights_shard_by_ep_and_etp() -> None:
    m = load_model("mixtral-8x7b")
    base = attention_params(m, 2) + 4096 * 8
    assert moe_layer_params(m, tp=2, ep=4, etp=1) == base + 2 * 3 * 4096 * 14336
    assert moe_layer_params(m, tp=2, ep=4, etp=2) == base + 2 * 3 * 4096 * 14336 // 2


# ----------------------------------------------------------------------------- Hugging Face config.json
HF = {
    "mixtral": {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "hidden_act": "silu",
                "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False},
    "qwen3_moe": {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
                  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                  "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936, "hidden_act": "silu",
                  "tie_word_embeddings": False, "attention_bias": False},
    "deepseek_v3": {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
                    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                    "vocab_size": 129280, "hidden_act": "silu", "scoring_func": "sigmoid",
                    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "n_group": 8, "topk_group": 4,
                    "topk_method": "noaux_tc",
                    "routed_scaling_factor": 2.5},
    "gpt_oss": {"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
                "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 128,
                "num_experts_per_tok": 4, "vocab_size": 201088, "hidden_act": "silu", "attention_bias": True,
                "tie_word_embeddings": False},
}


@pytest.mark.parametrize(("family", "catalog"), [("mixtral", "mixtral-8x7b"), ("qwen3_moe", "qwen3-30b-a3b"),
                                                  ("deepseek_v3", "deepseek-v3"), ("gpt_oss", "gpt-oss-120b")])
def test_hf_configs_parse_to_the_catalog_shape(family, catalog) -> None:
    parsed, ours = model_from_hf_config(HF[family], "config.json"), load_model(catalog)
    assert total_params(parsed) == total_params(ours)
    assert active_params(parsed) == active_params(ours)
    for field in ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "num_shared_experts", "first_dense_layers",
                  "kv_lora_rank", "head_dim", "router", "expert_bias", "mtp_layers", "moe_router_groups",
                  "moe_router_group_topk", "moe_router_scaling", "router_bias"):
        assert getattr(parsed, field) == getattr(ours, field), field


#: The settings the hub's config.json of each model adds to HF's trimmed keys (as the catalog entries record them)
HUB_SETTINGS = {"qwen3_moe": {"rope_theta": 1e6, "rms_norm_eps": 1e-6},
                "deepseek_v3": {"rope_theta": 1e4, "rms_norm_eps": 1e-6,
                                "rope_scaling": {"type": "yarn", "factor": 40}},
                "gpt_oss": {"rope_theta": 1.5e5, "rms_norm_eps": 1e-5, "sliding_window": 128, "swiglu_limit": 7.0,
                            "layer_types": ["sliding_attention", "full_attention"] * 18,
                            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                             "original_max_position_embeddings": 4096, "truncate": False}}}


@pytest.mark.parametrize(("family", "catalog"), [("qwen3_moe", "qwen3-30b-a3b"), ("deepseek_v3", "deepseek-v3"),
                                                  ("gpt_oss", "gpt-oss-120b")])
def test_a_hub_config_of_a_catalog_model_takes_its_name(tmp_path, family, catalog) -> None:
    """torchtitan knows its MoE models by name: the hub's config.json of one is that catalog model (its shape and
    training settings), known as its catalog name while keeping its path as its name (what saved plans and
    profiles record); one layer more and it is a model of its own."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF[family], **HUB_SETTINGS[family]}))
    parsed = load_model(str(path))
    assert (parsed.name, parsed.catalog_name, parsed.known_as) == (str(path), catalog, catalog)
    assert replace(parsed, name=catalog, source="", catalog_name="") == replace(load_model(catalog), source="")
    assert parsed.rope_scaling == ("none" if family == "qwen3_moe" else "yarn")
    deeper = {**HF[family], **HUB_SETTINGS[family], "num_hidden_layers": 40}
    if "layer_types" in deeper:  # one entry per layer
        deeper["layer_types"] = ["sliding_attention", "full_attention"] * 20
    path.write_text(json.dumps(deeper))
    assert load_model(str(path)).known_as == str(path)


#: Llama 4 Maverick's text_config (the keys autotune reads)
LLAMA4_TEXT = {"model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120, "num_attention_heads": 40,
               "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
               "num_local_experts": 128, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
               "vocab_size": 202048, "hidden_act": "silu", "tie_word_embeddings": False}


def test_llama4_text_config_parses_its_interleaved_moe_layers() -> None:
    """Llama 4 Maverick's text_config: 48 layers, every second one MoE (128 experts, top-1, one shared)."""
    cfg = {"text_config": {"model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120,
                           "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                           "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_local_experts": 128,
                           "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "vocab_size": 202048,
                           "hidden_act": "silu", "tie_word_embeddings": False}}
    m = model_from_hf_config(cfg, "config.json")
    assert (m.num_moe_layers, m.num_dense_layers, m.ffn_hidden_size, m.num_shared_experts) == (24, 24, 16384, 1)
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert (total_params(m), active_params(m)) == (total_params(load_model("llama4-maverick")),
                                                   active_params(load_model("llama4-maverick")))
    scout = {"text_config": {**cfg["text_config"], "num_local_experts": 16, "interleave_moe_layer_step": 1}}
    assert total_params(model_from_hf_config(scout, "config.json")) == total_params(load_model("llama4-scout"))


def test_kimi_k2_counts() -> None:
    """Kimi K2 (DeepSeek-V3's blocks with 64 heads, 384 experts, one dense layer): 32B activated as published;
    the report's 1.04T total is this model's 1.026T plus one more MoE layer (what a DeepSeek-style MTP module
    adds), which its Megatron-Bridge provider does not train: the catalog says so, and counts what trains."""
    m = load_model("kimi-k2")
    assert _matches(active_params(m) / 1e9, 32) and _matches(active_params(m, input_embedding=False) / 1e9, 32)
    assert (m.num_moe_layers, m.num_dense_layers, m.mtp_layers) == (60, 1, 0)
    assert abs((total_params(m) + moe_layer_params(m)) / 1.04e12 - 1) < 0.005


def test_llama4_scout_text_model_by_hand() -> None:
    """Meta's 109B for Scout counts its vision encoder, which autotune does not train: the text model, summed by
    hand from config.json, is what the catalog holds (48 MoE layers of 16 + 1 experts of width 8192 and a
    16-way router, GQA attention 40/8 x 128, two RMSNorms; untied embedding and head; final norm)."""
    h, v = 5120, 202048
    attention = h * 40 * 128 + 2 * h * 8 * 128 + 40 * 128 * h
    layer = attention + 17 * 3 * h * 8192 + 16 * h + 2 * h
    assert total_params(load_model("llama4-scout")) == 48 * layer + 2 * v * h + h
    assert 0.98 < total_params(load_model("llama4-scout")) / 109e9 < 1.0
    assert _matches(active_params(load_model("llama4-scout")) / 1e9, 17)


# ----------------------------------------------------------------------------- bad input
def _moe_dict(**changes):
    base = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_heads": 4, "ffn_hidden_size": 512,
            "vocab_size": 1000, "activation": "swiglu", "norm": "rmsnorm", "tied_embeddings": False,
            "num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 128}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(("changes", "field"), [
    ({"moe_top_k": 9}, "moe_top_k 9 exceeds num_experts 8"),
    ({"moe_top_k": None}, "needs moe_top_k"),
    ({"moe_ffn_hidden_size": None}, "needs moe_ffn_hidden_size"),
    ({"num_experts": -1}, "num_experts must be a whole number >= 0"),
    ({"num_shared_experts": 1}, "shared_expert_ffn_hidden_size"),
    ({"num_experts": 0}, "set num_experts"),
    ({"kv_lora_rank": 64}, "needs qk_rope_head_dim"),
])
def test_bad_moe_model_files_name_the_field(changes, field) -> None:
    with pytest.raises(SpecError, match=field):
        model_from_dict(_moe_dict(**changes), "m.json")


def test_hf_moe_config_missing_top_k_names_it() -> None:
    cfg = {k: v for k, v in HF["mixtral"].items() if k != "num_experts_per_tok"}
    with pytest.raises(SpecError, match="needs num_experts_per_tok"):
        model_from_hf_config(cfg, "config.json")


@pytest.mark.parametrize(("experts", "message"), [
    (None, "num_experts_per_tok 2 without an expert count; add num_local_experts"),
    (0, "num_local_experts 0 with num_experts_per_tok 2: give the expert count"),  # (user-tester: "without" it)
    (-8, "num_local_experts -8 must be a whole number of experts")])  # was read as a dense model
def test_hf_top_k_without_an_expert_count_is_an_error_not_a_dense_model(experts, message) -> None:
    """A Mixtral config whose expert count is missing, 0 or negative was read as a dense model, silently."""
    cfg = {k: v for k, v in HF["mixtral"].items() if k != "num_local_experts"}
    if experts is not None:
        cfg["num_local_experts"] = experts
    with pytest.raises(SpecError, match=message):
        model_from_hf_config(cfg, "config.json")


@pytest.mark.parametrize(("changes", "message"), [
    ({"decoder_sparse_step": 100}, "decoder_sparse_step 100 .every 100-th layer MoE. leaves no MoE layer of 48"),
    ({"num_experts": 1 << 31}, "num_experts 2147483648 exceeds the maximum of 65,536"),  # was an OverflowError
    ({"moe_intermediate_size": 1 << 31}, "moe_intermediate_size 2147483648 exceeds the maximum of 1,048,576")])
def test_hf_moe_configs_no_plan_can_use_are_errors(changes, message) -> None:
    """A step past the last layer left no MoE layer but was planned as MoE (memory charged for experts, emitted
    configs check refuses); sizes within 2^31 overflowed the planner's arrays (user-tester)."""
    with pytest.raises(SpecError, match=message):
        model_from_hf_config({**HF["qwen3_moe"], **changes}, "config.json")


@pytest.mark.parametrize(("changes", "message"), [
    ({"mlp_only_layers": "0,1"}, r'mlp_only_layers must be a list of layer numbers such as \[0, 1\], got "0,1"'),
    ({"moe_intermediate_size": 0}, "qwen3_moe config needs moe_intermediate_size > 0 .* got 0")])
def test_hf_moe_keys_of_the_wrong_kind_are_named(changes, message) -> None:
    """A string of layers read as 'dense layers among the MoE ones', and a width of 0 as a missing key
    (user-tester)."""
    with pytest.raises(SpecError, match=message):
        model_from_hf_config({**HF["qwen3_moe"], **changes}, "config.json")


def test_json_never_writes_a_negative_zero() -> None:
    """A rounded tiny negative (a bubble of -1e-12 s with pp 1) was written -0.0 (user-tester)."""
    from autotune.render.common import dump_json
    assert dump_json({"bubble_s": -0.0, "x": [-0.0, 1.5]}) == dump_json({"bubble_s": 0.0, "x": [0.0, 1.5]})
    assert "-0" not in dump_json({"bubble_s": round(-1e-12, 6)})


@pytest.mark.parametrize(("moe_layers", "message"), [
    ([1, 3, 5], r"moe_layers \[1, 3, 5\] is not modelled; only every interleave_moe_layer_step-th layer is"),
    ([], r"moe_layers \[\] leaves no MoE layer")])
def test_hf_llama4_moe_layers_other_than_its_step_are_errors(moe_layers, message) -> None:
    """transformers' Llama4TextConfig takes moe_layers over interleave_moe_layer_step; it was ignored (user-tester).
    The list the step gives is read as before."""
    cfg = {**LLAMA4_TEXT, "moe_layers": moe_layers}
    with pytest.raises(SpecError, match=message):
        model_from_hf_config(cfg, "config.json")
    same = {**LLAMA4_TEXT, "moe_layers": list(range(1, 48, 2))}
    assert model_from_hf_config(same, "config.json") == model_from_hf_config(LLAMA4_TEXT, "config.json")


@pytest.mark.parametrize(("experts", "message"), [
    ("8", 'num_local_experts "8" must be a whole number'), (8.0, "num_local_experts 8.0 must be a whole number"),
    (True, "num_local_experts true must be a whole number"), (1, "num_experts_per_tok 2 exceeds num_local_experts 1")])
def test_hf_bad_expert_count_is_an_error_not_a_dense_model(experts, message) -> None:
    """An expert count that is not a whole number (or one expert for top-2) was read as a dense model, silently:
    Mixtral at 7 GiB instead of 74."""
    with pytest.raises(SpecError, match=message):
        model_from_hf_config({**HF["mixtral"], "num_local_experts": experts}, "config.json")


def test_hf_deepseek_config_reads_its_group_limited_routing() -> None:
    """n_group / topk_group / routed_scaling_factor of DeepSeek-V3's config.json give the catalog's fields; bad
    groups are errors naming the field."""
    cfg = HF["deepseek_v3"]
    m = model_from_hf_config(cfg, "config.json")
    ds = load_model("deepseek-v3")
    assert (m.moe_router_groups, m.moe_router_group_topk, m.moe_router_scaling) == (8, 4, 2.5) == (
        ds.moe_router_groups, ds.moe_router_group_topk, ds.moe_router_scaling)
    with pytest.raises(SpecError, match="moe_router_groups 7 must divide num_experts 256"):
        model_from_hf_config({**cfg, "n_group": 7}, "config.json")
    with pytest.raises(SpecError, match="moe_router_group_topk 9 must pick 1..8 groups"):
        model_from_hf_config({**cfg, "topk_group": 9}, "config.json")


def test_hf_deepseek_config_needs_its_expert_width() -> None:
    """DeepSeek's intermediate_size is the dense layers' (18432): without moe_intermediate_size the experts took it
    (peak memory 203 -> 1736 GiB in a user's test)."""
    cfg = {k: v for k, v in HF["deepseek_v3"].items() if k != "moe_intermediate_size"}
    with pytest.raises(SpecError, match="deepseek_v3 config needs moe_intermediate_size > 0"):
        model_from_hf_config(cfg, "config.json")


JOB = JobSpec(global_batch=64, seq_len=4096)


@pytest.mark.parametrize(("plan", "message"), [
    (Plan(tp=1, pp=1, dp=8, ep=3, mbs=1, num_microbatches=8, layers_per_stage=(32,)), "ep 3 must divide"),
    (Plan(tp=1, pp=1, dp=2, ep=4, mbs=1, num_microbatches=32, layers_per_stage=(32,)), r"ep\*etp = 4\*1"),
    (Plan(tp=2, pp=1, dp=4, ep=2, etp=2, mbs=1, num_microbatches=16, layers_per_stage=(32,)),
     "needs sequence_parallel"),
])
def test_expert_layout_rules(plan, message) -> None:
    with pytest.raises(InvalidPlanError, match=message):
        check_plan(plan, load_model("mixtral-8x7b"), JOB, plan.num_gpus, 8)


def test_dense_model_refuses_ep() -> None:
    plan = Plan(tp=1, pp=1, dp=8, ep=2, mbs=1, num_microbatches=8, layers_per_stage=(32,))
    with pytest.raises(InvalidPlanError, match="dense: set ep 1"):
        check_plan(plan, load_model("llama3-8b"), JOB, 8, 8)


def test_plan_json_round_trips_ep_and_leaves_dense_plans_unchanged() -> None:
    plan = Plan(tp=2, pp=1, dp=4, ep=4, etp=2, mbs=1, num_microbatches=16, sequence_parallel=True,
                layers_per_stage=(32,))
    assert plan_from_dict(plan.to_dict(), "p") == plan
    assert "ep" not in Plan(tp=1, pp=1, dp=1, layers_per_stage=(1,)).to_dict()
    assert plan.expert_dp == 1 and replace(plan, dp=8, num_microbatches=8).expert_dp == 2


# ----------------------------------------------------------------------------- costs by hand
H100 = load_hardware("h100-sxm")


def test_all_to_all_by_hand() -> None:
    nbytes = 80e6
    intra = comm.group_link(H100, 8, 1)
    nvlink = 450e9 * 0.8
    assert comm.all_to_all(nbytes, 8, intra) == pytest.approx(3e-6 + 7 / 8 * nbytes / nvlink)
    cross = comm.group_link(H100, 16, 1)  # 2 nodes of 8: half the buffer leaves through the GPU's own NIC
    nic = 50e9 * 0.8
    assert comm.all_to_all(nbytes, 16, cross) == pytest.approx(15e-6 + 8 / 16 * nbytes / nic)
    assert comm.all_to_all(nbytes, 1, intra) == 0.0


def test_token_exchange_by_hand() -> None:
    """Forward: dispatch + combine all-to-all of tn*k*h*2 bytes over ep 8 inside a node, plus the dispatch's
    separate all-to-all of the tn*k fp32 probabilities (megatron-core 0.16 token_dispatcher.py,
    MoEAlltoAllTokenDispatcher.token_dispatch); the same backward."""
    m = load_model("mixtral-8x7b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0)
    shape = layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8, etp=1)
    sent = 2 * 4096 * 2 * 4096
    one = 3e-6 + 7 / 8 * sent / (450e9 * 0.8)
    probs = 3e-6 + 7 / 8 * (4 * 4096 * 2) / (450e9 * 0.8)
    # the forward's token-count all-gather: 8 ranks x 8 experts x 8 B over a ring of 8 in the node
    counts = 7 * 3e-6 + 7 / 8 * (8 * 8 * 8) / (450e9 * 0.8)
    assert moe_comm(m, H100, shape) == pytest.approx((2 * one + probs + counts, 2 * one + probs))
    heavy = layer_shape(m, replace(job, moe_imbalance=1.5), tp=1, cp=1, mbs=1, sp=False, ep=8, etp=1)
    assert moe_comm(m, H100, heavy)[1] == pytest.approx(2 * (3e-6 + 7 / 8 * 1.5 * sent / (450e9 * 0.8))
                                                        + 3e-6 + 7 / 8 * 1.5 * 4 * 4096 * 2 / (450e9 * 0.8))


@pytest.mark.parametrize(("experts", "k", "groups"), [(8, 2, 2), (8, 2, 4), (12, 3, 3), (16, 4, 8), (6, 6, 2)])
def test_groups_hit_is_the_mean_over_every_top_k_set(experts, k, groups) -> None:
    """Brute force: the mean over all C(E, k) expert sets of the number of equal contiguous groups they touch."""
    size = experts // groups
    sets = list(itertools.combinations(range(experts), k))
    mean = sum(len({e // size for e in chosen}) for chosen in sets) / len(sets)
    assert groups_hit(experts, k, groups) == pytest.approx(mean)
    assert groups_hit(experts, k, 1) == 1.0


def test_deepep_exchange_inside_a_node_by_hand() -> None:
    """Qwen3-30B-A3B (128 experts, top-8, h 2048), ep 8 in one node, 4096 tokens: a token reaches each GPU with
    probability 1 - C(112,8)/C(128,8), so 8 of those GPUs' worth of rows, 7/8 of them over NVLink; a
    dispatched row is the bf16 hidden state plus 8 int64 indices and 8 fp32 weights, a combined row the hidden
    state. Forward: dispatch + combine + the notify latency; backward: two combine-sized exchanges."""
    m = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0, moe_dispatcher="deepep")
    shape = layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8, etp=1)
    hit = 1 - math.comb(112, 8) / math.comb(128, 8)
    dispatch = 3e-6 + 7 / 8 * 4096 * 8 * hit * (2 * 2048 + 8 * (8 + 4)) / (450e9 * 0.8)
    combine = 3e-6 + 7 / 8 * 4096 * 8 * hit * 2 * 2048 / (450e9 * 0.8)
    assert deepep_exchange(m, H100, shape) == pytest.approx(dispatch)
    assert deepep_exchange(m, H100, shape, dispatch=False) == pytest.approx(combine)
    assert moe_comm(m, H100, shape) == pytest.approx((dispatch + combine + 3e-6, 2 * combine))
    # fewer rows than the alltoall dispatcher's k copies per token: 8 * hit = 5.3 < 8
    alltoall = layer_shape(m, replace(job, moe_dispatcher="alltoall"), tp=1, cp=1, mbs=1, sp=False, ep=8, etp=1)
    assert moe_comm(m, H100, shape)[1] < 0.7 * moe_comm(m, H100, alltoall)[1]


def test_deepep_sends_a_token_once_per_remote_node_by_hand() -> None:
    """ep 16 over two 8-GPU nodes: a token crosses the network once if the other node holds any of its 8
    experts (1 - C(64,8)/C(128,8)), through the GPU's own NIC, while NVLink forwards the rows inside the node;
    the slower leg counts. The alltoall dispatcher sends the 8 x 8/16 remote copies instead: about 4x the
    network bytes."""
    m = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0, moe_dispatcher="deepep")
    shape = layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=16, etp=1)
    row = 2 * 2048 + 8 * (8 + 4)
    remote = 4096 * (1 - math.comb(64, 8) / math.comb(128, 8))
    rows = 4096 * 16 * (1 - math.comb(120, 8) / math.comb(128, 8))
    nvlink = 7 / 8 * rows * row / (450e9 * 0.8)
    network = remote * row / (50e9 * 0.8)
    assert network > nvlink
    assert deepep_exchange(m, H100, shape) == pytest.approx(15e-6 + network)
    a2a = layer_shape(m, replace(job, moe_dispatcher="alltoall"), tp=1, cp=1, mbs=1, sp=False, ep=16, etp=1)
    assert moe_comm(m, H100, a2a)[1] > 3.5 * moe_comm(m, H100, shape)[1]


def test_deepep_top1_moves_what_the_alltoall_dispatcher_moves() -> None:
    """With one expert per token there is nothing to deduplicate: DeepEP's exchange carries the alltoall
    dispatcher's token bytes (plus the routing metadata each row carries)."""
    m = replace(load_model("mixtral-8x7b"), moe_top_k=1)
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0, moe_dispatcher="deepep")
    shape = layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8, etp=1)
    assert deepep_exchange(m, H100, shape) == pytest.approx(3e-6 + 7 / 8 * 4096 * (2 * 4096 + 12) / (450e9 * 0.8))


def test_deepep_permutes_only_the_delivered_rows() -> None:
    """The flex dispatcher permutes the rows DeepEP delivered into expert order and back, once each way (no
    source-side permute, no second sort by expert, no fp32 combine casts)."""
    m = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0, moe_dispatcher="deepep")
    names = [op.name for op in layer_forward_ops(m, layer_shape(m, job, tp=2, cp=1, mbs=1, sp=True, ep=4, etp=2),
                                                  True)]
    assert "permute_by_experts" in names and "unpermute_by_experts" in names
    assert not {"permute", "sort_by_expert", "unsort_by_expert", "unpermute", "combine_cast_fp32"} & set(names)
    with pytest.raises(SpecError, match="--moe-dispatcher must be one of alltoall, deepep"):
        JobSpec(global_batch=8, seq_len=4096, moe_dispatcher="nccl")  # type: ignore[arg-type]


def test_expert_tensor_parallel_exchange_reduces_in_fp32_by_hand() -> None:
    """etp 2, ep 4 (tp 2, sp): combine_preprocess reduce-scatters the expert outputs cast to the probabilities'
    dtype (fp32), dispatch_postprocess all-gathers tokens and probabilities. Mixtral, 4096 tokens / tp 2 = 2048
    routed per GPU x top-2 = 4096 copies: tokens 4096 x 4096 x 2 B, probabilities 4096 x 4 B; the etp pair
    gathers 2x that and reduce-scatters 2 x 4096 x 4096 x 4 B, on NVLink (2 ranks: one ring step). The ep group
    (4 ranks, stride 2) stays in the node. The casts: r = 8192 rows up to fp32 and 4096 back."""
    m = load_model("mixtral-8x7b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0)
    shape = layer_shape(m, job, tp=2, cp=1, mbs=1, sp=True, ep=4, etp=2)
    bw = 450e9 * 0.8
    tokens, probs = 4096 * 4096 * 2, 4096 * 4
    a2a = 2 * (3e-6 + 3 / 4 * tokens / bw) + 3e-6 + 3 / 4 * probs / bw
    etp = (3e-6 + 1 / 2 * 2 * tokens / bw) + (3e-6 + 1 / 2 * 2 * probs / bw) + (3e-6 + 1 / 2 * 2 * 2 * tokens / bw)
    assert moe_comm(m, H100, shape)[1] == pytest.approx(a2a + etp)
    ops = {op.name: op for op in layer_forward_ops(m, shape, True)}
    assert ops["combine_cast_fp32"].bytes == pytest.approx(6 * 8192 * 4096)
    assert ops["combine_cast_back"].bytes == pytest.approx(6 * 4096 * 4096)
    names = list(ops)
    assert names.index("unsort_by_expert") < names.index("combine_cast_fp32") < names.index("unpermute")


@pytest.mark.parametrize(("tp", "ep", "etp"), [(1, 1, 1), (1, 8, 1), (2, 4, 2), (2, 2, 1)])
def test_expert_flops_per_gpu_do_not_depend_on_the_layout(tp, ep, etp) -> None:
    """Balanced routing: every GPU runs tokens*k/tp token-expert products of 2*h*3f FLOPs, whatever ep/etp."""
    m = load_model("mixtral-8x7b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0)
    ops = layer_forward_ops(m, layer_shape(m, job, tp=tp, cp=1, mbs=1, sp=tp > 1, ep=ep, etp=etp))
    experts = sum(op.flops for op in ops if op.name.startswith("expert_"))
    assert experts == pytest.approx(4096 * 2 / tp * 2 * 4096 * 3 * 14336)
    up = next(op for op in ops if op.name == "expert_up")
    assert up.groups == 8 // ep and up.dims[0] == pytest.approx(4096 * 2 * ep * etp / (tp * 8))


def test_imbalance_scales_the_busiest_experts() -> None:
    m = load_model("mixtral-8x7b")
    flops = []
    for imbalance in (1.0, ROUTED_IMBALANCE):
        job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=imbalance)
        ops = layer_forward_ops(m, layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8, etp=1))
        flops.append(sum(op.flops for op in ops if op.name.startswith("expert_")))
    assert flops[1] == pytest.approx(ROUTED_IMBALANCE * flops[0])
    assert JobSpec(global_batch=1, seq_len=1).moe_imbalance == ROUTED_IMBALANCE


def test_without_expert_parallelism_no_gpu_waits_for_the_busiest_expert() -> None:
    """ep 1: every GPU runs every expert on its own tn x k token copies, however they are routed, so the routing
    imbalance costs nothing (a capacity that pads every expert's input still does)."""
    m = load_model("mixtral-8x7b")
    plan = Plan(tp=2, pp=1, dp=4, ep=1, mbs=1, num_microbatches=2, zero=1, sequence_parallel=True,
                layers_per_stage=(32,))
    steps = {x: CostModel(m, H100, JobSpec(global_batch=8, seq_len=4096, moe_imbalance=x)).estimate(plan)
             for x in (1.0, ROUTED_IMBALANCE, 3.0)}
    assert len({(e.step_time_s, e.peak_memory_bytes) for e in steps.values()}) == 1
    padded = JobSpec(global_batch=8, seq_len=4096, moe_capacity_factor=1.5, moe_pad_to_capacity=True)
    assert layer_shape(m, padded, tp=2, cp=1, mbs=1, sp=True, ep=1).imbalance == 1.5
    dropping = JobSpec(global_batch=8, seq_len=4096, moe_capacity_factor=0.5)  # at most half the tokens survive
    assert layer_shape(m, dropping, tp=2, cp=1, mbs=1, sp=True, ep=1).imbalance == 0.5
    spread = replace(plan, ep=8, etp=1)
    slow, fast = (CostModel(m, H100, JobSpec(global_batch=8, seq_len=4096, moe_imbalance=x)).estimate(spread)
                  for x in (ROUTED_IMBALANCE, 1.0))
    assert slow.step_time_s > fast.step_time_s  # with experts spread over GPUs the busiest one is waited for


def _brute_parts_hit(experts: int, k: int, groups: int, chosen: int, parts: int) -> float:
    """Every choice of `chosen` groups, then every top-k set of their experts, equally likely: the mean number of
    the `parts` consecutive shares of the experts it touches."""
    from itertools import combinations

    size, total, count = experts // groups, 0, 0
    for picked in combinations(range(groups), chosen):
        pool = [g * size + i for g in picked for i in range(size)]
        for tops in combinations(pool, k):
            total += len({e * parts // experts for e in tops})
            count += 1
    return total / count


@pytest.mark.parametrize(("experts", "k", "groups", "chosen", "parts"), [
    (16, 4, 4, 2, 4), (16, 4, 4, 2, 8), (16, 4, 4, 3, 2), (12, 3, 3, 2, 6), (64, 2, 8, 2, 4)])
def test_group_limited_routing_spans_fewer_gpus_and_nodes(experts, k, groups, chosen, parts) -> None:
    """parts_hit against a brute-force enumeration: exact where each group spans whole shares (DeepSeek-V3's 8
    groups on 8 nodes: at most 4 nodes), an upper bound where a share holds whole groups."""
    from autotune.costmodel.moe import parts_hit

    m = replace(load_model("deepseek-v3"), num_experts=experts, moe_top_k=k, moe_router_groups=groups,
                moe_router_group_topk=chosen)
    brute = _brute_parts_hit(experts, k, groups, chosen, parts)
    free = replace(m, moe_router_groups=0, moe_router_group_topk=0)
    if parts % groups == 0:
        assert parts_hit(m, parts) == pytest.approx(brute)
    else:
        assert brute <= parts_hit(m, parts) + 1e-12
    assert parts_hit(m, parts) <= min(k, parts_hit(free, parts)) + 1e-12  # a limit never spreads tokens wider
    ds = load_model("deepseek-v3")
    assert 3.5 < parts_hit(ds, 8) <= 4 < parts_hit(replace(ds, moe_router_groups=0, moe_router_group_topk=0), 8)


def test_expert_optimizer_state_shards_over_the_expert_data_parallel_group() -> None:
    """ZeRO-1 on 8 GPUs, ep 8: the experts' 12 bytes/param are not sharded (edp 1), the rest over dp 8."""
    m = load_model("mixtral-8x7b")
    job = JobSpec(global_batch=8, seq_len=4096)
    plan = Plan(tp=1, pp=1, dp=8, ep=8, mbs=1, num_microbatches=1, zero=1, layers_per_stage=(32,))
    check_plan(plan, m, job, 8, 8)
    stage = CostModel(m, H100, job).estimate(plan).stages[0]
    layer = layer_cost(m, H100, job, tp=1, cp=1, mbs=1, sp=False, ep=8, etp=1)
    experts = layer.expert_params
    assert experts == 3 * 4096 * 14336
    rest = stage.params - 32 * experts
    assert stage.memory.optimizer == pytest.approx(12 * 32 * experts + 12 * rest / 8, abs=64)
    assert stage.memory.weights == 2 * stage.params


def test_mfu_flops_count_active_parameters() -> None:
    """6 * N_active (no input embedding) + attention, per token, as published MoE MFU figures count."""
    m = load_model("qwen3-30b-a3b")
    attention = 48 * 2 * 2 * 4096 * m.q_width
    # norms are parameters but no matmul: the difference to 2 * N_active is the per-layer norm weights
    norms = 48 * 2 * 2048 + 2048
    expected = 2 * (active_params(m, input_embedding=False) - norms) + attention
    assert forward_matmul_flops_per_token(m, 4096) == pytest.approx(expected, rel=1e-9)


def test_dense_first_layers_blend_time_and_take_the_moe_layer_memory() -> None:
    """The mean layer: times and parameters (what syncs and steps) weighted by the layer counts; a stage's
    memory charged at the MoE layer (with dense-first layers a stage may hold only MoE layers)."""
    m = load_model("deepseek-v3")
    job = JobSpec(global_batch=64, seq_len=4096)
    kw = dict(tp=8, cp=1, mbs=1, sp=True)
    mean = layer_cost(m, H100, job, **kw, ep=8, etp=1)
    moe = layer_cost(replace(m, first_dense_layers=0), H100, job, **kw, ep=8, etp=1)
    dense = dense_layer_cost(m, H100, job, **kw)
    w = 3 / 61
    assert (mean.stage_params, mean.stage_expert_params, mean.surplus_params) == (moe.params, moe.expert_params, 0)
    assert mean.act == moe.act
    assert mean.params == round((1 - w) * moe.params + w * dense.params)
    for part in ("fwd", "bwd"):
        assert math.isclose(getattr(mean, part).seconds,
                            (1 - w) * getattr(moe, part).seconds + w * getattr(dense, part).seconds)
    assert mean.tp_fwd_s == pytest.approx((1 - w) * moe.tp_fwd_s + w * dense.tp_fwd_s)


def test_public_moe_rows_are_evaluated_with_their_published_layout() -> None:
    """The 12 MoE rows of published-runs-public.csv: catalog model, published tp/pp/ep/etp/vp/mbs pinned,
    balanced routing, nothing fitted (reports/accuracy/rules.py RULES 'moe')."""
    from autotune.reports.accuracy.common import PUBLIC_DATA, read_rows
    from autotune.reports.accuracy.public import moe_public_rows
    from autotune.reports.accuracy.rules import RowSkipped, moe_case, row_case

    rows = {int(r["row_id"]): r for r in read_rows(PUBLIC_DATA)}
    case = moe_case(rows[534])  # Qwen3-30B-A3B: tp 1, pp 2, ep 8, etp blank (= tp), vp 24, mbs 2
    p = case.plan
    assert case.model == load_model("qwen3-30b-a3b") and case.job.moe_imbalance == 1.0
    assert (p.tp, p.pp, p.ep, p.etp, p.vpp, p.mbs, p.dp) == (1, 2, 8, 1, 24, 2, 8)
    with pytest.raises(RowSkipped, match="MoE"):
        row_case(rows[534])  # the dense report lists it as skipped
    moe = moe_public_rows()
    assert len(moe) == 12 and {r.family for r in moe} == {"GPT-OSS-120B", "Qwen3-30B-A3B"}
    assert all(r.lofo_step_s == r.predicted_step_s for r in moe)


def test_expert_bias_is_applied_per_expert_in_pytorch_by_hand() -> None:
    """GPT-OSS's expert biases: megatron-core's TEGroupedMLP._apply_bias runs `t + b * p` per local expert and
    a torch.cat. ep 8 of 128 experts = 16 local; 4096 tokens x top-4 = 16384 rows of h 2880 in bf16: per
    expert b*p writes rows*h*2 B, the add reads 2x and writes 1x that; the cat reads and writes all rows."""
    from autotune.costmodel.compute import pass_time

    m = load_model("gpt-oss-120b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0)
    shape = layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8, etp=1)
    ops = [op for op in layer_forward_ops(m, shape, True) if op.name.startswith("expert_bias")]
    assert len(ops) == 2 * 16 + 1
    plane = 16384 * 2880 * 2
    assert sum(op.bytes for op in ops) == pytest.approx(6 * plane)
    seconds = pass_time(tuple(ops), H100, "bf16").seconds
    assert seconds == pytest.approx(6 * plane / (3350e9 * 0.75) + 33 * 3e-6)
    mixtral = load_model("mixtral-8x7b")  # no expert biases: nothing added
    assert not [op for op in layer_forward_ops(mixtral, layer_shape(mixtral, job, tp=1, cp=1, mbs=1, sp=False, ep=8),
                                               True) if op.name.startswith("expert_bias")]


def test_dropless_alltoall_resorts_received_tokens_by_local_expert_by_hand() -> None:
    """megatron-core's dispatch_postprocess / combine_preprocess (sort_chunks_by_idxs): Qwen3-30B-A3B, ep 8 of
    128 experts = 16 local, 4096 tokens x top-8 = 32768 received copies of h 2048 in bf16: the sort reads and
    writes them (and their fp32 probabilities), the un-sort reads and writes the expert outputs. With one
    local expert (ep = experts) there is nothing to sort."""
    m = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0)
    ops = {op.name: op for op in layer_forward_ops(m, layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8), True)}
    assert ops["sort_by_expert"].bytes == pytest.approx(2 * 2 * 32768 * 2048 + 2 * 4 * 32768)
    assert ops["unsort_by_expert"].bytes == pytest.approx(2 * 2 * 32768 * 2048)
    names = [op.name for op in layer_forward_ops(m, layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=128), True)]
    assert "sort_by_expert" not in names and "unsort_by_expert" not in names
    # the order of the passes follows the dispatcher: permute, (all-to-all), sort, experts, un-sort, unpermute
    order = list(ops)
    assert order.index("permute") < order.index("sort_by_expert") < order.index("expert_up")
    assert order.index("expert_down") < order.index("unsort_by_expert") < order.index("unpermute")


def test_permutation_backward_moves_the_gradient_back_with_the_forward_traffic() -> None:
    """A permutation has no saved input to read: the backward of the permute and of the re-sorts scatters the
    gradient rows back (Qwen3-30B-A3B, ep 8: 32768 copies of h 2048 in bf16 each way), while an ordinary
    memory-bound op (the router's top-k) reads its saved input too and costs twice its forward traffic."""
    m = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0)
    forward = layer_forward_ops(m, layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8), True)
    fwd = {op.name: op for op in forward}
    bwd = {op.name: op for op in backward_ops(forward, m, layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8))}
    assert bwd["permute_bwd"].bytes == pytest.approx(2 * 2 * 4096 * 8 * 2048)
    assert bwd["sort_by_expert_bwd"].bytes == pytest.approx(fwd["sort_by_expert"].bytes)
    assert bwd["unsort_by_expert_bwd"].bytes == pytest.approx(fwd["unsort_by_expert"].bytes)
    assert bwd["router_topk_bwd"].bytes == pytest.approx(2 * fwd["router_topk"].bytes)


def test_router_probabilities_apply_in_the_activation_so_expert_outputs_are_not_kept_by_hand() -> None:
    """megatron-core 0.16 multiplies the router probabilities into the expert activation (moe/experts.py,
    TEGroupedMLP.forward: weighted_bias_swiglu_impl) and un-permutes without them (moe/token_dispatcher.py,
    MoEAlltoAllTokenDispatcher.combine_postprocess), so the fc2 output is not saved. Qwen3-30B-A3B, ep 8,
    4096 tokens x top-8 = 32768 copies, h 2048, expert width 768 (SwiGLU: fc1 out 1536), bf16: kept are the
    fp32 router scores (4096 x 128 x 4 B), fc1's input (r x h), the activation's input (r x 2f) and fc2's
    input (r x f), 2 B each; the un-permute only sums the k copies (tn * k * h adds)."""
    from autotune.costmodel.moe import moe_activation_bytes

    m = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0)
    shape = layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8)
    r = 32768
    assert moe_activation_bytes(m, shape) == pytest.approx(4096 * 128 * 4 + 2 * r * 2048 + 2 * r * 1536
                                                           + 2 * r * 768)
    ops = {op.name: op for op in layer_forward_ops(m, shape, True)}
    assert ops["unpermute"].flops == pytest.approx(4096 * 8 * 2048)
    assert ops["unpermute"].bytes == pytest.approx(2 * 2 * 4096 * 8 * 2048 + 2 * 4096 * 2048)
    assert not [name for name in ops if name.startswith("expert_clamp")]  # Qwen3 does not clamp


def test_gpt_oss_clamp_runs_outside_the_fused_activation_by_hand() -> None:
    """GPT-OSS's clamped gated unit (megatron-core 0.16 fusions/fused_bias_geglu.py,
    weighted_bias_quick_geglu_impl with clamp_value): chunk fc1's output, clamp each half (read + write r x f
    each), cat them (read + write r x 2f) before the fused kernel. ep 8, 4096 tokens x top-4 = 16384 copies,
    f 2880, bf16. Backward: each clamp reads the gradient and its input and writes one (3 planes of r x f), the
    chunk's backward copies the two gradient halves into one tensor (r x 2f read and written). Memory: the
    clamp keeps fc1's unclamped output (r x 2f) besides the activation's clamped input."""
    from autotune.costmodel.moe import moe_activation_bytes

    m = load_model("gpt-oss-120b")
    job = JobSpec(global_batch=8, seq_len=4096, moe_imbalance=1.0)
    shape = layer_shape(m, job, tp=1, cp=1, mbs=1, sp=False, ep=8)
    plane = 2 * 16384 * 2880  # r x f in bf16
    forward = layer_forward_ops(m, shape, True)
    fwd = {op.name: op for op in forward}
    assert [fwd[n].bytes for n in ("expert_clamp_glu", "expert_clamp_linear", "expert_clamp_cat")] == \
        pytest.approx([2 * plane, 2 * plane, 4 * plane])
    names = list(fwd)
    assert names.index("expert_up") < names.index("expert_clamp_cat") < names.index("gated_act")
    bwd = {op.name: op for op in backward_ops(forward, m, shape)}
    assert [bwd[n + "_bwd"].bytes for n in ("expert_clamp_glu", "expert_clamp_linear", "expert_clamp_cat")] == \
        pytest.approx([3 * plane, 3 * plane, 4 * plane])
    assert bwd["gated_act_bwd"].bytes == pytest.approx(2 * fwd["gated_act"].bytes)  # others untouched
    r, h, up, f = 16384, 2880, 5760, 2880
    assert moe_activation_bytes(m, shape) == pytest.approx(4096 * 128 * 4 + 2 * r * h + 2 * 2 * r * up
                                                           + 2 * r * f)


def test_deepep_runs_where_megatron_bridge_turns_it_on() -> None:
    """megatron-bridge 0.3.1 training/flex_dispatcher_backend.py: compute capability 8.x/9.x, B200 and B300
    (the groups it runs over are a plan's: tests/specs/test_plan.py)."""
    from dataclasses import replace

    from autotune.catalog import load_hardware
    from autotune.costmodel.moe import deepep_refusal

    assert [name for name in ("a100-80gb", "h100-sxm", "h200", "b200") if deepep_refusal(load_hardware(name))] == []
    assert "not v100-32gb (7.0)" in deepep_refusal(load_hardware("v100-32gb"))
    assert "not mi300x (gfx942)" in deepep_refusal(load_hardware("mi300x"))
    assert deepep_refusal(replace(load_hardware("h100-sxm"), gpus_per_node=4)) == ""
    assert deepep_refusal(replace(load_hardware("v100-32gb"), compute_capability="")) == ""  # taken at its word


@pytest.mark.parametrize(("name", "ep", "blocks"), [
    ("qwen3-30b-a3b", 1, 2),  # no EP: the MoE boundary gathers the tokens for the router and the split experts
    ("qwen3-30b-a3b", 2, 1),  # EP: only the attention's input is gathered
    ("deepseek-v3", 2, 2),    # EP, but its shared expert gathers its input
])
def test_torchtitan_moe_layers_keep_their_gathered_inputs(name: str, ep: int, blocks: int) -> None:
    """torchtitan saves what it all-gathers (tpcomm.regathers_inputs), so an MoE layer under tp 2 keeps, beyond
    Megatron's, blocks x t x h x (1 - 1/tp) bf16 elements when nothing recomputes (torchtitan 0.3,
    models/common/moe_sharding.py); selective and full recomputation keep none of them."""
    model, hw = load_model(name), load_hardware("h100-sxm")
    etp = 2 if ep == 1 else 1
    moe_only = replace(model, first_dense_layers=0)  # the MoE layer alone, not blended with a dense-first one
    titan, megatron = (layer_cost(moe_only, hw, JobSpec(global_batch=64, seq_len=4096, trainer=t), tp=2, cp=1,
                                  mbs=1, sp=True, ep=ep, etp=etp) for t in ("torchtitan", "megatron"))
    assert titan.act.none - megatron.act.none == blocks * 2 * 4096 * model.hidden_size // 2
    assert (titan.act.selective, titan.act.full) == (megatron.act.selective, megatron.act.full)


def test_a_capacity_factor_costs_the_capped_load():
    """Dropping at capacity C is the busiest expert at min(imbalance, C) x the mean, padding is C: the estimate
    equals the dropless one at that load, to the bit."""
    from dataclasses import replace as _replace

    from autotune.catalog import load_hardware, load_model
    from autotune.costmodel.estimate import CostModel
    from autotune.specs.job import JobSpec
    from autotune.specs.plan import Plan

    model, hw = load_model("mixtral-8x7b"), load_hardware("h100-sxm")
    plan = Plan(tp=1, pp=1, dp=16, ep=8, mbs=1, num_microbatches=4, zero=1, layers_per_stage=(32,))
    base = JobSpec(global_batch=64, seq_len=4096, moe_imbalance=1.25)
    for capacity, pad, load in ((1.1, False, 1.1), (2.0, False, 1.25), (2.0, True, 2.0)):
        capped = CostModel(model, hw, _replace(base, moe_capacity_factor=capacity, moe_pad_to_capacity=pad))
        same = CostModel(model, hw, _replace(base, moe_imbalance=load))
        assert capped.estimate(plan).step_time_s == same.estimate(plan).step_time_s
        assert capped.estimate(plan).peak_memory_bytes == same.estimate(plan).peak_memory_bytes
    slower = CostModel(model, hw, _replace(base, moe_capacity_factor=2.0, moe_pad_to_capacity=True))
    assert slower.estimate(plan).step_time_s > CostModel(model, hw, base).estimate(plan).step_time_s


def test_qk_norm_by_hand() -> None:
    """Qwen3's per-head RMSNorm on queries and keys: one fused norm op over the q and k widths (read and write
    each element once, plus a weight vector of that width as ops._norm counts one), and its inputs kept for the
    backward, e * t * (q + k) bytes more per layer."""
    from autotune.costmodel.memory import layer_activations
    from autotune.costmodel.ops import layer_forward_ops

    qwen = load_model("qwen3-30b-a3b")
    plain = replace(qwen, qk_norm=False)
    shape = layer_shape(qwen, JOB, tp=1, cp=1, mbs=1, sp=False)
    t, e = shape.tokens, shape.elem
    width = qwen.q_width + qwen.kv_width  # 32 x 128 + 4 x 128 = 4608
    assert width == 4608
    (op,) = [o for o in layer_forward_ops(qwen, shape) if o.name == "qk_norm"]
    assert (op.bytes, op.flops, op.category) == (2 * e * t * width + e * width, 5 * t * width, "norm")
    assert not [o for o in layer_forward_ops(plain, shape) if o.name == "qk_norm"]
    extra = layer_activations(qwen, shape).none - layer_activations(plain, shape).none
    assert extra == e * t * width
    assert model_from_hf_config(HF["qwen3_moe"], "config.json").qk_norm
    assert not model_from_hf_config(HF["mixtral"], "config.json").qk_norm


def test_hf_errors_name_the_config_keys_and_a_dense_prefix_is_dense_first() -> None:
    """A bad value is reported under its config.json key (num_experts_per_tok, not autotune's moe_top_k); Qwen's
    mlp_only_layers [0, 1] is two dense-first layers, which autotune models; [1] is refused with the fix."""
    with pytest.raises(SpecError, match='num_experts_per_tok "2" must be a whole number of experts per token, 1 to '
                                        "num_local_experts 8; fix it"):
        model_from_hf_config({**HF["mixtral"], "num_experts_per_tok": "2"}, "config.json")
    with pytest.raises(SpecError, match="num_attention_heads 32 must be a multiple of num_key_value_heads 5"):
        model_from_hf_config({**HF["mixtral"], "num_key_value_heads": 5}, "config.json")
    assert model_from_hf_config({**HF["qwen3_moe"], "mlp_only_layers": [1, 0]}, "c.json").first_dense_layers == 2
    with pytest.raises(SpecError, match=r"only dense layers before the first MoE layer are \(mlp_only_layers"):
        model_from_hf_config({**HF["qwen3_moe"], "mlp_only_layers": [1]}, "config.json")


def test_llama4s_top_level_untied_embeddings_apply_to_its_text_config() -> None:
    """The hub's Llama 4 config.json keeps tie_word_embeddings false beside text_config, not inside it: the
    language model is untied (it parsed tied, about 1B parameters short, user-tester 2026-11-25)."""
    text = {"model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120, "num_attention_heads": 40,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
            "vocab_size": 202048, "hidden_act": "silu"}
    m = model_from_hf_config({"tie_word_embeddings": False, "text_config": text}, "config.json")
    assert not m.tied_embeddings
    assert total_params(m) == total_params(load_model("llama4-scout"))


def test_latent_attention_normalizes_both_latents():
    """DeepSeek's MLA normalizes the query latent (q_lora_rank wide) and the key/value latent (kv_lora_rank wide,
    without the RoPE part) before their up-projections (q_a_layernorm, kv_a_layernorm): two fused RMSNorm kernels,
    each reading and writing its latent in bf16 plus its weight, between the down- and up-projection GEMMs."""
    from autotune.costmodel.ops import LayerShape, mla_projections

    m = load_model("deepseek-v3")
    shape = LayerShape(tokens=4096, kv_tokens=4096, mbs=1, tp=2, sp=True, elem=2, flash=True, fused=True)
    names = [op.name for op in mla_projections(m, shape)]
    assert names == ["q_down_proj", "q_latent_norm", "q_up_proj", "kv_down_proj", "kv_latent_norm", "kv_up_proj"]
    norms = {op.name: op for op in mla_projections(m, shape) if op.category == "norm"}
    assert norms["q_latent_norm"].bytes == 2 * 2 * 4096 * 1536 + 2 * 1536
    assert norms["kv_latent_norm"].bytes == 2 * 2 * 4096 * 512 + 2 * 512
