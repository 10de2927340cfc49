"""Small specs the cost-model tests build by hand (round numbers, so hand arithmetic stays exact)."""

from __future__ import annotations

from dataclasses import replace

from autotune.catalog import load_hardware
from autotune.specs.hardware import Efficiency, HardwareSpec
from autotune.specs.model import ModelSpec


def gpt_model(*, hidden: int = 1024, heads: int = 16, layers: int = 4, vocab: int = 51200,
              **overrides) -> ModelSpec:
    """A GPT block as Korthikanti et al. 2022 and Narayanan et al. 2021 analyse it: MHA, FFN 4h, GeLU,
    LayerNorm, biases, dropout, tied embeddings, learned positions."""
    spec = ModelSpec(name="gpt-test", num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=heads,
                     head_dim=hidden // heads, ffn_hidden_size=4 * hidden, vocab_size=vocab, activation="gelu",
                     norm="layernorm", tied_embeddings=True, bias="all", dropout=True, causal=True,
                     position_embedding="learned", max_position_embeddings=2048)
    return replace(spec, **overrides)


def toy_hardware(**overrides) -> HardwareSpec:
    """Round-number hardware: 100 TFLOP/s, 1 TB/s HBM, 100 GB/s NVLink, 10 GB/s network, 8 GPUs a node."""
    hw = HardwareSpec(name="toy", memory_bytes=80 * 2**30, memory_reserve_bytes=4 * 2**30, hbm_bandwidth=1e12,
                      peak_flops_bf16=1e14, peak_flops_fp16=1e14, peak_flops_fp8=0.0, gpus_per_node=8,
                      intra_node_bandwidth=1e11, intra_node_latency=2e-6, inter_node_bandwidth=1e10,
                      inter_node_latency=10e-6,
                      efficiency=Efficiency(gemm=0.5, attention=0.4, memory=0.8, intra_node_comm=0.9,
                                            inter_node_comm=0.7))
    return replace(hw, **overrides)


def a100() -> HardwareSpec:
    return load_hardware("a100-80gb")
