"""`autotune models` and `autotune hardware`: the catalog as tables and as --json."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from autotune.costmodel.memory import active_params, total_params
from autotune.costmodel.mtp import mtp_total_params
from autotune.render.common import rounded
from autotune.specs.hardware import HardwareSpec
from autotune.specs.model import ModelSpec
from autotune.units import GB, TERA, gib


def models_json(models: Sequence[tuple[ModelSpec, Mapping[str, Any]]]) -> dict[str, Any]:
    """`models --json`: each catalog model's shape, parameter count and source."""
    return {"models": [{
        "name": m.name, "num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_heads": m.num_heads,
        "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim, "ffn_hidden_size": m.ffn_hidden_size,
        "vocab_size": m.vocab_size, "activation": m.activation, "norm": m.norm, "tied_embeddings": m.tied_embeddings,
        "bias": m.bias, "position_embedding": m.position_embedding,
        **({"rotary_fraction": m.rotary_fraction} if m.rotary_fraction < 1 else {}),
        **({"parallel_block": True} if m.parallel_block else {}),
        **({"catalog_name": m.catalog_name} if m.catalog_name else {}),
        "params_B": rounded(total_params(m) / 1e9), "published_params_B": raw.get("published_params_B"),
        **({"num_experts": m.num_experts, "moe_top_k": m.moe_top_k, "moe_ffn_hidden_size": m.moe_ffn_hidden_size,
            "num_shared_experts": m.num_shared_experts, "first_dense_layers": m.first_dense_layers,
            "moe_layer_freq": m.moe_layer_freq, "active_params_B": rounded(active_params(m) / 1e9),
            "active_params_B_without_input_embedding": rounded(active_params(m, input_embedding=False) / 1e9),
            "published_active_params_B": raw.get("published_active_params_B")} if m.is_moe else {}),
        **({"mtp_layers": m.mtp_layers, "mtp_params_B": rounded(mtp_total_params(m) / 1e9)} if m.mtp_layers else {}),
        "description": raw.get("description", ""), "source": m.source,
    } for m, raw in models]}


def models_table(models: Sequence[tuple[ModelSpec, Mapping[str, Any]]], *, readings: bool = False) -> Group:
    """The shapes as a table, then each model's source on lines of its own: a source is a sentence, and as a
    table column at a pipe's 120 characters it was cut to one letter. `readings`: each model's block as the cost
    model takes it too (reading_line), for the models a user names (a config.json's implicit keys)."""
    table = Table(title="Models (--model NAME, or a path to a config.json)", title_justify="left",
                  caption="params B (N act): all parameters, and the N billion one token passes through, input "
                          "embedding included (as Mistral and Qwen count; OpenAI's GPT-OSS card leaves it out: "
                          "--json gives both)", caption_justify="left")
    for col in ("name", "layers", "hidden", "heads/kv", "ffn", "vocab", "act", "experts", "params B"):
        table.add_column(col, justify="left" if col in ("name", "act") else "right", no_wrap=True)
    sources = Table.grid(padding=(0, 1))
    sources.add_column(no_wrap=True)
    sources.add_column(overflow="fold")
    for m, _ in models:
        table.add_row(m.name, str(m.num_layers), str(m.hidden_size), f"{m.num_heads}/{m.num_kv_heads}",
                      str(m.ffn_hidden_size), str(m.vocab_size), m.activation,
                      (f"{m.num_experts} top-{m.moe_top_k}" if m.is_moe else "-")
                      + (f", MTP {m.mtp_layers}" if m.mtp_layers else ""),
                      f"{total_params(m) / 1e9:.2f}" + (f" ({active_params(m) / 1e9:.1f} act)" if m.is_moe else ""))
        sources.add_row(f"{m.name}:", source_clause(m.source))
    parts = [table, Text(""), Text("Sources (--json has each in full):"), sources]
    if readings:
        read = Table.grid(padding=(0, 1))
        read.add_column(no_wrap=True)
        read.add_column(overflow="fold")
        for m, _ in models:
            read.add_row(f"{m.name}:", reading_line(m))
        parts += [Text(""), Text("Read as (what plan and estimate cost):"), read]
    return Group(*parts)


