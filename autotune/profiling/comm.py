"""`autotune profile --comm`: run the collective benchmark under torchrun and fit the cost model's alpha-beta.

The fit uses costmodel/comm.py's own formulas through `comm.linear_pieces` (ring steps and volumes): each
collective at n ranks costs min over its pieces of a*alpha + b*nbytes/bandwidth (p2p: alpha + nbytes/bw). That is
linear in (alpha, 1/bandwidth), so a least squares on the relative error, (predicted - measured)/measured,
gives both directly (numpy lstsq); for the all-reduce the piece NCCL would pick under the current fit is chosen
per point and the fit repeated until the choice is stable. The tier's alpha and bandwidth are the joint fit
over all four collectives (the cost model has one Link per tier); each collective's own fit is reported too.
This module needs no torch: the benchmark runs in child processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from autotune.costmodel import comm
from autotune.errors import SpecError
from autotune.specs.profile import COLLECTIVES, CollectiveFit, CommPoint, CommTier
from autotune.units import GB, US

Progress = Callable[[int, int, str], None]


def _pieces(collective: str, n: int) -> tuple[tuple[float, float], ...]:
    """(latency steps, bytes-on-the-wire factor) of each piece: comm.py's formulas on a unit link."""
    if collective == "p2p":
        return ((1.0, 1.0),)
    return comm.linear_pieces(collective, n, comm.Link(bandwidth=1.0, latency=1.0))


def fit_alpha_beta(points: Sequence[dict], n: int) -> tuple[float, float, np.ndarray]:
    """(alpha seconds, bandwidth bytes/s, relative error per point) minimizing the squared relative error."""
    pieces = [_pieces(p["collective"], n) for p in points]
    x = np.array([p["bytes"] for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points], dtype=float)
    choice = [0] * len(points)
    for _ in range(10):
        a = np.array([pc[c][0] for pc, c in zip(pieces, choice)])
        b = np.array([pc[c][1] for pc, c in zip(pieces, choice)]) * x
        (alpha, inv_bw), *_ = np.linalg.lstsq(np.column_stack([a / t, b / t]), np.ones_like(t), rcond=None)
        new = [int(np.argmin([la * alpha + lb * xi * inv_bw for la, lb in pc])) for pc, xi in zip(pieces, x)]
        if new == choice:
            break
        choice = new
    if not (alpha > 0 and inv_bw > 0):
        raise SpecError(f"comm fit gave alpha {alpha * 1e6:.3g} us and 1/bandwidth {inv_bw:.3g} s/B; both must be "
                        "> 0: widen --min-bytes..--max-bytes or raise --repeats so latency and bandwidth both show")
    predicted = np.array([min(la * alpha + lb * xi * inv_bw for la, lb in pc) for pc, xi in zip(pieces, x)])
    return float(alpha), float(1 / inv_bw), (predicted - t) / t


def fit_tier(raw: dict) -> CommTier:
    """The tier's joint fit, every collective's own fit and every point's error under the joint fit."""
    points, n = raw["points"], int(raw["nproc"])
    alpha, bw, err = fit_alpha_beta(points, n)
    fits = {}
    for c in COLLECTIVES:
        own = [p for p in points if p["collective"] == c]
        if own:
            a, b, e = fit_alpha_beta(own, n)
            fits[c] = CollectiveFit(alpha_us=a / US, bandwidth_GBps=b / GB, max_error_pct=float(100 * np.abs(e).max()))
    return CommTier(backend=raw["backend"], nproc=n, alpha_us=alpha / US, bandwidth_GBps=bw / GB,
                    max_error_pct=float(100 * np.abs(err).max()), collectives=fits,
                    points=tuple(CommPoint(collective=p["collective"], bytes=p["bytes"], seconds=p["seconds"],
                                           stdev_seconds=p["stdev_seconds"], repeats=p["repeats"],
                                           fit_error_pct=float(100 * e)) for p, e in zip(points, err)))


def run_commbench(*, nproc: int, backend: str, device: str, min_bytes: int, max_bytes: int, repeats: int,
                  warmup: int, progress: Progress | None = None, timeout_s: float = 3600) -> dict:
    """Launch the benchmark on `nproc` local processes (torchrun --standalone); the raw points of rank 0."""
    if nproc < 2:
        raise SpecError(f"--nproc {nproc}: a collective needs at least 2 processes")
    if not 0 < min_bytes <= max_bytes:
        raise SpecError(f"--min-bytes {min_bytes} and --max-bytes {max_bytes}: need 0 < min <= max")
    with tempfile.TemporaryDirectory(prefix="autotune-comm-") as tmp:
        out = Path(tmp) / "raw.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "autotune.profiling.commbench", "--out", str(out), "--min-bytes", str(min_bytes),
               "--max-bytes", str(max_bytes), "--backend", backend, "--device", device, "--repeats", str(repeats),
               "--warmup", str(warmup)]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        log = []
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("autotune-progress ") and progress is not None:
                _, i, total, *label = line.split()
                progress(int(i), int(total), " ".join(label))
            else:
                log.append(line.rstrip())
        code = proc.wait(timeout=timeout_s)
        if code != 0 or not out.is_file():
            last = next((ln for ln in reversed(log) if ln.strip()), "no output")
            raise SpecError(f"--comm: the benchmark under torchrun failed (exit {code}): {last[:300]}")
        return json.loads(out.read_text())
