"""`autotune profile`: time the cost model's operators (and, with --comm, the collectives) on this machine.

Registered in cli/app.py. Torch is an optional extra; it is imported
only when the command runs, so the rest of autotune works without it. --out pointing at an existing profile
replaces only what this run measured (the ops, or with --comm the link tier) and keeps the rest, so one file can
hold both: `autotune profile --model M --out F` then `autotune profile --comm --out F`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from autotune.catalog import load_model
from autotune.specs.plan import positions_issue
from autotune.cli.options import parse_int_list, show_warnings
from autotune.errors import SpecError
from autotune.fileio import check_target, slug
from autotune.render.common import dump_json
from autotune.specs.job import ATTENTION_BACKENDS
from autotune.specs.limits import MAX_PROFILE_TOKENS, MAX_SEQ_LEN
from autotune.specs.profile import TIERS, Profile, load_profile, write_profile

GiB = 2**30
#: Limits of a profiling run (with MAX_SEQ_LEN and MAX_PROFILE_TOKENS of specs/limits.py): timed and warm-up
#: runs per op, the largest collective, the processes of one node.
MAX_REPEATS = 1000
MAX_COMM_BYTES = 16 * GiB
MAX_NPROC = 64
#: Memory one timed op may hold, over the bytes of HBM traffic the cost model counts for it: about right for a GEMM
#: (inputs, weights and outputs, which a backward keeps about twice over), generous for memory-bound ops (the
#: traffic counts several passes over the same tensors). A rough bound, meant to refuse what cannot work.
OP_MEMORY_FACTOR = 1


def available_memory(kind: str) -> int | None:
    """Bytes free for tensors on the device: the GPU's free memory, or the kernel's MemAvailable (None if unknown)."""
    if kind == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def oversized_jobs(spec, seq: int, tps: tuple[int, ...], mbss: tuple[int, ...], kind: str,
                   cps: tuple[int, ...] = (1,)) -> frozenset:
    """On a CPU, the ops whose tensors would not fit in free memory, found before any tensor exists (the kernel's
    OOM killer would come instead of a line); they are left untimed, and when no op fits the run is refused. A GPU
    says when it runs out (torch.OutOfMemoryError), so there each op is tried and one that does not fit is left
    untimed then (measure_ops): the bytes an op moves overstate what it holds (an fp32 loss over 32k x 128k
    logits moves 149 GiB and held 55 GiB on an H100)."""
    from autotune.profiling.optimer import enumerate_jobs

    jobs, free = enumerate_jobs(spec, seq, tps, mbss, cps), available_memory(kind)
    if not jobs or free is None or kind != "cpu":
        return frozenset()
    big = frozenset(j for j in jobs if OP_MEMORY_FACTOR * j.op.bytes > free)
    if len(big) == len(jobs):
        small = min(jobs, key=lambda j: j.op.bytes)
        raise SpecError(f"profile: timing {small.op.name} of {spec.name} at tp {small.tp}, cp {small.cp}, mbs "
                        f"{small.mbs}, seq {seq} needs about {OP_MEMORY_FACTOR * small.op.bytes / GiB:.3g} GiB, but "
                        f"{kind} has {free / GiB:.3g} GiB free (no op fits); use a smaller --mbs or --seq-len, or "
                        "only larger --tp degrees")
    return big


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SpecError("autotune profile needs PyTorch: pip install 'autotune-parallel[profile]'") from None


@contextlib.contextmanager
def _progress(show: bool, what: str):
    """A rich progress bar on stderr (stdout stays clean for --json); yields the library's callback. Only on a
    terminal: elsewhere rich would leave a blank line before an error, which must be one line."""
    if not show or not sys.stderr.isatty():
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{what}: {label}")
        yield update


def _existing(out: Path) -> Profile | None:
    """The profile --out already holds, which this run adds to; a file that is not one is refused with the fix
    for this command (another --out), not the reader's (re-profile), which is what the user is doing."""
    if not out.is_file():
        return None
    try:
        return load_profile(out)
    except SpecError as exc:
        reason = re.split(r"; (?:the file is corrupt|give the file)", str(exc))[0]
        reason = reason.removeprefix(f"--profile {out}: ").removeprefix(f"{out}:")
        raise SpecError(f"--out {out}: an existing file this run would add to, but not a profile autotune reads "
                        f"({'line ' if reason[:1].isdigit() else ''}{reason.strip()}); remove it or choose another "
                        "--out") from None


