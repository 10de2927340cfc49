"""``public``: the model of a published row (RULES 'moe' and 'model'). A row names its model in its source's own
words ("DeepSeekV3", "Qwen3_235B_a22b", "GPT OSS 120B"), so the name is matched to the catalog on its letters and
digits alone; a catalog model run at another depth keeps its architecture at the row's depth; a model the catalog
lacks is built from the row's shape columns."""

from __future__ import annotations

import re
from dataclasses import replace

from autotune.catalog import load_model, model_names
from autotune.specs.model import ModelSpec


class RowSkipped(Exception):
    """A public row the cost model cannot represent; the message is the reason the report prints."""


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def catalog_match(name: str, moe: bool = True) -> str | None:
    """The catalog model (MoE, or dense) the row's name means: the longest catalog name whose letters and
    digits start the row's ("Llama4-Maverick-17B-128E-Instruct" -> llama4-maverick), else None."""
    key = _key(name)
    best: tuple[int, str] | None = None
    for entry in model_names():
        other = _key(entry)
        if key.startswith(other) and (best is None or len(other) > best[0]) and load_model(entry).is_moe == moe:
            best = (len(other), entry)
    return None if best is None else best[1]


def column_int(row: dict[str, str], key: str, default: int | None = None) -> int:
    """An integer column (`default` when blank; RowSkipped when blank without one, or not an integer)."""
    text = row.get(key, "").strip()
    if not text:
        if default is None:
            raise RowSkipped(f"{key} is not published")
        return default
    try:
        return int(text)
    except ValueError:
        raise RowSkipped(f"{key} {text!r} is not an integer") from None


def at_depth(model: ModelSpec, num_layers: int) -> ModelSpec:
    """The catalog model with `num_layers` blocks (a reduced-depth proxy run), its dense-first layers kept when
    they leave an MoE layer."""
    dense = model.first_dense_layers if model.first_dense_layers < num_layers else 0
    return replace(model, name=f"{model.name} at {num_layers} layers", num_layers=num_layers,
                   first_dense_layers=dense)


def from_columns(row: dict[str, str]) -> ModelSpec:
    """A model the catalog lacks, from the row's shape columns: Llama-style attention (head_dim = hidden/heads,
    no bias), SwiGLU experts of moe_ffn_hidden_size, shared experts of the same width, every layer MoE, softmax
    router, untied embeddings."""
    hidden, heads = column_int(row, "hidden_size"), column_int(row, "num_attention_heads")
    kv = column_int(row, "num_kv_heads", heads)
    if hidden % heads or heads % kv:
        raise RowSkipped(f"hidden {hidden}, heads {heads}, kv heads {kv} is not a grouped-query attention shape")
    experts, top_k = column_int(row, "num_experts"), column_int(row, "moe_top_k")
    width, shared = column_int(row, "moe_ffn_hidden_size"), column_int(row, "shared_experts", 0)
    if not 0 < top_k <= experts:
        raise RowSkipped(f"moe_top_k {top_k} is not within 1..num_experts {experts}")
    return ModelSpec(name=row["model"].strip(), num_layers=column_int(row, "num_layers"), hidden_size=hidden,
                     num_heads=heads, num_kv_heads=kv, head_dim=hidden // heads,
                     ffn_hidden_size=column_int(row, "ffn_hidden_size", width), vocab_size=column_int(row, "vocab_size"),
                     activation="swiglu", norm="rmsnorm", tied_embeddings=False, num_experts=experts,
                     moe_top_k=top_k, moe_ffn_hidden_size=width, num_shared_experts=shared,
                     shared_expert_ffn_hidden_size=width if shared else 0,
                     source="shape columns of a published MoE run (no catalog entry)")


def row_moe_model(row: dict[str, str]) -> tuple[ModelSpec, str]:
    """RULES 'moe': the row's model and a note ('' when the catalog model is taken as it is)."""
    if any(_key(row["model"]).startswith(k) for k in HYBRID_MOE):
        raise RowSkipped(f"{row['model'].strip()} mixes linear-attention (Gated DeltaNet) layers into its "
                         "Transformer, which autotune does not cost")
    name = catalog_match(row["model"])
    if name is None:
        return from_columns(row), (f"no catalog model is named like {row['model'].strip()!r}: built from the "
                                   "shape columns")
    model = load_model(name)
    for column, value in (("hidden_size", model.hidden_size), ("num_experts", model.num_experts),
                          ("moe_top_k", model.moe_top_k)):
        if column_int(row, column, value) != value:
            return from_columns(row), (f"{column} {row[column].strip()} differs from catalog {name}'s {value}: "
                                       "built from the shape columns")
    layers = column_int(row, "num_layers", model.num_layers)
    if layers != model.num_layers:
        return at_depth(model, layers), f"catalog {name} at the row's {layers} layers (of {model.num_layers})"
    return model, ""


#: Dense families whose MLP is not SwiGLU, by the letters of their name: Nemotron-4's squared ReLU (two
#: matrices and one element-wise op, costed as GeLU's; Nemotron-4 technical reports, arXiv 2402.16819 and
#: 2406.11704: squared ReLU, RoPE, no bias, untied embeddings, grouped-query attention, LayerNorm).
TWO_MATRIX_MLP = ("nemotron4", "nemotron")
#: Families that are not Transformers autotune costs: Nemotron-H's Mamba-2 hybrid layers.
NOT_TRANSFORMERS = ("nemotronh",)
#: MoE families with linear-attention layers: Qwen3-Next (Qwen's model card for Qwen3-Next-80B-A3B: three
#: Gated DeltaNet layers to one gated-attention layer).
HYBRID_MOE = ("qwen3next",)


def row_dense_model(row: dict[str, str], llama: ModelSpec) -> tuple[ModelSpec, str]:
    """RULES 'model': `llama` (the row's shape columns as a Llama-family model) unless the name says otherwise:
    a dense catalog model other than Llama of the row's hidden size and heads (GPT-3: GeLU, LayerNorm, biases,
    learned positions) at the row's depth and vocabulary; Nemotron-4's two-matrix MLP and LayerNorm."""
    key = _key(row["model"])
    if any(key.startswith(k) for k in NOT_TRANSFORMERS):
        raise RowSkipped(f"{row['model'].strip()} is a hybrid Mamba-Transformer, which autotune does not cost")
    name = catalog_match(row["model"], moe=False)
    if name and not name.startswith("llama"):
        model = load_model(name)
        if (model.hidden_size, model.num_heads) == (llama.hidden_size, llama.num_heads):
            model = at_depth(model, llama.num_layers) if model.num_layers != llama.num_layers else model
            note = f"catalog {name}'s architecture"
            if model.ffn_hidden_size != llama.ffn_hidden_size or model.vocab_size != llama.vocab_size:
                model = replace(model, ffn_hidden_size=llama.ffn_hidden_size, vocab_size=llama.vocab_size)
                note += " with the row's MLP width and vocabulary"
            return model, note
    if any(key.startswith(k) for k in TWO_MATRIX_MLP):
        return (replace(llama, activation="gelu", norm="layernorm"),
                "Nemotron-4: squared-ReLU MLP (two matrices, costed as GeLU) and LayerNorm")
    return llama, ""
