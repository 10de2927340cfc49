"""Timing the cost model's operators with torch on this machine's device (`autotune profile`).

The ops are exactly those the cost model charges (costmodel/measured.py's step_ops: one layer forward and backward,
embedding and head) at each requested tp, context-parallel degree and micro-batch size, with and without sequence
parallelism for tp > 1; each distinct (name, tp, FLOPs, bytes) is timed once, an attention op once per cp as well
(under cp > 1 the same FLOPs run as ring steps of other shapes; costmodel/measured.py). Every op is run `warmup`
times, then `repeats` times each timed alone: CUDA events around the kernel on a GPU, time.perf_counter on a CPU.
The median is the op's time, the standard deviation says how noisy it was.
"""

from __future__ import annotations

import contextlib
import datetime
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import autotune
from autotune.costmodel.layer import layer_shape
from autotune.costmodel.measured import step_ops
from autotune.costmodel.ops import Op
from autotune.errors import SpecError
from autotune.profiling.kernels import Dims, kernel
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.profile import Device, Libraries, OpPoint, Profile

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True, slots=True)
class Job:
    """One op to time: the cost model's Op and the setting it belongs to."""

    op: Op
    tp: int
    mbs: int
    sp: bool
    cp: int = 1


def device_info(kind: str) -> Device:
    """The device's name as its driver reports it (GPU) or the CPU model (/proc/cpuinfo, else platform)."""
    if kind == "cuda":
        return Device(kind="cuda", name=torch.cuda.get_device_name(), threads=1)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return Device(kind="cpu", name=name, threads=torch.get_num_threads())


def libraries() -> Libraries:
    return Libraries(torch=torch.__version__, python=platform.python_version(), autotune=autotune.__version__)


def _uneven(model: ModelSpec, seq_len: int, tp: int) -> list[str]:
    sizes = {"num_heads": model.num_heads, "num_kv_heads": model.num_kv_heads,
             "ffn_hidden_size": model.ffn_hidden_size, "vocab_size": model.vocab_size, "--seq-len": seq_len}
    return [f"{k} {v}" for k, v in sizes.items() if v % tp]


def splits_evenly(model: ModelSpec, seq_len: int, tp: int) -> bool:
    """Whether tp splits heads, key/value heads, the MLP, the vocabulary and the tokens evenly."""
    return not _uneven(model, seq_len, tp)


def check_degrees(model: ModelSpec, seq_len: int, tps: tuple[int, ...]) -> None:
    """Each tp must split heads, key/value heads, the MLP, the vocabulary and the tokens evenly."""
    for tp in tps:
        if bad := _uneven(model, seq_len, tp):
            raise SpecError(f"--tp {tp}: does not divide {', '.join(bad)} of {model.name}; drop it from --tp")


def check_cps(seq_len: int, cps: tuple[int, ...]) -> None:
    """Ring attention's load balancing cuts the sequence into 2 * cp equal chunks."""
    for cp in cps:
        if cp > 1 and seq_len % (2 * cp):
            raise SpecError(f"--cp {cp}: --seq-len {seq_len} does not split into 2 x cp = {2 * cp} equal chunks "
                            f"(ring attention's load balancing); use a --seq-len divisible by {2 * cp} or drop {cp} "
                            "from --cp")


def enumerate_jobs(model: ModelSpec, seq_len: int, tps: tuple[int, ...], mbss: tuple[int, ...],
                   cps: tuple[int, ...] = (1,)) -> list[Job]:
    """The distinct ops the cost model charges at each (tp, cp, mbs, sp), in a fixed order."""
    job = JobSpec(global_batch=1, seq_len=seq_len)
    seen, jobs = set(), []
    for tp in tps:
        for cp in cps:
            for mbs in mbss:
                for sp in ((False, True) if tp > 1 else (False,)):
                    shape = layer_shape(model, job, tp=tp, cp=cp, mbs=mbs, sp=sp)
                    for op in step_ops(model, shape):
                        key = (op.name, tp, cp if op.category == "attention" else 0, op.flops, op.bytes)
                        if key not in seen:
                            seen.add(key)
                            jobs.append(Job(op, tp, mbs, sp, cp))
    return jobs


