"""The model of a published row (RULES 'moe' and 'model'): catalog names in a source's own spelling, reduced-depth
runs, models the catalog lacks, and dense families that are not Llama."""

from __future__ import annotations

import pytest

from autotune.catalog import load_model
from autotune.costmodel.memory import active_params, total_params
from autotune.reports.accuracy.common import PUBLIC_DATA, read_rows
from autotune.reports.accuracy.row_models import catalog_match, row_moe_model
from autotune.reports.accuracy.rules import (MoeRecipe, RowSkipped, moe_case, moe_recipe, recipe_layout, row_case,
                                             row_dense_model, row_model)


@pytest.fixture(scope="module")
def qwen_row() -> dict[str, str]:
    return {int(r["row_id"]): r for r in read_rows(PUBLIC_DATA)}[534]


@pytest.mark.parametrize(("name", "catalog"), [
    ("DeepSeek-V3", "deepseek-v3"), ("DeepSeekV3", "deepseek-v3"), ("Qwen3_235B_a22b", "qwen3-235b-a22b"),
    ("GPT OSS 120B", "gpt-oss-120b"), ("GPT-OSS-20B", "gpt-oss-20b"), ("Mixtral 8x22B", "mixtral-8x22b"),
    ("Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("Qwen3-30B-A3B (tokendrop)", "qwen3-30b-a3b"), ("Kimi-K2", "kimi-k2"), ("Llama4 Maverick 17B-128E",
                                                                                "llama4-maverick"),
    ("Grok-1", None), ("Llama3-70B", None)])
def test_catalog_match_reads_letters_and_digits(name, catalog) -> None:
    assert catalog_match(name) == catalog


def test_the_catalog_model_as_it_is(qwen_row) -> None:
    model, note = row_moe_model(qwen_row)
    assert model == load_model("qwen3-30b-a3b") and note == ""


def test_a_reduced_depth_run_keeps_the_architecture(qwen_row) -> None:
    row = {**qwen_row, "model": "DeepSeekV3", "num_layers": "16", "hidden_size": "7168", "num_experts": "256",
           "moe_top_k": "8"}
    model, note = row_moe_model(row)
    full = load_model("deepseek-v3")
    assert (model.num_layers, model.first_dense_layers, model.kv_lora_rank) == (16, 3, full.kv_lora_rank)
    assert "16 layers (of 61)" in note
    # 13 MoE layers instead of 58: the difference is 45 MoE layers, by hand (norms aside): 256 routed and one
    # shared SwiGLU expert, the router, and MLA (q down/up, kv down with the shared rope key, kv up, output)
    h, heads = 7168, 128
    experts = 257 * 3 * h * 2048 + 256 * h
    mla = h * 1536 + 1536 * heads * 192 + h * (512 + 64) + 512 * heads * (128 + 128) + heads * 128 * h
    assert (total_params(full) - total_params(model)) / 45 == pytest.approx(experts + mla, rel=1e-4)


def test_a_model_the_catalog_lacks_is_built_from_the_columns(qwen_row) -> None:
    # Grok-1 (xai-org/grok-1 config): 64 layers, hidden 6144, 48 heads / 8 kv, 8 experts top-2 of width 32768
    row = {**qwen_row, "model": "Grok-1", "num_layers": "64", "hidden_size": "6144", "num_attention_heads": "48",
           "num_kv_heads": "8", "ffn_hidden_size": "", "moe_ffn_hidden_size": "32768", "num_experts": "8",
           "moe_top_k": "2", "shared_experts": "", "vocab_size": "131072"}
    model, note = row_moe_model(row)
    assert "built from the shape columns" in note
    assert (model.head_dim, model.num_moe_layers, model.num_shared_experts) == (128, 64, 0)
    # by hand: attention 2*h*(h + kv*d) per layer, experts 8 x 3*h*f, embedding and head 2*V*h (norms aside)
    attention = 2 * 6144 * (6144 + 8 * 128)
    experts = 8 * 3 * 6144 * 32768 + 6144 * 8
    expected = 64 * (attention + experts) + 2 * 131072 * 6144
    assert total_params(model) == pytest.approx(expected, rel=1e-3)
    assert total_params(model) / 1e9 == pytest.approx(314, rel=0.01)  # Grok-1's published 314B
    active = 64 * (attention + experts / 4) + 2 * 131072 * 6144
    assert active_params(model) == pytest.approx(active, rel=1e-3)


