"""On what it is trained: one GPU type, its node, and the network between nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.errors import SpecError
from autotune.specs._strict import check_keys, fraction, nonneg_float, positive_float, positive_int
from autotune.specs.limits import ARCHITECTURE_PATTERN, check_name
from autotune.units import from_gbps, from_gib, from_tflops, from_us


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    """Fractions of a datasheet peak that real kernels reach. They live in data files, never in code."""

    gemm: float
    """Large bf16/fp16 matrix multiplies, fraction of the dense tensor-core peak."""
    attention: float
    """Fused (flash) attention kernels, fraction of the dense tensor-core peak."""
    memory: float
    """Memory-bound kernels (norms, element-wise, softmax), fraction of HBM bandwidth."""
    intra_node_comm: float
    """NCCL bus bandwidth inside a node, fraction of the per-direction link bandwidth."""
    inter_node_comm: float
    """NCCL bus bandwidth across nodes, fraction of the per-GPU network bandwidth."""
    gemm_fp8: float = 0.0
    """FP8 GEMMs, fraction of the dense FP8 peak; 0 = same as `gemm`."""
    attention_sdpa: float = 0.0
    """PyTorch SDPA's flash kernel (FlashAttention-2, torchtitan and DeepSpeed), forward at long sequences;
    0 = same as `attention` (which is Transformer Engine's cuDNN fused attention, Megatron's)."""
    attention_bwd_ratio: float = 1.0
    """Backward attention speed over forward speed (FLOP/s), both kernels."""
    gemm_torch: float = 0.0
    """bf16/fp16 GEMMs through PyTorch's default BLAS (cuBLAS; torchtitan, DeepSpeed), fraction of the dense peak;
    0 = same as `gemm` (which is cuBLASLt, what Transformer Engine calls)."""
    memory_torch: float = 0.0
    """Memory-bound kernels written by PyTorch (eager ATen, or Triton from torch.compile), fraction of HBM
    bandwidth; 0 = same as `memory` (which is Transformer Engine's fused kernels)."""
    gemm_k0: float = 0.0
    """A GEMM's fixed cost per output tile, in elements of its inner dimension k: it runs at k/(k + gemm_k0)
    of its ceiling (each tile fills and drains its k-loop pipeline and writes its output once); 0 = none."""
    gemm_fill: float = 0.0
    """Parallel work, in multiples of the SM count, at which a GEMM reaches half its ceiling (costmodel/compute.py
    gemm_shape_efficiency: split-K/stream-K kernels); 0 = fixed-tile wave quantization instead."""
    gemm_fp8_k0: float = 0.0
    """The same for FP8 GEMMs (their k-loop is twice as fast, so a fixed cost spans more k); 0 = gemm_k0."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSpec:
    """A GPU and its interconnect, in SI units (bytes, seconds, FLOP/s, bytes/s)."""

    name: str
    """Catalog name or file path."""
    memory_bytes: int
    """HBM capacity per GPU."""
    memory_reserve_bytes: int
    """Memory no plan may use: CUDA context, NCCL buffers, allocator fragmentation."""
    hbm_bandwidth: float
    """Peak HBM bandwidth, bytes/s."""
    peak_flops_bf16: float
    """Dense BF16 tensor-core peak, FLOP/s."""
    peak_flops_fp16: float
    """Dense FP16 tensor-core peak, FLOP/s."""
    peak_flops_fp8: float
    """Dense FP8 tensor-core peak, FLOP/s (0 when the GPU has no FP8)."""
    gpus_per_node: int
    """GPUs sharing the intra-node fabric (NVLink/NVSwitch, Infinity Fabric)."""
    intra_node_bandwidth: float
    """Per-GPU, per-direction intra-node link bandwidth, bytes/s."""
    intra_node_latency: float
    """Latency (alpha) of one collective step inside a node, seconds."""
    inter_node_bandwidth: float
    """Per-GPU, per-direction network bandwidth across nodes, bytes/s."""
    inter_node_latency: float
    """Latency (alpha) of one collective step across nodes, seconds."""
    efficiency: Efficiency
    """Achieved fractions of the peaks above."""
    nics_per_node: int = 0
    """Network ports per node, each of inter_node_bandwidth; 0 = one per GPU (DGX H100, DGX A100)."""
    intra_node_mesh_links: int = 0
    """Point-to-point links per GPU where the node is a full mesh (MI300X: 7, one per peer), whose bandwidth
    intra_node_bandwidth sums; 0 = a switch (NVSwitch), where any group gets the whole of it."""
    sm_count: int = 0
    """Streaming multiprocessors: GEMM output tiles run in waves of this many; 0 = no wave quantization."""
    kernel_overhead_s: float = 0.0
    """Fixed time of every kernel besides its work: launch gap, ramp-up and tail, seconds."""
    compute_capability: str = ""
    """NVIDIA's compute capability ("9.0" for Hopper), or the vendor's architecture name ("gfx942");
    "" = not given. Decides which kernels exist for the GPU (DeepEP, costmodel/moe.py)."""

    def dtype_warnings(self, dtype: str) -> tuple[str, ...]:
        """Why a `dtype` job's costed speed is not what this GPU runs (none where it is): NVIDIA GPUs have bf16 tensor
        cores from Ampere (compute capability 8.0); before it the file's bf16 figure is the fp16 one, where PyTorch
        emulates bf16 matrix multiplies and Transformer Engine does not run."""
        major = self.compute_capability.split(".")[0]
        if dtype == "bf16" and major.isdigit() and int(major) < 8:
            return (f"bf16 on {self.name} (compute capability {self.compute_capability}, no bf16 tensor cores) is "
                    "costed at the fp16 speed, which bf16 does not reach there (PyTorch emulates its matrix "
                    "multiplies, Transformer Engine refuses it); train in fp16 (--dtype fp16)",)
        return ()

    def kernel_warnings(self, dtype: str, flash_attention: bool) -> tuple[str, ...]:
        """dtype_warnings, and with flash attention on a GPU before Ampere (compute capability 8.0), which neither
        FlashAttention-2 nor Transformer Engine's fused attention supports, that its costed attention is not what
        runs there (Megatron runs unfused attention with a fused softmax)."""
        major = self.compute_capability.split(".")[0]
        if not (flash_attention and major.isdigit() and int(major) < 8):
            return self.dtype_warnings(dtype)
        return (*self.dtype_warnings(dtype), f"flash attention on {self.name} (compute capability "
                f"{self.compute_capability}; FlashAttention-2 and Transformer Engine's fused attention need 8.0) is "
                "costed as if it ran there; cost the unfused attention that runs with --no-flash-attention")

    @property
    def nic_share(self) -> float:
        """Network ports per GPU: 1 on nodes with a NIC per GPU, 0.5 on a stock DGX-1 (4 ports, 8 GPUs)."""
        return min(1.0, (self.nics_per_node or self.gpus_per_node) / self.gpus_per_node)

    @property
    def usable_memory_bytes(self) -> int:
        """What a plan may fill: capacity minus the documented reserve."""
        return self.memory_bytes - self.memory_reserve_bytes

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor-core peak for a training dtype."""
        peak = {"bf16": self.peak_flops_bf16, "fp16": self.peak_flops_fp16, "fp8": self.peak_flops_fp8}[dtype]
        if peak <= 0:
            instead = "fp16" if self.dtype_warnings("bf16") else "bf16"
            raise SpecError(f"--dtype {dtype}: {self.name} has no {dtype} tensor cores; use {instead}")
        return peak


_FIGURES = ("memory_GiB", "memory_reserve_GiB", "hbm_bandwidth_GBps", "bf16_TFLOPs", "fp16_TFLOPs", "fp8_TFLOPs",
            "gpus_per_node", "intra_node_GBps", "intra_node_latency_us", "inter_node_GBps", "inter_node_latency_us",
            "efficiency")
_OPTIONAL_FIGURES = ("nics_per_node", "sm_count", "kernel_overhead_us", "compute_capability", "intra_node_mesh_links")
_EFFICIENCY_KEYS = ("gemm", "attention", "memory", "intra_node_comm", "inter_node_comm")
_EFFICIENCY_OPTIONAL = ("gemm_fp8", "attention_sdpa", "attention_bwd_ratio", "memory_torch",
                        "gemm_torch")
_EFFICIENCY_ELEMENTS = ("gemm_k0", "gemm_fp8_k0", "gemm_fill")


#: The hardware file format this autotune reads (a file may leave "schema" out).
HARDWARE_SCHEMA = "autotune.hardware/1"


def hardware_from_dict(data: dict[str, Any], where: str) -> HardwareSpec:
    """Build a HardwareSpec from a hardware file. ``sources`` (where each figure comes from) is optional, so a
    hand-written file of a few figures loads; the catalog's files all carry it, and it is shown when present."""
    check_keys(data, required=("name", *_FIGURES),
               optional=("schema", "description", "sources", *_OPTIONAL_FIGURES),
               where=where)
    if "schema" in data and data["schema"] != HARDWARE_SCHEMA:
        raise SpecError(f"{where}: schema {data['schema']!r} is not a version this autotune reads ({HARDWARE_SCHEMA}); "
                        "write the file in that format (see `autotune hardware`)")
    if "sources" in data:
        _check_sources(data, where)
    eff_where = f"{where}: efficiency"
    eff = data["efficiency"]
    check_keys(eff, required=_EFFICIENCY_KEYS, optional=_EFFICIENCY_OPTIONAL + _EFFICIENCY_ELEMENTS,
               where=eff_where)
    reserve = nonneg_float(data, "memory_reserve_GiB", where)
    memory = positive_float(data, "memory_GiB", where)
    if reserve >= memory:
        raise SpecError(f"{where}: memory_reserve_GiB {reserve} must be below memory_GiB {memory}")
    return HardwareSpec(
        name=check_name(data["name"], "name", where),
        memory_bytes=from_gib(memory),
        memory_reserve_bytes=from_gib(reserve),
        hbm_bandwidth=from_gbps(positive_float(data, "hbm_bandwidth_GBps", where)),
        peak_flops_bf16=from_tflops(positive_float(data, "bf16_TFLOPs", where)),
        peak_flops_fp16=from_tflops(positive_float(data, "fp16_TFLOPs", where)),
        peak_flops_fp8=from_tflops(nonneg_float(data, "fp8_TFLOPs", where)),
        gpus_per_node=positive_int(data, "gpus_per_node", where),
        intra_node_bandwidth=from_gbps(positive_float(data, "intra_node_GBps", where)),
        intra_node_latency=from_us(positive_float(data, "intra_node_latency_us", where)),
        inter_node_bandwidth=from_gbps(positive_float(data, "inter_node_GBps", where)),
        inter_node_latency=from_us(positive_float(data, "inter_node_latency_us", where)),
        efficiency=Efficiency(**{k: fraction(eff, k, eff_where) for k in _EFFICIENCY_KEYS + _EFFICIENCY_OPTIONAL
                                 if k in eff},
                              **{k: nonneg_float(eff, k, eff_where) for k in _EFFICIENCY_ELEMENTS if k in eff}),
        nics_per_node=positive_int(data, "nics_per_node", where) if "nics_per_node" in data else 0,
        intra_node_mesh_links=positive_int(data, "intra_node_mesh_links", where)
        if "intra_node_mesh_links" in data else 0,
        sm_count=positive_int(data, "sm_count", where) if "sm_count" in data else 0,
        kernel_overhead_s=from_us(nonneg_float(data, "kernel_overhead_us", where)) if "kernel_overhead_us" in data
        else 0.0,
        compute_capability=_architecture(data, where),
    )


def _architecture(data: dict[str, Any], where: str) -> str:
    value = data.get("compute_capability", "")
    if not isinstance(value, str) or (value and not ARCHITECTURE_PATTERN.fullmatch(value)):
        raise SpecError(f"{where}: compute_capability must be text such as \"9.0\" (NVIDIA) or \"gfx942\" (AMD), "
                        f"got {value!r}")
    return value


def _check_sources(data: dict[str, Any], where: str) -> None:
    """A ``sources`` block maps figure keys of this file to non-empty text (datasheet, paper, measured,
    calibrated); a figure may go without one, but a key that is not a figure of the file is a typo."""
    sources = data["sources"]
    if not isinstance(sources, dict):
        raise SpecError(f"{where}: sources must map each figure key to its source")
    figures = set(_FIGURES) | {k for k in _OPTIONAL_FIGURES if k in data}
    unknown = sorted(k for k in sources if k not in figures)
    if unknown:
        raise SpecError(f"{where}: sources names {', '.join(map(str, unknown))}, not a figure of this file; allowed: "
                        f"{', '.join(sorted(figures))}")
    empty = sorted(k for k, v in sources.items() if not isinstance(v, str) or not v.strip())
    if empty:
        raise SpecError(f"{where}: sources.{empty[0]} must be text naming the datasheet, paper or measurement")