def dims(model: ModelSpec, seq_len: int, j: Job, dtype, device: str) -> Dims:
    t = j.mbs * seq_len // j.cp
    return Dims(mbs=j.mbs, seq=seq_len, tokens=t, norm_tokens=t // j.tp if j.sp else t, hidden=model.hidden_size,
                heads=model.num_heads // j.tp, kv_heads=model.num_kv_heads // j.tp, head_dim=model.head_dim,
                ffn=model.ffn_hidden_size // j.tp, vocab=model.vocab_size // j.tp, gated=model.gated,
                act=model.activation, norm=model.norm, causal=model.causal, bias=model.bias == "all",
                dropout=model.dropout, dtype=dtype, device=device, cp=j.cp)


def time_call(fn: Callable[[], object], *, warmup: int, repeats: int, cuda: bool) -> tuple[float, float]:
    """Median and standard deviation of `repeats` timed calls after `warmup` untimed ones, seconds."""
    for _ in range(warmup):
        fn()
    times = []
    if cuda:
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times), (statistics.stdev(times) if len(times) > 1 else 0.0)


def measure_ops(model: ModelSpec, *, seq_len: int, tps: tuple[int, ...], mbss: tuple[int, ...], dtype: str,
                device: str, repeats: int, warmup: int, progress: Progress | None = None,
                cps: tuple[int, ...] = (1,), skip: frozenset = frozenset(), attention: str | None = None
                ) -> tuple[tuple[OpPoint, ...], tuple[str, ...]]:
    """Time every op of `model` at each tp, cp and mbs but the jobs in `skip` and those the device runs out of
    memory for; returns the points in enumeration order and the labels of the ops left untimed. `attention`: the
    SDPA kernel every attention op runs (cudnn, flash; None: PyTorch's own choice)."""
    check_degrees(model, seq_len, tps)
    check_cps(seq_len, cps)
    if dtype not in DTYPES:
        raise SpecError(f"--dtype {dtype}: autotune profile times bf16 or fp16 (fp8 needs Transformer Engine)")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("--device cuda: torch sees no CUDA device here; use --device cpu")
    jobs = enumerate_jobs(model, seq_len, tps, mbss, cps)
    points, skipped = [], []
    with torch.enable_grad(), sdpa_backend(attention):  # the backward kernels replay autograd graphs
        for i, j in enumerate(jobs):
            label = f"{j.op.name} tp={j.tp} cp={j.cp} mbs={j.mbs}{' sp' if j.sp else ''}"
            if progress is not None:
                progress(i, len(jobs), label)
            if j in skip:
                skipped.append(label)
                continue
            try:
                fn = kernel(j.op.name, dims(model, seq_len, j, DTYPES[dtype], device))
                seconds, stdev = time_call(fn, warmup=warmup, repeats=repeats, cuda=device == "cuda")
            except torch.OutOfMemoryError:
                fn = None
                skipped.append(label)
                torch.cuda.empty_cache()
                continue
            points.append(OpPoint(op=j.op.name, tp=j.tp, cp=j.cp, mbs=j.mbs, sp=j.sp, flops=j.op.flops,
                                  bytes=j.op.bytes, seconds=seconds, stdev_seconds=stdev, repeats=repeats))
            del fn
    if progress is not None:
        progress(len(jobs), len(jobs), "done")
    return tuple(points), tuple(skipped)


def profile_model(model: ModelSpec, *, seq_len: int, tps: tuple[int, ...], mbss: tuple[int, ...], dtype: str,
                  device: str, repeats: int, warmup: int, progress: Progress | None = None,
                  cps: tuple[int, ...] = (1,), skip: frozenset = frozenset(), attention: str | None = None) -> Profile:
    """A profile of `model` on this machine's `device` (cpu or cuda), naming the ops left untimed (measure_ops)."""
    torch.manual_seed(0)
    ops, skipped = measure_ops(model, seq_len=seq_len, tps=tps, mbss=mbss, dtype=dtype, device=device,
                               repeats=repeats, warmup=warmup, progress=progress, cps=cps, skip=skip,
                               attention=attention)
    return Profile(path="", created=utc_date(), device=device_info(device), libraries=libraries(),
                   model=model.name, seq_len=seq_len, dtype=dtype, ops=ops, comm={}, not_timed=skipped,
                   attention_backend=attention)


def sdpa_backend(attention: str | None) -> contextlib.AbstractContextManager:
    """SDPA restricted to one kernel (torch.nn.attention.sdpa_kernel), or left to choose (None)."""
    if attention is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([{"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[attention]])


def utc_date() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
