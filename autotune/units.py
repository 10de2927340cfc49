"""The one module that owns units.

Inside autotune every quantity is SI: seconds, bytes, FLOP, FLOP/s, bytes/s. Data files carry the unit
in the key (``hbm_GiB``, ``nvlink_GBps``, ``bf16_TFLOPs``); these helpers convert at the boundary.
The integer scaling used by the CP-SAT model lives here too, so the solver and the reports agree.
"""

from __future__ import annotations

GiB = 1024**3
GB = 10**9
TERA = 10**12
US = 1e-6

#: Bytes per activation element: activations and what collectives move stay 16-bit, fp8 GEMMs included.
ACTIVATION_BYTES = 2
#: Bytes of an fp32 value (softmax statistics, logits kept for the loss).
FP32_BYTES = 4

#: CP-SAT works on integers: one time unit is this many seconds (1 ns: rounding stays far below any
#: difference between plans worth reporting, and a 100 s step times 10^4 micro-batches still fits in int64).
SOLVER_TIME_UNIT_S = 1e-9


def gib(n_bytes: float) -> float:
    """Bytes to GiB (for display)."""
    return n_bytes / GiB


def from_gib(value: float) -> int:
    """GiB to whole bytes."""
    return int(round(value * GiB))


def from_gbps(value: float) -> float:
    """GB/s (decimal, as datasheets print it) to bytes/s."""
    return value * GB


def from_tflops(value: float) -> float:
    """TFLOP/s to FLOP/s."""
    return value * TERA


def from_us(value: float) -> float:
    """Microseconds to seconds."""
    return value * US


def to_solver_time(seconds: float) -> int:
    """Seconds to the solver's integer time unit, rounded to nearest."""
    return int(round(seconds / SOLVER_TIME_UNIT_S))


def whole_bytes(nbytes: float) -> int:
    """Round a byte count up to whole bytes, so that integer memory checks never under-count."""
    return int(-(-nbytes // 1))