def reading_line(m: ModelSpec) -> str:
    """How a model's block is read, keys a config.json may leave implicit included."""
    gated = {"swiglu": "SwiGLU", "geglu": "GeGLU", "gelu": "plain GeLU"}[m.activation]
    window = (f", {m.sliding_window}-token {'chunks' if m.chunked_attention else 'window'} on "
              f"{m.sliding_window_layers or m.num_layers} layers" if m.sliding_window else "")
    twin = f", the catalog's {m.catalog_name} exactly" if m.catalog_name else ""
    return (f"{gated} MLP, {'LayerNorm' if m.norm == 'layernorm' else 'RMSNorm'}, biases {m.bias}, "
            f"{m.num_heads} query / {m.num_kv_heads} key-value heads of {m.head_dim}, "
            f"{position_label(m)}, "
            + ("attention beside the MLP (costed as in sequence), " if m.parallel_block else "") +
            f"{'tied' if m.tied_embeddings else 'untied'} embeddings{window}"
            + (", query/key norms" if m.qk_norm else "") + (f", MTP {m.mtp_layers}" if m.mtp_layers else "")
            + f"{twin}; {total_params(m) / 1e9:.2f}B parameters")


def position_label(m: ModelSpec) -> str:
    """The position encoding in words: RoPE (on the share of each head it rotates), learned, or ALiBi."""
    if m.position_embedding == "rope":
        return "RoPE" + (f" on {m.rotary_fraction:.0%} of each head" if m.rotary_fraction < 1 else "")
    return "ALiBi" if m.position_embedding == "alibi" else "learned positions"


def source_clause(source: str) -> str:
    """A source's first clause, which names the document (the rest details it): up to its first ';' outside
    parentheses, so a parenthesis the clause opens is closed."""
    depth = 0
    for i, char in enumerate(source):
        depth += (char == "(") - (char == ")")
        if char == ";" and depth <= 0:
            return source[:i].strip()
    return source.strip()


def hardware_json(gpus: Sequence[tuple[HardwareSpec, Mapping[str, Any]]]) -> dict[str, Any]:
    """`hardware --json`: figures in the hardware files' own units."""
    return {"hardware": [{
        "name": hw.name, "memory_GiB": rounded(gib(hw.memory_bytes)),
        "memory_reserve_GiB": rounded(gib(hw.memory_reserve_bytes)),
        "hbm_bandwidth_GBps": rounded(hw.hbm_bandwidth / GB), "bf16_TFLOPs": rounded(hw.peak_flops_bf16 / TERA),
        "fp16_TFLOPs": rounded(hw.peak_flops_fp16 / TERA), "fp8_TFLOPs": rounded(hw.peak_flops_fp8 / TERA),
        "gpus_per_node": hw.gpus_per_node, "intra_node_GBps": rounded(hw.intra_node_bandwidth / GB),
        "inter_node_GBps": rounded(hw.inter_node_bandwidth / GB), "description": raw.get("description", ""),
        **({"sources": raw["sources"]} if isinstance(raw.get("sources"), Mapping) else {}),  # optional in a file
    } for hw, raw in gpus]}


def hardware_table(gpus: Sequence[tuple[HardwareSpec, Mapping[str, Any]]]) -> Table:
    table = Table(title="Hardware (--gpu NAME, or a path to a hardware file)", title_justify="left")
    for col in ("name", "memory GiB", "reserve", "HBM GB/s", "bf16 TFLOP/s", "fp8 TFLOP/s", "GPUs/node",
                "intra GB/s", "inter GB/s"):
        table.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for hw, _ in gpus:
        fp8 = f"{hw.peak_flops_fp8 / TERA:g}" if hw.peak_flops_fp8 > 0 else "-"
        table.add_row(hw.name, f"{gib(hw.memory_bytes):g}", f"{gib(hw.memory_reserve_bytes):g}",
                      f"{hw.hbm_bandwidth / GB:g}", f"{hw.peak_flops_bf16 / TERA:g}", fp8, str(hw.gpus_per_node),
                      f"{hw.intra_node_bandwidth / GB:g}", f"{hw.inter_node_bandwidth / GB:g}")
    return table
