"""The training job: batch, sequence, precision and which fused kernels the trainer uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.errors import SpecError

DTYPES = ("bf16", "fp16", "fp8")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """One optimizer step of mixed-precision Adam training."""

    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    dtype: Literal["bf16", "fp16", "fp8"] = "bf16"
    """Compute dtype of the matrix multiplies; activations stay 16-bit, master weights fp32."""
    flash_attention: bool = True
    """Fused attention (FlashAttention): no s x s score matrix in memory, causal half skipped."""
    fused_kernels: bool = True
    """Fused bias+activation, bias+dropout+residual and softmax kernels (paper 5's fusion)."""

    def __post_init__(self) -> None:
        if self.global_batch <= 0:
            raise SpecError(f"--global-batch must be > 0, got {self.global_batch}")
        if self.seq_len <= 0:
            raise SpecError(f"--seq-len must be > 0, got {self.seq_len}")
        if self.dtype not in DTYPES:
            raise SpecError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step."""
        return self.global_batch * self.seq_len


#: Bytes of state per parameter under mixed-precision Adam as Megatron-LM keeps it (docs of its
#: distributed optimizer): 16-bit weights, fp32 main gradients, fp32 master copy + Adam m and v.
WEIGHT_BYTES = 2
GRAD_BYTES = 4
OPTIMIZER_BYTES = 12