def profile_command(
    model: Annotated[str | None, typer.Option("--model", metavar="NAME|FILE", help="Model whose ops to time "
                                              "(not needed with --comm).")] = None,
    device: Annotated[str | None, typer.Option("--device", metavar="cpu|cuda", help="Where to time (default: cuda "
                                               "if torch sees a GPU, else cpu).")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=1, max=MAX_SEQ_LEN, help="Tokens per sequence "
                                                "(default: 2048, or the model's learned positions if fewer).")]
    = None,
    tp: Annotated[str | None, typer.Option("--tp", metavar="N,N,...", help="Tensor-parallel degrees whose per-GPU "
                                           "shapes to time (default: those of 1,2,4,8 that split the model's heads, "
                                           "MLP, vocabulary and sequence evenly).")] = None,
    mbs: Annotated[str, typer.Option("--mbs", metavar="N,N,...", help="Micro-batch sizes to time.")] = "1,2,4",
    cp: Annotated[str, typer.Option("--cp", metavar="N,N,...", help="Context-parallel degrees whose per-GPU shapes "
                                    "to time (seq/cp tokens, ring attention's steps and corrections).")] = "1",
    dtype: Annotated[str, typer.Option("--dtype", metavar="bf16|fp16", help="Activation and matmul dtype.")] = "bf16",
    repeats: Annotated[int, typer.Option("--repeats", min=1, max=MAX_REPEATS, help="Timed runs per op (median "
                                         "kept).")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", min=0, max=MAX_REPEATS, help="Untimed runs before timing.")] = 3,
    threads: Annotated[int, typer.Option("--threads", min=1, max=1024, help="CPU threads for torch (--device "
                                         "cpu). One by default: a thread pool waiting on a busy core times the "
                                         "wait.")] = 1,
    out: Annotated[Path | None, typer.Option("--out", metavar="FILE", help="Profile to write (default: "
                                             "./<device>-<model>.json, or ./<device>-comm.json).")] = None,
    comm_: Annotated[bool, typer.Option("--comm", help="Time collectives instead of ops, and fit alpha/beta.")]
    = False,
    min_bytes: Annotated[int, typer.Option("--min-bytes", min=1, max=MAX_COMM_BYTES, help="--comm: smallest "
                                           "size.")] = 4096,
    max_bytes: Annotated[int, typer.Option("--max-bytes", min=1, max=MAX_COMM_BYTES, help="--comm: largest size "
                                           f"(at most {MAX_COMM_BYTES // GiB} GiB).")] = GiB,
    nproc: Annotated[int, typer.Option("--nproc", min=2, max=MAX_NPROC, help="--comm: processes (GPUs) in the "
                                       "group.")] = 2,
    backend: Annotated[str | None, typer.Option("--backend", metavar="gloo|nccl", help="--comm: default gloo on "
                                                "cpu, nccl on cuda.")] = None,
    tier: Annotated[str, typer.Option("--tier", metavar="|".join(TIERS), help="--comm: which link the group "
                                      "spans (one node under torchrun --standalone).")] = "intra_node",
    attention: Annotated[str | None, typer.Option("--attention-backend", metavar="cudnn|flash", help="SDPA kernel "
                                                  "to time attention with (cuda; default cudnn, what Megatron, "
                                                  "torchtitan and DeepSpeed run); recorded in the profile.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON summary instead of text.")] = False,
) -> None:
    """Measure per-op costs with PyTorch on this machine's device and write a profile (--comm: collectives)."""
    if out is not None:
        check_target(out, directory=False)
    _need_torch()
    import torch

    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cpu":
        torch.set_num_threads(threads)
    if kind not in ("cpu", "cuda"):
        raise SpecError(f"--device {kind!r}: use cpu or cuda")
    if kind == "cuda" and not torch.cuda.is_available():  # before the model, --tp and --comm are looked at
        raise SpecError("--device cuda: torch sees no CUDA device here; use --device cpu")
    if backend not in (None, "gloo", "nccl") or (backend == "nccl" and kind != "cuda"):
        raise SpecError(f"--backend {backend!r}: use gloo, or nccl with --device cuda")
    start = time.perf_counter()
    if comm_:
        summary = _profile_comm(kind, out, min_bytes=min_bytes, max_bytes=max_bytes, nproc=nproc,
                                backend=backend or ("nccl" if kind == "cuda" else "gloo"), tier=tier,
                                repeats=repeats, warmup=warmup, show=not json_out)
    else:
        summary = _profile_ops(kind, out, model=model, seq_len=seq_len, tp=tp, mbs=mbs, cp=cp, dtype=dtype,
                               repeats=repeats, warmup=warmup, show=not json_out,
                               attention=_attention_backend(attention, kind))
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    text = summary.pop("text")
    if json_out:
        typer.echo(dump_json(summary))
    else:
        typer.echo(text)
        typer.echo(f"wrote {summary['out']} in {summary['wall_s']} s")


