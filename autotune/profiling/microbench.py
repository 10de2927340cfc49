"""Kernel microbenchmarks behind a hardware file's efficiency figures, on this machine's GPU.

`python -m autotune.profiling.microbench --out FILE` times, with CUDA events, what the cost model reduces to a
few fractions of the datasheet peaks: bf16 and fp8 GEMMs at square and training shapes (the wave/tile
quantization model of costmodel/compute.py is checked against them), causal fused attention forward and
backward by sequence length and head dim for each SDPA backend (flash, cuDNN), memory-bound kernels (copy,
RMSNorm, SwiGLU, fp32 cross-entropy, fused AdamW per parameter), grouped GEMMs by tokens per expert (MoE) and
the launch gap of back-to-back small kernels. The JSON it writes records every point with its shape, so a
reader can recompute any efficiency; nothing here is fitted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

GEMM_SHAPES = (
    # (m, n, k): square ceilings, then per-GPU training shapes (tokens x out x in) of Llama 3 8B/70B/405B
    (8192, 8192, 8192), (4096, 4096, 4096), (16384, 16384, 16384),
    (8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336),   # 8B tp1 fwd
    (8192, 1536, 4096), (8192, 4096, 1024), (8192, 7168, 4096), (8192, 4096, 3584),     # 8B tp4
    (8192, 1280, 8192), (8192, 8192, 1024), (8192, 7168, 8192), (8192, 8192, 3584),     # 70B tp8
    (16384, 2560, 8192), (16384, 8192, 2048), (16384, 14336, 8192), (16384, 8192, 7168),  # 70B tp4 mbs2
    (8192, 2304, 16384), (8192, 16384, 2048), (8192, 13312, 16384), (8192, 16384, 6656),  # 405B tp8
    (4096, 8192, 8192), (8192, 8192, 4096), (8192, 4096, 8192),  # dgrad/wgrad-like aspect ratios
    (2048, 8192, 8192), (1024, 8192, 8192), (512, 8192, 8192), (256, 8192, 8192),  # few tokens
    (8192, 16032, 4096), (8192, 128256, 4096), (8192, 32064, 8192),  # LM head shards
)


def _timed(fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 10, inner: int = 1) -> float:
    """Median seconds of one call: `repeats` CUDA-event timings of `inner` back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(times)


def _rand(*shape: int, dtype=torch.bfloat16, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(grad)


def bench_gemm() -> list[dict]:
    out = []
    for m, n, k in GEMM_SHAPES:
        a, b = _rand(m, k), _rand(k, n)
        s = _timed(lambda: a @ b)
        out.append({"m": m, "n": n, "k": k, "dtype": "bf16", "seconds": s, "tflops": 2 * m * n * k / s / 1e12})
    return out


def validation_shapes(count: int = 40, seed: int = 1) -> list[tuple[int, int, int]]:
    """Training-like GEMM shapes the efficiency model was not fitted on: tokens 2048-32768, widths 512-32768
    in steps of 128, drawn log-uniformly with a fixed seed (the same shapes on every machine)."""
    import random
    rng = random.Random(seed)

    def draw(lo: int, hi: int) -> int:
        return max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi))) / 128) * 128)
    return [(draw(2048, 32768), draw(512, 32768), draw(512, 32768)) for _ in range(count)]


def bench_gemm_layouts() -> list[dict]:
    """Held-out shapes in the three layouts of a linear layer's step: forward X W^T, dgrad dY W, wgrad dY^T X."""
    out = []
    for m, n, k in validation_shapes():
        if (m * k + k * n + m * n) * 2 > 6 << 30:
            continue
        for layout in ("nt", "nn", "tn"):
            a = _rand(k, m).t() if layout == "tn" else _rand(m, k)
            b = _rand(n, k).t() if layout == "nt" else _rand(k, n)
            s = _timed(lambda: a @ b)
            out.append({"m": m, "n": n, "k": k, "layout": layout, "dtype": "bf16", "seconds": s,
                        "tflops": 2 * m * n * k / s / 1e12})
    return out


