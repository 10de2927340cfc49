"""Measured operator times from a profile, in place of the roofline where the profile covers the op.

An op's time is read off the points measured for the same op name at the same tp, interpolated over the op's work
(FLOPs for GEMM and attention kernels, bytes for memory-bound ones) linearly in log-log space, where kernel time is
close to a power law of size. Attention ops (category "attention": fused attention, its backward and ring
attention's correction kernels) are read only from points measured at the plan's context-parallel degree, since
under cp > 1 the same FLOPs run as cp ring steps of other shapes (`autotune profile --cp`); every other op depends
only on its token count, so its points serve every cp (a profile without cp entries is cp 1). Outside the measured
range, for an unmeasured name or tp, the answer is None and the caller charges the roofline: extrapolating a
kernel's time past what was timed is what the roofline model is for. Lookups are memoized; the planner asks for the
same few shapes thousands of times.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from difflib import get_close_matches
from functools import partial

import numpy as np

from autotune.costmodel.ops import (LayerShape, Op, backward_ops, embedding_backward_ops, embedding_forward_ops,
                                    head_backward_ops, head_forward_ops, layer_forward_ops)
from autotune.errors import SpecError
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import ATTENTION_NAMES
from autotune.specs.model import ModelSpec
from autotune.specs.profile import Profile
from autotune.units import from_gbps, from_us

Lookup = Callable[[Op], "float | None"]


@dataclass(frozen=True, slots=True)
class OpCoverage:
    """How many of a plan's ops a profile timed, and which fell back to the roofline."""

    source: str
    """The profile file, or "roofline" when there is none."""
    device: str
    measured: int
    total: int
    fallback: tuple[str, ...]
    """Names charged by the roofline although a profile is in use (sorted, unique)."""

    def as_dict(self) -> dict[str, object]:
        return {"source": self.source, "device": self.device, "measured_ops": self.measured,
                "roofline_ops": self.total - self.measured, "fallback": list(self.fallback)}

    def line(self) -> str:
        if self.source == "roofline":
            return f"op times: roofline for all {self.total} ops (no profile; see `autotune profile`)"
        rest = f"; roofline for the rest: {', '.join(self.fallback)}" if self.fallback else ""
        return f"op times: {self.measured} of {self.total} measured (profile {self.source}, device {self.device}){rest}"


def _work(op: Op) -> float:
    """What an op's time scales with: arithmetic for GEMM and attention kernels, traffic for the others."""
    return op.bytes if op.kernel == "memory" else op.flops


def _cp_key(op: Op, cp: int) -> int:
    """The cp whose points time `op`: its own for attention ops, 0 (any) for ops that see only tokens."""
    return cp if op.category == "attention" else 0