def _attention_backend(asked: str | None, kind: str) -> str | None:
    """The SDPA kernel attention is timed with: cuDNN's by default on a GPU, none to choose on a CPU."""
    if asked is not None and asked not in ATTENTION_BACKENDS:
        raise SpecError(f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {asked!r}")
    if asked is not None and kind != "cuda":
        raise SpecError(f"--attention-backend {asked}: {kind} has no cuDNN or FlashAttention kernel; drop it or use "
                        "--device cuda")
    return asked or ("cudnn" if kind == "cuda" else None)


def _profile_ops(kind: str, out: Path | None, *, model: str | None, seq_len: int | None, tp: str | None, mbs: str,
                 cp: str, dtype: str, repeats: int, warmup: int, show: bool, attention: str | None = None) -> dict:
    from autotune.profiling.optimer import check_cps, profile_model, splits_evenly

    if model is None:
        raise SpecError("autotune profile needs --model M (or --comm to time collectives)")
    spec = load_model(model)
    seq = seq_len or min(2048, spec.max_position_embeddings or 2048)
    if (why := positions_issue(spec, seq)) is not None:
        raise SpecError(why)
    mbss = parse_int_list(mbs, "--mbs")
    if max(mbss) * seq > MAX_PROFILE_TOKENS:
        raise SpecError(f"--mbs {max(mbss)} x --seq-len {seq} = {max(mbss) * seq:,} tokens per micro-batch exceed the "
                        f"maximum of {MAX_PROFILE_TOKENS:,} that profile times; use a smaller --mbs or --seq-len")
    target = out or Path(f"{kind}-{slug(spec.name)}.json")
    old = _existing(target)
    tps, cps = parse_int_list("1,2,4,8" if tp is None else tp, "--tp"), parse_int_list(cp, "--cp")
    if tp is None:  # the default: the degrees this model splits evenly (tiny-gpt's 4 heads take no tp 8)
        tps = tuple(t for t in tps if splits_evenly(spec, seq, t))
    tps_text = ",".join(map(str, tps))
    check_cps(seq, cps)
    too_big = oversized_jobs(spec, seq, tps, mbss, kind, cps)
    try:
        with _progress(show, f"timing {spec.name} ops on {kind}") as progress:
            prof = profile_model(spec, seq_len=seq, tps=tps, mbss=mbss, dtype=dtype, device=kind, repeats=repeats,
                                 warmup=warmup, progress=progress, cps=cps, skip=too_big, attention=attention)
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if "memory" not in str(exc).lower() and not isinstance(exc, MemoryError):
            raise
        raise SpecError(f"profile: {kind} ran out of memory timing {spec.name} (seq {seq}, tp {tps_text}, cp {cp}, mbs "
                        f"{mbs}); use a smaller --mbs or --seq-len, or only larger --tp degrees") from None
    if not prof.ops:
        raise SpecError(f"profile: no op of {spec.name} fits in {kind}'s free memory at seq {seq} (tp {tps_text}, "
                        f"cp {cp}, mbs {mbs}); use a smaller --mbs or --seq-len, or only larger --tp degrees")
    if prof.not_timed:
        show_warnings([f"not timed, too large for {kind}'s free memory: {', '.join(prof.not_timed)} (estimates "
                       "charge them by the roofline)"])
    if old is not None and old.comm:
        prof = dataclasses.replace(prof, comm=old.comm)
    written = write_profile(prof, target)
    text = (f"timed {len(prof.ops)} ops of {spec.name} (seq {seq}, tp {tps_text}, cp {cp}, mbs {mbs}, {dtype}) on "
            f"{prof.device.kind} {prof.device.name!r}, {prof.device.threads} thread(s)")
    return {"out": str(written), "model": spec.name, "device": dataclasses.asdict(prof.device), "seq_len": seq,
            "cp": list(cps), "dtype": dtype, "ops": len(prof.ops), "not_timed": list(prof.not_timed), "text": text}


def _profile_comm(kind: str, out: Path | None, *, min_bytes: int, max_bytes: int, nproc: int, backend: str,
                  tier: str, repeats: int, warmup: int, show: bool) -> dict:
    from autotune.profiling.comm import fit_tier, run_commbench
    from autotune.profiling.optimer import device_info, libraries, utc_date

    if tier not in TIERS:
        raise SpecError(f"--tier {tier!r}: use one of {', '.join(TIERS)}")
    target = out or Path(f"{kind}-comm.json")
    old = _existing(target)
    with _progress(show, f"timing collectives on {nproc} x {kind} ({backend})") as progress:
        raw = run_commbench(nproc=nproc, backend=backend, device=kind, min_bytes=min_bytes, max_bytes=max_bytes,
                            repeats=repeats, warmup=warmup, progress=progress)
    fit = fit_tier(raw)
    if old is None:
        old = Profile(path="", created=utc_date(), device=device_info(kind), libraries=libraries(), model=None,
                      seq_len=None, dtype=None, ops=(), comm={})
    written = write_profile(dataclasses.replace(old, created=utc_date(), comm={**old.comm, tier: fit}), target)
    if fit.max_error_pct > 20:
        show_warnings([f"--comm: the joint alpha-beta fit misses some points by up to {fit.max_error_pct:.0f}% "
                       "(see fit_error_pct in the file); each collective's own fit is under comm.collectives"])
    lines = [f"{tier}: alpha {fit.alpha_us:.1f} us, bandwidth {fit.bandwidth_GBps:.3f} GB/s over {len(fit.points)} "
             f"points ({nproc} x {kind}, {backend}); max error {fit.max_error_pct:.1f}%"]
    lines += [f"  {c:<15} alpha {f.alpha_us:8.1f} us  bandwidth {f.bandwidth_GBps:8.3f} GB/s  max error "
              f"{f.max_error_pct:5.1f}%" for c, f in fit.collectives.items()]
    lines += [f"  {p.collective:<15} {int(p.bytes):>11} B  {p.seconds * 1e6:10.1f} us  fit {p.fit_error_pct:+6.1f}%"
              for p in fit.points]
    return {"out": str(written), "tier": tier, "nproc": nproc, "backend": backend, "alpha_us": fit.alpha_us,
            "bandwidth_GBps": fit.bandwidth_GBps, "max_error_pct": fit.max_error_pct,
            "collectives": {c: dataclasses.asdict(f) for c, f in fit.collectives.items()},
            "points": [dataclasses.asdict(p) for p in fit.points], "text": "\n".join(lines)}