def test_a_shape_that_differs_from_the_catalog_is_built_from_the_columns(qwen_row) -> None:
    model, note = row_moe_model({**qwen_row, "num_experts": "64"})
    assert model.num_experts == 64 and "num_experts 64 differs from catalog qwen3-30b-a3b's 128" in note


@pytest.mark.parametrize(("column", "value", "message"), [
    ("moe_ffn_hidden_size", "", "moe_ffn_hidden_size is not published"),
    ("moe_top_k", "9", "moe_top_k 9 is not within 1..num_experts 8"),
    ("num_attention_heads", "7", "not a grouped-query attention shape")])
def test_columns_that_make_no_model_skip_the_row(qwen_row, column, value, message) -> None:
    row = {**qwen_row, "model": "Grok-1", "num_experts": "8", "moe_top_k": "2", column: value}
    with pytest.raises(RowSkipped, match=message):
        moe_case(row)


def test_recipes_follow_the_matched_name(qwen_row) -> None:
    assert moe_recipe({**qwen_row, "model": "Qwen3_235B_a22b"}, load_model("qwen3-235b-a22b")) == \
        MoeRecipe("none", "deepep", "fp32", "fp32")
    assert moe_recipe({**qwen_row, "model": "DeepSeekV3"}, load_model("deepseek-v3")) == \
        MoeRecipe("selective", "deepep", "bf16", "bf16-moments")
    assert moe_recipe({**qwen_row, "model": "Grok-1"}, load_model("qwen3-30b-a3b")) is None
    assert moe_recipe({**qwen_row, "model": "Kimi-K2"}, load_model("kimi-k2")) == \
        MoeRecipe("selective", "alltoall", "fp32", "fp32")


@pytest.fixture(scope="module")
def llama_row() -> dict[str, str]:
    return {int(r["row_id"]): r for r in read_rows(PUBLIC_DATA) if r["model"] == "Llama3.1-70B"}.popitem()[1]


def test_llama_rows_are_the_columns(llama_row) -> None:
    model, note = row_dense_model(llama_row)
    assert model == row_model(llama_row) and note == ""
    assert (model.activation, model.norm, model.position_embedding) == ("swiglu", "rmsnorm", "rope")


def test_a_gpt3_row_takes_the_catalog_architecture(llama_row) -> None:
    """NeMo's GPT-3 175B benchmark: GeLU, LayerNorm, biases and learned positions, not Llama's blocks (a
    SwiGLU MLP of width 49152 would cost 1.5x its MLP); the row's vocabulary (padded) is kept."""
    row = {**llama_row, "model": "GPT3-175B", "num_layers": "96", "hidden_size": "12288",
           "num_attention_heads": "96", "num_kv_heads": "", "ffn_hidden_size": "49152", "vocab_size": "51200"}
    model, note = row_dense_model(row)
    assert (model.activation, model.norm, model.bias, model.position_embedding) == ("gelu", "layernorm", "all",
                                                                                    "learned")
    assert model.vocab_size == 51200 and "catalog gpt3-175b" in note


def test_nemotron4_has_a_two_matrix_mlp_and_nemotron_h_is_skipped(llama_row) -> None:
    row = {**llama_row, "model": "Nemotron4-340B", "num_layers": "96", "hidden_size": "18432",
           "num_attention_heads": "96", "num_kv_heads": "8", "ffn_hidden_size": "73728", "vocab_size": "256000"}
    model, note = row_dense_model(row)
    assert (model.activation, model.norm, model.num_kv_heads) == ("gelu", "layernorm", 8) and "squared" in note
    # Nemotron-4 340B technical report: 9.4B embedding + 331.6B non-embedding parameters
    assert abs(total_params(model) / 341e9 - 1) < 0.01
    with pytest.raises(RowSkipped, match="Mamba"):
        row_case({**row, "model": "Nemotron-H-56B"})