class MeasuredOps:
    """Seconds of an Op at a (tp, cp), interpolated from a profile's points; None where the profile cannot say."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._points: dict[tuple[str, int], list[tuple[int, float, float, float]]] = {}
        for p in profile.ops:
            self._points.setdefault((p.op, p.tp), []).append((p.cp, p.flops, p.bytes, p.seconds))
        self._tables: dict[tuple[str, int, int, str], tuple[np.ndarray, np.ndarray] | None] = {}
        self._memo: dict[tuple[str, int, int, str, float], float | None] = {}
        self.hits = 0
        """Lookups answered from the profile (memoized repeats not counted)."""
        self.misses = 0
        """Lookups left to the roofline."""

    def lookup(self, tp: int, cp: int = 1) -> Lookup:
        """The lookup for ops of one (tp, cp), as compute.pass_time takes it."""
        return partial(self.seconds, tp=tp, cp=cp)

    def seconds(self, op: Op, tp: int, cp: int = 1) -> float | None:
        key = (op.name, tp, _cp_key(op, cp), op.kernel, _work(op))
        if key not in self._memo:
            self._memo[key] = value = self._interpolate(op, tp, key[2])
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
        return self._memo[key]

    def _table(self, name: str, tp: int, cp: int, kernel: str) -> tuple[np.ndarray, np.ndarray] | None:
        """log(work) ascending and log(seconds) of the points at `cp` (0: at every cp); equal work measured
        twice (e.g. with and without sequence parallelism) is averaged."""
        key = (name, tp, cp, kernel)
        if key not in self._tables:
            by_work: dict[float, list[float]] = {}
            for at_cp, flops, nbytes, seconds in self._points.get((name, tp), ()):
                if cp and at_cp != cp:
                    continue
                work = nbytes if kernel == "memory" else flops
                if work > 0:
                    by_work.setdefault(work, []).append(seconds)
            works = sorted(by_work)
            self._tables[key] = None if not works else (
                np.log(np.array(works)), np.log(np.array([sum(by_work[w]) / len(by_work[w]) for w in works])))
        return self._tables[key]

    def _interpolate(self, op: Op, tp: int, cp: int) -> float | None:
        table, work = self._table(op.name, tp, cp, op.kernel), _work(op)
        if table is None or work <= 0:
            return None
        xs, ys = table
        x = math.log(work)
        # a hair of tolerance: the same shape recomputed in floating point must hit its own point
        if x < xs[0] - 1e-9 or x > xs[-1] + 1e-9:
            return None
        return float(math.exp(np.interp(x, xs, ys)))

    def coverage(self, ops: tuple[Op, ...], tp: int, cp: int = 1) -> OpCoverage:
        """Which of `ops` (all of one tp and cp) this profile times."""
        missed = [op.name for op in ops if self.seconds(op, tp, cp) is None]
        return OpCoverage(source=self.profile.path, device=self.profile.device.name, measured=len(ops) - len(missed),
                          total=len(ops), fallback=tuple(sorted(set(missed))))


def roofline_coverage(ops: tuple[Op, ...]) -> OpCoverage:
    return OpCoverage(source="roofline", device="", measured=0, total=len(ops), fallback=())


def step_ops(model: ModelSpec, shape: LayerShape) -> tuple[Op, ...]:
    """Every op kind a step runs at one shape: one layer forward and backward, embedding and head."""
    fwd = layer_forward_ops(model, shape)
    return (fwd + backward_ops(fwd, model, shape) + embedding_forward_ops(model, shape)
            + embedding_backward_ops(model, shape) + head_forward_ops(model, shape) + head_backward_ops(model, shape))


def op_names(model: ModelSpec, seq_len: int = 0) -> frozenset[str]:
    """Every op name the cost model can ask a profile for with `model`: the step's ops (and the MTP modules')
    under each kernel choice (flash or unfused attention, fused or eager element-wise ops, FP8 casts), with and
    without tensor, sequence and context parallelism, dense and MoE layers, and both MoE dispatchers. The
    names depend on these choices and on the model only (a sliding window on whether it is shorter than the
    sequence: both sides are taken)."""
    from itertools import product

    from autotune.costmodel.mtp import mtp_backward_ops, mtp_forward_ops  # mtp.py builds on layer.py

    window = model.sliding_window
    seqs = {max(seq_len, 8), 2 * window + 8} if window else {max(seq_len, 8)}
    names: set[str] = set()
    for seq, flash, fused, fp8, (tp, sp, cp), (ep, etp, dispatcher) in product(
            seqs, (True, False), (True, False), (False, True), ((1, False, 1), (2, True, 2), (2, False, 1)),
            ((1, 1, "alltoall"), (2, 2, "alltoall"), (2, 2, "deepep"))):
        shape = LayerShape(tokens=seq // cp, kv_tokens=seq, mbs=1, tp=tp, sp=sp, elem=2, flash=flash, fused=fused,
                           fp8=fp8, ep=ep, etp=etp, dispatcher=dispatcher)
        for moe in {model.is_moe, False}:
            fwd = layer_forward_ops(model, shape, moe)
            names.update(op.name for op in fwd + backward_ops(fwd, model, shape))
        names.update(op.name for op in step_ops(model, shape))
        if model.mtp_layers:
            names.update(op.name for op in mtp_forward_ops(model, shape) + mtp_backward_ops(model, shape))
    return frozenset(names)


def check_profile_model(profile: Profile, model: ModelSpec) -> None:
    """A profile times one model's shapes; using it for another would be silently wrong, and one that measured
    nothing at all (no ops, no comm tiers) would silently be the roofline."""
    if profile.model is not None and profile.model not in (model.name, model.known_as):  # a config.json that is
        # the catalog model exactly (catalog_name) has its shapes
        raise SpecError(f"--profile {profile.path} was measured for model {profile.model!r}, not {model.name!r}; "
                        f"measure this model with `autotune profile --model {model.name} --out FILE`")
    if not profile.ops and not profile.comm:
        raise SpecError(f"--profile {profile.path}: the profile has no ops (and no comm tiers), so it measures "
                        f"nothing: run `autotune profile --model {model.name} --out {profile.path}` (or `autotune "
                        "profile --comm`), or leave out --profile")


def check_profile_ops(profile: Profile, model: ModelSpec) -> None:
    """Every op the profile timed is one the cost model asks for with `model`: a misspelt or hand-edited name
    would never be read, and its ops would silently cost by the roofline. (Once per command: op_names builds
    the step's ops under every kernel choice.)"""
    if not profile.ops:
        return
    known = op_names(model, profile.seq_len or 0)
    for i, point in enumerate(profile.ops):
        if point.op not in known:
            near = get_close_matches(point.op, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise SpecError(f"--profile {profile.path}: ops[{i}].op: {point.op!r} is not an op the cost model times "
                            f"for {model.name}; {hint}fix or remove it (known ops: {', '.join(sorted(known))})")
    for i, label in enumerate(profile.not_timed):
        if label.split()[0] not in known:
            raise SpecError(f"--profile {profile.path}: not_timed[{i}]: {label!r} does not name an op the cost model "
                            f"times for {model.name}; fix or remove it")


def profile_warnings(profile: Profile, hw: HardwareSpec, dtype: str, attention: str | None = None
                     ) -> tuple[str, ...]:
    """Mismatches worth a warning, not an error (a CPU profile on a GPU plan is how the tests run); `attention`:
    the job's attention kernel (JobSpec.runs_attention), None for unfused attention."""
    out = []
    timed = profile.attention_backend
    if timed and attention and timed != attention and any(p.op.startswith("flash_attention") for p in profile.ops):
        out.append(f"--profile {profile.path} timed attention with {ATTENTION_NAMES[timed]}, the job runs "
                   f"{ATTENTION_NAMES[attention]}: its attention is costed as measured (time it with `autotune "
                   f"profile --attention-backend {attention}`)")
    device = profile.device.name.lower()
    if profile.ops and (profile.device.kind == "cpu" or hw.name.split("-")[0].lower() not in device):
        out.append(f"--profile {profile.path}: measured on {profile.device.kind} {profile.device.name!r}, but the "
                   f"plan is for {hw.name}; measured op times are used as they are")
    if profile.dtype is not None and profile.dtype != dtype:
        out.append(f"--profile {profile.path}: measured in {profile.dtype}, but the job uses --dtype {dtype}")
    return tuple(out)


def apply_comm(profile: Profile, hw: HardwareSpec) -> HardwareSpec:
    """The hardware with the link tiers the profile measured replaced by the fitted alpha and beta (which are
    achieved figures, so that tier's efficiency becomes 1)."""
    for tier, fit in profile.comm.items():
        hw = replace(hw, **{f"{tier}_bandwidth": from_gbps(fit.bandwidth_GBps), f"{tier}_latency": from_us(fit.alpha_us)},
                     efficiency=replace(hw.efficiency, **{f"{tier}_comm": 1.0}))
    return hw