def bench_memory_compiled() -> list[dict]:
    """The memory-bound kernels of a layer fused by torch.compile (Triton): what torchtitan with compile runs,
    and the nearest stand-in here for Transformer Engine's fused norm and activation kernels."""
    out = []
    t, h, f = 8192, 8192, 28672

    def both(name: str, fn: Callable, inputs: list[torch.Tensor], fwd_bytes: float, bwd_bytes: float) -> None:
        cf = torch.compile(fn)
        s = _timed(lambda: cf(*inputs))
        out.append({"kernel": name + "_fwd", "seconds": s, "bytes": fwd_bytes, "GBps": fwd_bytes / s / 1e9})
        o = cf(*inputs)
        g = torch.randn_like(o)
        s = _timed(lambda: torch.autograd.grad(o, inputs, g, retain_graph=True))
        out.append({"kernel": name + "_bwd", "seconds": s, "bytes": bwd_bytes, "GBps": bwd_bytes / s / 1e9})

    x, w = _rand(t, h, grad=True), _rand(h, grad=True)
    both("rmsnorm_compiled", lambda x, w: F.rms_norm(x, (h,), w), [x, w], 2 * t * h * 2, 3 * t * h * 2)
    r = _rand(t, h, grad=True)
    both("residual_add_eager_as_compiled", lambda x, r: x + r, [x, r], 3 * t * h * 2, 3 * t * h * 2)
    a, b = _rand(t, f // 2, grad=True), _rand(t, f // 2, grad=True)
    both("swiglu_compiled", lambda a, b: F.silu(a) * b, [a, b], 3 * t * f // 2 * 2, 5 * t * f // 2 * 2)
    q = _rand(t, 64, 128, grad=True)
    cos, sin = _rand(t, 1, 128), _rand(t, 1, 128)

    def rope(x):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    both("rope_compiled", rope, [q], 2 * t * 64 * 128 * 2, 2 * t * 64 * 128 * 2)
    s = _timed(lambda: rope(q))
    out.append({"kernel": "rope_eager_fwd", "seconds": s, "bytes": 2 * t * 64 * 128 * 2,
                "GBps": 2 * t * 64 * 128 * 2 / s / 1e9})
    return out


#: (n, k) of Llama 3 8B / 70B / 405B linear layers sharded over tp (8B tp1, 70B tp4, 405B tp8)
SHARD_NK = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (2560, 8192), (8192, 2048), (14336, 8192),
            (8192, 7168), (2304, 16384), (16384, 2048), (13312, 16384), (16384, 6656))


def bench_gemm_small_m() -> list[dict]:
    """Few rows (tensor-parallel overlap runs each GEMM as tp chunks of m/tp rows; MoE experts see few tokens):
    m 256-2048 against the sharded Llama widths, bf16 and fp8."""
    out = []
    for m in (256, 512, 1024, 2048):
        for n, k in SHARD_NK:
            a, b = _rand(m, k), _rand(k, n)
            s = _timed(lambda: a @ b)
            out.append({"m": m, "n": n, "k": k, "dtype": "bf16", "seconds": s, "tflops": 2 * m * n * k / s / 1e12})
    out += [dict(p, section="fp8") for p in _fp8_points([(m, n, k) for m in (256, 512, 1024, 2048)
                                                          for n, k in SHARD_NK])]
    return out


def bench_gemm_fp8() -> list[dict]:
    return _fp8_points(GEMM_SHAPES)


def bench_gemm_fp8_validation() -> list[dict]:
    return _fp8_points([s for s in validation_shapes() if (s[0] * s[2] + s[2] * s[1] + s[0] * s[1]) < 3 << 30])


def _fp8_points(shapes) -> list[dict]:
    out = []
    for m, n, k in shapes:
        a = _rand(m, k).to(torch.float8_e4m3fn)
        b = _rand(n, k).to(torch.float8_e4m3fn).t()  # cuBLASLt's fp8 kernels need the column-major B
        one = torch.ones((), device="cuda", dtype=torch.float32)
        variants = {"tensor": (one, one, False), "tensor_fast_accum": (one, one, True),
                    "rowwise": (torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda"), False)}
        for scaling, (sa, sb, fast) in variants.items():
            try:
                s = _timed(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                                    use_fast_accum=fast))
            except (RuntimeError, TypeError) as e:  # a torch build without that scaling mode
                out.append({"m": m, "n": n, "k": k, "scaling": scaling, "error": str(e).splitlines()[0][:200]})
                continue
            out.append({"m": m, "n": n, "k": k, "dtype": "fp8", "scaling": scaling, "seconds": s,
                        "tflops": 2 * m * n * k / s / 1e12})
    return out


def _attention_flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    full = 4 * b * h * s * s * d  # QK^T and PV, 2 FLOPs per MAC
    return full / 2 if causal else full


def bench_attention() -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    out = []
    for d in (64, 128):
        for s in (512, 1024, 2048, 4096, 8192, 16384, 32768):
            h = 8192 // d  # hidden 8192 (70B-like full width); batch keeps ~32k tokens per call
            b = max(1, 32768 // s)
            for name, backend in backends.items():
                q, k, v = (_rand(b, h, s, d, grad=True) for _ in range(3))
                try:
                    with sdpa_kernel(backend):
                        fwd = _timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        g = torch.randn_like(o)
                        bwd = _timed(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
                except RuntimeError as e:
                    out.append({"backend": name, "seq": s, "head_dim": d, "error": str(e).splitlines()[0][:200]})
                    continue
                fl = _attention_flops(b, h, s, d, True)
                out.append({"backend": name, "batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True,
                            "fwd_seconds": fwd, "bwd_seconds": bwd, "fwd_tflops": fl / fwd / 1e12,
                            "bwd_tflops": 2.5 * fl / bwd / 1e12, "bwd_over_fwd_time": bwd / fwd})
    return out


def bench_attention_blocks() -> list[dict]:
    """Non-causal attention blocks, square and rectangular: what context parallelism's ring steps run after the
    first (a local query chunk against a remote key/value chunk, no mask), head dim 128."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    out = []
    d, h = 128, 64
    shapes = [(s, s) for s in (512, 1024, 2048, 4096, 8192, 16384)] + \
        [(2 * s, s) for s in (512, 1024, 2048, 4096, 8192)] + [(s, 2 * s) for s in (512, 1024, 2048, 4096, 8192)]
    for sq, skv in shapes:
        b = max(1, 32768 // max(sq, skv))
        for name, backend in backends.items():
            q = _rand(b, h, sq, d, grad=True)
            k, v = (_rand(b, h, skv, d, grad=True) for _ in range(2))
            try:
                with sdpa_kernel(backend):
                    fwd = _timed(lambda: F.scaled_dot_product_attention(q, k, v))
                    o = F.scaled_dot_product_attention(q, k, v)
                    g = torch.randn_like(o)
                    bwd = _timed(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
            except RuntimeError as e:
                out.append({"backend": name, "q": sq, "kv": skv, "error": str(e).splitlines()[0][:200]})
                continue
            fl = 4 * b * h * sq * skv * d
            out.append({"backend": name, "batch": b, "heads": h, "q": sq, "kv": skv, "head_dim": d, "causal": False,
                        "fwd_seconds": fwd, "bwd_seconds": bwd, "fwd_tflops": fl / fwd / 1e12,
                        "bwd_tflops": 2.5 * fl / bwd / 1e12})
    return out


def bench_memory() -> list[dict]:
    out = []
    t, h, f, vocab = 8192, 8192, 28672, 128256

    def record(name: str, seconds: float, nbytes: float, **extra) -> None:
        out.append({"kernel": name, "seconds": seconds, "bytes": nbytes, "GBps": nbytes / seconds / 1e9, **extra})

    x = _rand(1 << 28)  # 512 MiB
    y = torch.empty_like(x)
    record("copy", _timed(lambda: y.copy_(x)), 2 * x.numel() * 2)
    x, w = _rand(t, h, grad=True), _rand(h, grad=True)
    record("rmsnorm_fwd", _timed(lambda: F.rms_norm(x, (h,), w)), 2 * t * h * 2)
    o = F.rms_norm(x, (h,), w)
    g = torch.randn_like(o)
    record("rmsnorm_bwd", _timed(lambda: torch.autograd.grad(o, (x, w), g, retain_graph=True)), 3 * t * h * 2)
    a, b = _rand(t, f // 2, grad=True), _rand(t, f // 2, grad=True)
    record("swiglu_fwd_eager", _timed(lambda: F.silu(a) * b), 3 * t * f // 2 * 2)
    o = F.silu(a) * b
    g = torch.randn_like(o)
    record("swiglu_bwd_eager", _timed(lambda: torch.autograd.grad(o, (a, b), g, retain_graph=True)), 5 * t * f // 2 * 2)
    logits = _rand(t, vocab // 8, grad=True)
    target = torch.randint(0, vocab // 8, (t,), device="cuda")
    record("cross_entropy_fp32_fwd", _timed(lambda: F.cross_entropy(logits.float(), target)),
           t * vocab // 8 * (2 + 4 + 4), vocab_shard=vocab // 8)
    loss = F.cross_entropy(logits.float(), target)
    record("cross_entropy_fp32_bwd", _timed(lambda: torch.autograd.grad(loss, logits, retain_graph=True)),
           t * vocab // 8 * (4 + 4 + 2), vocab_shard=vocab // 8)
    n = 1 << 28  # 268M fp32 parameters: master weights, grads, two moments
    params = [torch.zeros(n, device="cuda", dtype=torch.float32, requires_grad=True)]
    params[0].grad = torch.randn(n, device="cuda")
    for fused in (True, False):
        opt = torch.optim.AdamW(params, lr=1e-4, fused=fused, foreach=None if fused else True)
        s = _timed(opt.step, warmup=2, repeats=5)
        record("adamw_fused" if fused else "adamw_foreach", s, n * 4 * 7, params=n, seconds_per_param=s / n)
    return out


def bench_grouped_gemm() -> list[dict]:
    """Expert GEMMs by tokens per expert: torch._grouped_mm when the build has it, else one matmul per expert."""
    out = []
    grouped = hasattr(torch, "_grouped_mm")
    for experts, hidden, ffn in ((128, 2048, 768), (64, 7168, 2048), (8, 6144, 16384)):
        for per_expert in (64, 128, 256, 512, 1024, 2048, 4096):
            tokens = experts * per_expert
            if tokens * max(hidden, ffn) * 2 > 8 << 30:
                continue
            x = _rand(tokens, hidden)
            w = _rand(experts, hidden, ffn)
            offs = torch.arange(per_expert, tokens + 1, per_expert, device="cuda", dtype=torch.int32)
            flops = 2 * tokens * hidden * ffn
            row = {"experts": experts, "hidden": hidden, "ffn": ffn, "tokens_per_expert": per_expert}
            if grouped:
                try:
                    s = _timed(lambda: torch._grouped_mm(x, w, offs=offs))
                    row.update(grouped_seconds=s, grouped_tflops=flops / s / 1e12)
                except RuntimeError as e:
                    row["grouped_error"] = str(e).splitlines()[0][:200]
            chunks = x.split(per_expert)
            s = _timed(lambda: [c @ w[i] for i, c in enumerate(chunks)], repeats=5)
            row.update(loop_seconds=s, loop_tflops=flops / s / 1e12)
            out.append(row)
    return out


def bench_launch() -> list[dict]:
    x = torch.zeros(1, device="cuda")
    per = _timed(lambda: x.add_(1), inner=1000)
    graph_free = {"kernel": "add_1_element", "seconds_per_kernel": per}
    return [graph_free]


def device_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "sm_count": p.multi_processor_count, "memory_bytes": p.total_memory,
            "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}


SECTIONS = {"gemm_bf16": bench_gemm, "gemm_layouts": bench_gemm_layouts, "gemm_fp8": bench_gemm_fp8,
            "gemm_fp8_validation": bench_gemm_fp8_validation, "gemm_small_m": bench_gemm_small_m,
            "memory_compiled": bench_memory_compiled, "attention": bench_attention,
            "attention_blocks": bench_attention_blocks,
            "memory": bench_memory, "grouped_gemm": bench_grouped_gemm, "launch": bench_launch}


def _write(path: str, doc: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autotune.profiling.microbench", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--blas", choices=("default", "cublas", "cublaslt"), default="default",
                    help="BLAS library behind torch's bf16 matmul (Transformer Engine calls cuBLASLt)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ", ".join(SECTIONS))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("microbench: torch sees no CUDA device; these figures describe a GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    if args.blas != "default":
        torch.backends.cuda.preferred_blas_library(args.blas)
    doc: dict = {"schema": "autotune.microbench/1", "device": device_info(), "blas": args.blas,
                 "created": time.strftime("%Y-%m-%d", time.gmtime()), "sections": {}}
    for name in args.only.split(","):
        t0 = time.time()
        try:
            doc["sections"][name] = SECTIONS[name]()
        except Exception as e:  # one broken section must not lose the others' figures
            doc["sections"][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        print(f"{name}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
        _write(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