@pytest.mark.parametrize(("pp", "vp", "layers"), [
    (16, 1, (4,) * 15 + (1,)), (4, 2, (16, 16, 16, 13)), (8, 2, (8,) * 7 + (5,)), (8, 4, None)])
def test_deepseek_rows_run_the_recipe_layout(qwen_row, pp, vp, layers) -> None:
    """Megatron-Bridge's DeepSeek-V3 recipe pins an explicit layout for the (pp, vp) its map has (the last stage
    holds the MTP module and the loss beside fewer decoder layers); other shapes run the even split."""
    dp = 1024 // (2 * pp)
    row = {**qwen_row, "model": "DeepSeek-V3", "num_layers": "61", "hidden_size": "7168", "num_attention_heads": "128",
           "num_kv_heads": "128", "num_experts": "256", "moe_top_k": "8", "num_gpus": "1024", "tp": "2", "pp": str(pp),
           "ep": "64", "etp": "1", "vp": str(vp), "micro_batch_size": "1", "global_batch_size": "8192",
           "dp_derived": str(dp)}
    case = moe_case(row)
    if layers is None:
        assert recipe_layout(row, case.model, pp, vp) is None and sum(case.plan.layers_per_stage) == 61
    else:
        assert (case.plan.layers_per_stage, case.plan.vpp, case.plan.vocab) == (layers, vp, "balanced")
    assert case.model.mtp_layers == 1 and case.job.moe_dispatcher == "deepep"
    # the recipe's selective recompute, or full where that does not fit this made-up row (RULES 'recompute')
    assert case.plan.recompute == "selective" or "recompute selective does not fit" in case.note


def test_linear_attention_hybrids_are_skipped(qwen_row) -> None:
    """Qwen3-Next's Gated DeltaNet layers are not a Transformer block autotune costs: skipped with the reason,
    not built from the shape columns as a plain MoE Transformer."""
    row = {**qwen_row, "model": "Qwen3-Next-80B-A3B", "num_layers": "48", "hidden_size": "2048",
           "num_attention_heads": "16", "num_kv_heads": "2", "num_experts": "512", "moe_top_k": "10",
           "moe_ffn_hidden_size": "512", "shared_experts": "1", "vocab_size": "151936"}
    with pytest.raises(RowSkipped, match="Gated DeltaNet"):
        row_moe_model(row)


def test_a_blank_recompute_that_does_not_fit_takes_the_least_that_does() -> None:
    """RULES 'recompute': GPT-OSS-120B's NeMo 25.11 row (mbs 4 on pp 4, no recompute in its recipe) needs 144 GiB
    as the rule gives it, and selective recompute keeps the MoE activations, so it ran with full recompute: it is
    evaluated so, and fits; its mbs-1 rows fit as the recipe gives them and stay as they are. A row that names its
    recompute is never changed (the rule fills only blanks)."""
    rows = {int(r["row_id"]): r for r in read_rows(PUBLIC_DATA)}
    case = moe_case(rows[519])
    assert case.plan.recompute == "full" and "recompute none does not fit (144.4 GiB)" in case.note
    assert moe_case(rows[520]).plan.recompute == "none" and "does not fit" not in moe_case(rows[520]).note
    named = {**rows[519], "activation_recompute": "none"}
    assert moe_case(named).plan.recompute == "none"


def test_the_expert_all_to_all_overlap_only_where_a_row_names_it() -> None:
    """RULES 'ep_overlap': Megatron-Bridge's recipes leave it off, so a row is costed with it only where its
    other_settings say so; with a layout megatron-core refuses it with (GPT-OSS's pp 4 on 1F1B), without it and a
    note. The rows as published name it nowhere: the report does not change."""
    rows = {int(r["row_id"]): r for r in read_rows(PUBLIC_DATA)}
    assert not moe_case(rows[520]).plan.ep_overlap
    named = {**rows[520], "other_settings": "moe_a2a_overlap=true", "vp": "2"}
    on, plain = moe_case(named), moe_case({**named, "other_settings": ""})
    assert on.plan.ep_overlap and not plain.plan.ep_overlap
    refused = moe_case({**named, "vp": ""})
    assert not refused.plan.ep_overlap and "evaluated without it" in refused.note
