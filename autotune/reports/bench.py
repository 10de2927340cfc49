"""Benchmarks: cost-model throughput, planner speed on the reference cases, and the planner on the rows of
Megatron-LM's published table. Timings are measured here, on this machine, and printed; nothing is asserted.
The plans, statuses, solve counts and CP-SAT work printed beside them depend only on the inputs: run it
again pinned to one core (`taskset -c 0`) or with `--busy` (a second process spinning a CPU throughout) and
only the seconds may change.

Run: ``python -m autotune.reports.bench [--quick] [--busy] [--jobs N]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import islice

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.estimate import CostModel
from autotune.reports.accuracy.common import DEFAULT_DATA, read_rows
from autotune.reports.accuracy.megatron2021 import SEQ_LEN, evaluate_row
from autotune.search.cpsat import cp_model as import_cp_model
from autotune.search.planner import search
from autotune.search.scaling import scale
from autotune.search.space import SearchSpace, enumerate_candidates
from autotune.search.tables import to_plan
from autotune.specs.job import JobSpec
from autotune.specs.plan import even_split
from autotune.reports import run_main

#: The planner's speed bars (issue 13, on an idle machine): model, GPU, GPUs, global batch, sequence length,
#: target seconds.
PLANNER_CASES = (
    ("llama3-8b", "h100-sxm", 64, 512, 8192, 0.5),
    ("llama3-70b", "h100-sxm", 1024, 1024, 8192, 1.0),
    ("llama3-405b", "h100-sxm", 16384, 2048, 8192, 2.0),
    ("gpt3-175b", "a100-80gb", 1024, 1536, 2048, 1.0),
    # mixture-of-experts (issue 14): ep and etp multiply the candidates (9 ep degrees for 256 experts)
    ("deepseek-v3", "h100-sxm", 1024, 4096, 4096, 10.0),
    ("qwen3-235b-a22b", "h100-sxm", 1024, 4096, 4096, 10.0),
    ("mixtral-8x22b", "h100-sxm", 1024, 4096, 4096, 10.0),
)


def estimate_throughput(n_plans: int = 10_000) -> tuple[int, float]:
    """Seconds to estimate n distinct valid plans of llama3-70b on 1024 H100s with a fresh CostModel (so the
    per-layer operator costs are computed inside the timing too)."""
    model, hw = load_model("llama3-70b"), load_hardware("h100-sxm")
    job = JobSpec(global_batch=1024, seq_len=8192)
    plans = []
    for c in enumerate_candidates(model, job, 1024, hw.gpus_per_node, SearchSpace()):
        layers = even_split(model.num_layers, c.pp)
        if all(n % c.vpp == 0 for n in layers):
            plans.extend(to_plan(c, layers, r=r) for r in ((0, 1) if c.full_max else (0,)))
        if len(plans) >= n_plans:
            break
    plans = list(islice(plans, n_plans))
    start = time.perf_counter()
    cm = CostModel(model, hw, job)
    for plan in plans:
        cm.estimate(plan)
    return len(plans), time.perf_counter() - start


def planner_speed(repeats: int) -> list[str]:
    lines = [f"planner, full search space, median of {repeats} runs (work: CP-SAT deterministic seconds):",
             f"  {'case':<44} {'median s':>8} {'target':>6} {'status':<8} {'candidates':>10} {'bound':>7} "
             f"{'memory':>6} {'solves':>6} {'work':>7}  best plan"]
    for name, gpu, gpus, gbs, seq, target in PLANNER_CASES:
        model, hw, job = load_model(name), load_hardware(gpu), JobSpec(global_batch=gbs, seq_len=seq)
        times, result = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            result = search(model, hw, job, gpus, SearchSpace())
            times.append(time.perf_counter() - start)
        s, p = result.stats, result.best.plan
        case = f"{name} / {gpus} x {gpu} / gbs {gbs} / seq {seq}"
        lines.append(f"  {case:<44} {statistics.median(times):>8.2f} {target:>6.1f} {result.status:<8} "
                     f"{s.candidates:>10} {s.pruned_bound:>7} {s.pruned_memory:>6} {s.solved:>6} {s.work:>7.3f}  "
                     f"tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp}" + (f" ep{p.ep} etp{p.etp}" if model.is_moe else "")
                     + f" mbs{p.mbs} {p.schedule} v{p.vpp} {p.recompute} "
                     f"zero{p.zero} -> {result.best.step_time_s:.6f} s, {result.best.mfu:.1%} MFU")
    return lines


def scale_speed(jobs: int = 1, repeats: int = 3) -> list[str]:
    """`autotune scale` over 9 sizes for a 70B model (issue bar: under 10 s, every size proven): the median of
    `repeats` sweeps (the per-size lines are the last sweep's)."""
    sizes = tuple(64 * 2**i for i in range(9))
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        res = scale(load_model("llama3-70b"), load_hardware("h100-sxm"), JobSpec(global_batch=1024, seq_len=8192),
                    sizes, SearchSpace(), jobs=jobs)
        walls.append(time.perf_counter() - start)
    proven = sum(p.status == "OPTIMAL" for p in res.points)
    lines = [f"scale llama3-70b on h100-sxm over 9 sizes {sizes[0]}..{sizes[-1]}, gbs 1024, seq 8192, {jobs} "
             f"job(s), median of {repeats}: {statistics.median(walls):.2f} s (target < 10 s; runs "
             f"{', '.join(f'{w:.2f}' for w in walls)}), {proven}/{len(sizes)} proven"]
    for p in res.points:
        plan = "-" if p.best is None else (f"tp{p.best.plan.tp} pp{p.best.plan.pp} dp{p.best.plan.dp} "
                                           f"cp{p.best.plan.cp} {p.best.plan.schedule} v{p.best.plan.vpp} -> "
                                           f"{p.best.step_time_s:.6f} s")
        lines.append(f"  {p.gpus:>6} {p.wall_s:>7.2f} s  {p.status:<8} {plan}")
    return lines


@contextmanager
def busy_cpu(enabled: bool) -> Iterator[None]:
    """A second process spinning on a CPU while the benchmarks run (the plans must not change)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if enabled else None
    try:
        yield
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()


def megatron_rows() -> list[str]:
    """The planner on each row of Narayanan et al. 2021 Table 1 (same model, GPUs and batch; fp16, no flash
    attention as in 2021) against the published tp/pp evaluated by the same cost model."""
    lines = ["planner vs the published tp/pp of Megatron-LM 2021 Table 1 (A100-80GB, fp16, no flash attention).",
             "  'as published': tp/pp of the paper with full recompute (as it ran), mbs/interleaving tuned; "
             "'same tp/pp': the planner pinned to the paper's tp/pp, free otherwise; 'planner': free.",
             f"  {'model':<11} {'gpus':>5} {'tp/pp':>6} {'as published':>12} {'same tp/pp':>10} {'planner':>32} "
             f"{'TFLOP/s':>8} {'gain':>6} {'solve s':>7}"]
    for row in read_rows(DEFAULT_DATA):
        published = evaluate_row(row)
        model, hw = load_model(row["name"]), load_hardware("a100-80gb")
        job = JobSpec(global_batch=int(row["global_batch"]), seq_len=SEQ_LEN, dtype="fp16",
                      flash_attention=False)
        start = time.perf_counter()
        result = search(model, hw, job, int(row["gpus"]), SearchSpace(), top_k=0)
        wall = time.perf_counter() - start
        pinned = search(model, hw, job, int(row["gpus"]), SearchSpace(tp=(int(row["tp"]),), pp=(int(row["pp"]),)),
                        top_k=0)
        cm = CostModel(model, hw, job)
        pub_tflops = cm.model_flops / published.predicted_step_s / published.gpus / 1e12
        p = result.best.plan
        choice = f"tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} mbs{p.mbs} v{p.vpp} {p.recompute}"
        lines.append(f"  {row['name']:<11} {int(row['gpus']):>5} {row['tp'] + '/' + row['pp']:>6} "
                     f"{pub_tflops:>12.0f} {pinned.best.model_tflops_per_gpu:>10.0f} {choice:>32} "
                     f"{result.best.model_tflops_per_gpu:>8.0f} {result.best.model_tflops_per_gpu / pub_tflops - 1:>+6.0%}"
                     f" {wall:>7.2f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.reports.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run per planner case, skip the Megatron table")
    parser.add_argument("--busy", action="store_true", help="keep a second process spinning a CPU throughout")
    parser.add_argument("--jobs", type=int, default=1, help="sizes `scale` searches at once (default 1)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    import_cp_model()  # start-up, paid once per process: not in the timings
    print(f"importing CP-SAT: {time.perf_counter() - start:.2f} s (once per process, before the first solve)")
    with busy_cpu(args.busy):
        n, seconds = estimate_throughput()
        print(f"cost model: {n} estimates of llama3-70b plans in {seconds:.3f} s ({seconds / n * 1e6:.0f} us "
              "each; target: 10,000 in under 1 s)", flush=True)
        for line in planner_speed(1 if args.quick else 5):
            print(line, flush=True)
        for line in scale_speed(args.jobs, 1 if args.quick else 3):
            print(line, flush=True)
        if not args.quick:
            for line in megatron_rows():
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
