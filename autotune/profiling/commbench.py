"""The collective benchmark one rank runs under torchrun (`autotune profile --comm` launches it).

    python -m torch.distributed.run --standalone --nproc-per-node N -m autotune.profiling.commbench \
        --out RAW.json --min-bytes 4096 --max-bytes 1073741824 --backend gloo --device cpu --repeats 10 --warmup 3

Sizes double from --min-bytes to --max-bytes. Each size is the `nbytes` argument of the matching function of
costmodel/comm.py: the buffer of an all-reduce, the input of a reduce-scatter, the output of an all-gather, the
message of a send. Every repeat starts after a barrier and is timed on rank 0 (CUDA: after a synchronize); a
send/recv is timed as a ping-pong between ranks 0 and 1 and halved. Rank 0 prints `autotune-progress i n
label` lines for the parent's progress bar and writes the raw points as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")
ELEM = 4  # float32: every backend reduces it


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def _count(nbytes: int, n: int) -> int:
    """Elements of the full buffer: a multiple of n, so that the shards are equal."""
    return max(n, nbytes // ELEM // n * n)


def _op(name: str, nbytes: int, device: str) -> Callable[[], None]:
    rank, n = dist.get_rank(), dist.get_world_size()
    count = _count(nbytes, n)
    full, shard = torch.ones(count, device=device), torch.ones(count // n, device=device)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    if name == "all_reduce":
        return lambda: dist.all_reduce(full)
    if name == "all_gather":
        return lambda: gather(full, shard)
    if name == "reduce_scatter":
        return lambda: scatter(shard, full)

    def ping_pong() -> None:
        if rank == 0:
            dist.send(full, 1)
            dist.recv(full, 1)
        elif rank == 1:
            dist.recv(full, 0)
            dist.send(full, 0)
    return ping_pong


def _time(fn: Callable[[], None], *, warmup: int, repeats: int, cuda: bool) -> list[float]:
    """Seconds of each timed call; every call starts right after a barrier."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="autotune.profiling.commbench")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-bytes", type=int, required=True)
    ap.add_argument("--max-bytes", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--repeats", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    args = ap.parse_args(argv)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    device = args.device
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
    work = [(c, s) for c in COLLECTIVES for s in sizes(args.min_bytes, args.max_bytes)]
    points = []
    for i, (name, nbytes) in enumerate(work):
        if rank == 0:
            print(f"autotune-progress {i} {len(work)} {name} {nbytes}", flush=True)
        times = _time(_op(name, nbytes, device), warmup=args.warmup, repeats=args.repeats, cuda=args.device == "cuda")
        if name == "p2p":
            times = [t / 2 for t in times]
        points.append({"collective": name, "bytes": _count(nbytes, dist.get_world_size()) * ELEM, "seconds": min(times),
                       "stdev_seconds": statistics.stdev(times) if len(times) > 1 else 0.0, "repeats": len(times)})
    if rank == 0:
        with open(args.out, "w") as handle:
            json.dump({"nproc": dist.get_world_size(), "backend": args.backend, "points": points}, handle)
        print(f"autotune-progress {len(work)} {len(work)} done", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
