"""`autotune scale`: the best plan at each GPU count of a sweep, and where more GPUs stop paying."""

from __future__ import annotations

from typing import Annotated

import typer

from autotune.catalog import load_model
from autotune.cli.inputs import load_cost_profile
from autotune.cli.launch import trainer_caps
from autotune.cli.options import (AttentionOpt, BriefOpt, CrossTpOpt, DtypeOpt, ForceProfileOpt, ForkOpt, GpuOpt,
                                  GpusPerNodeOpt, GradOpt, JsonOpt, ModelOpt, MoeCapacityOpt, MoeDispatcherOpt,
                                  MoeImbalanceOpt, MoePadOpt, NoFlashOpt, NoTimingsOpt, OptimizerStatesOpt, Pins,
                                  ProfileOpt, SCpOpt, SMbsOpt, SPpOpt, SRecomputeOpt, SScheduleOpt, SSpOpt, STpModeOpt,
                                  STpOpt, SVocabOpt, SVppOpt, SZeroOpt, SeqOpt, UnfusedOpt, WorkLimitOpt, build_job,
                                  check_moe_flags, check_whole_nodes, fail, load_cluster, parse_int_list, show,
                                  show_warnings)
from autotune.cli.searching import pins_space, profiled_space, without_timings
from autotune.emit import TRAINERS
from autotune.errors import InfeasibleError, SolverLimitError, SpecError
from autotune.render.scale import scale_progress, scaling_brief, scaling_csv, scaling_json, scaling_report
from autotune.search.planner import DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT
from autotune.search.space import for_trainer
from autotune.search.scaling import (DEFAULT_EFFICIENCY_THRESHOLD, DEFAULT_TRAIN_TOKENS, available_cores,
                                     global_batch_for_tokens, scale)
from autotune.specs.trainer_jobs import as_run, check_job_settings, check_trainer_settings


def scale_command(
    model: ModelOpt, gpu: GpuOpt,
    gpus: Annotated[str, typer.Option("--gpus", metavar="N,N,...", help="GPU counts to sweep, increasing, e.g. "
                                      "64,128,256.")],
    seq_len: SeqOpt,
    global_batch: Annotated[int | None, typer.Option("--global-batch", help="Sequences per optimizer step (or "
                                                     "--tokens-per-step).")] = None,
    tokens_per_step: Annotated[int | None, typer.Option("--tokens-per-step", metavar="T", help="Tokens per "
                                                        "optimizer step instead of --global-batch (a multiple of "
                                                        "--seq-len).")] = None,
    gpus_per_node: GpusPerNodeOpt = None, dtype: DtypeOpt = "bf16", tp: STpOpt = None, pp: SPpOpt = None,
    cp: SCpOpt = None, mbs: SMbsOpt = None, vpp: SVppOpt = None, recompute: SRecomputeOpt = None,
    schedule: SScheduleOpt = None, zero: SZeroOpt = None, vocab: SVocabOpt = None, tp_mode: STpModeOpt = None,
    sequence_parallel: SSpOpt = None, allow_cross_node_tp: CrossTpOpt = False,
    no_flash_attention: NoFlashOpt = False, unfused: UnfusedOpt = False,
    train_tokens: Annotated[float, typer.Option("--train-tokens", metavar="N", help="Tokens to train, for the "
                                                "days, GPU-hours and cost columns.")] = DEFAULT_TRAIN_TOKENS,
    price_per_gpu_hour: Annotated[float | None, typer.Option("--price-per-gpu-hour", metavar="USD", help="Adds "
                                                             "the cost per million tokens.")] = None,
    efficiency_threshold: Annotated[float, typer.Option("--efficiency-threshold", metavar="F", help="Mark sizes "
                                    "past the first step whose throughput ratio / GPU ratio falls below F.")]
    = DEFAULT_EFFICIENCY_THRESHOLD,
    time_limit: Annotated[float, typer.Option("--time-limit", metavar="S", help="Wall-clock safety net per size, "
                                              "in seconds (a size it stops is marked, exit 3).")
                          ] = DEFAULT_TIME_LIMIT_S,
    work_limit: WorkLimitOpt = DEFAULT_WORK_LIMIT,
    jobs: Annotated[int | None, typer.Option("--jobs", min=1, metavar="N", show_default=False,
                                             help="Sizes searched at once, in separate processes (the answer is "
                                             "the same for any N; default: the cores this process may use).")
                    ] = None,
    json_out: JsonOpt = False,
    csv_out: Annotated[bool, typer.Option("--csv", help="Print CSV (one row per size) instead of tables.")] = False,
    profile: ProfileOpt = None,
    trainer: Annotated[str | None, typer.Option("--trainer", metavar="|".join(TRAINERS), help="Search only plans "
                                                "this trainer runs (and cost its kernels).")] = None,
    fork: ForkOpt = None, brief: BriefOpt = False, force_profile: ForceProfileOpt = False,
    no_timings: NoTimingsOpt = False, moe_imbalance: MoeImbalanceOpt = None,
    moe_dispatcher: MoeDispatcherOpt = "alltoall",
    moe_capacity_factor: MoeCapacityOpt = None, moe_pad_to_capacity: MoePadOpt = False,
    grad_reduce: GradOpt = None, optimizer_states: OptimizerStatesOpt = "fp32",
    attention_backend: AttentionOpt = None,
) -> None:
    """The best plan at each GPU count: throughput, MFU, time and cost to train, where the winning strategy
    changes and where more GPUs stop paying (exit 2: no size fits; 3: a size not proven)."""
    if json_out + csv_out + brief > 1:
        raise SpecError("--json, --csv and --brief each replace the tables; pick one")
    if (global_batch is None) == (tokens_per_step is None):
        raise SpecError("give exactly one of --global-batch (sequences) and --tokens-per-step")
    if not time_limit > 0:
        raise SpecError(f"--time-limit must be > 0 seconds, got {time_limit:g}")
    if not work_limit > 0:
        raise SpecError(f"--work-limit must be > 0, got {work_limit:g}")
    spec, hw = load_model(model), load_cluster(gpu, gpus_per_node)
    check_moe_flags(spec, moe_imbalance, moe_dispatcher, moe_capacity_factor, moe_pad_to_capacity)
    sizes = parse_int_list(gpus, "--gpus")
    for size in sizes:
        check_whole_nodes(size, hw)
    batch = global_batch if global_batch is not None else global_batch_for_tokens(tokens_per_step, seq_len)
    caps = trainer_caps(trainer, fork)
    job = build_job(batch, seq_len, dtype, no_flash_attention, unfused, grad_reduce, kernels=trainer,
                    moe_imbalance=moe_imbalance, moe_dispatcher=moe_dispatcher, moe_capacity=moe_capacity_factor,
                    moe_pad=moe_pad_to_capacity, optimizer_states=optimizer_states,
                    attention_backend=attention_backend)
    check_job_settings(caps, job)
    check_trainer_settings(caps, job)
    spec, notes = as_run(spec, trainer, seq_len)  # what the trainer's config builds
    pins = Pins(tp=tp, pp=pp, cp=cp, mbs=mbs, vpp=vpp, recompute=recompute, schedule=schedule, zero=zero,
                vocab=vocab, sequence_parallel=sequence_parallel, tp_mode=tp_mode)
    space = for_trainer(pins_space(pins, allow_idle=False, allow_cross_node_tp=allow_cross_node_tp), caps)
    measured = load_cost_profile(profile, gpu, spec, hw, job, force_profile)
    full_space = space
    space, profiled = profiled_space(space, measured, profile is not None, job)
    with scale_progress(True) as progress:  # on a terminal even with --json/--csv: it goes to stderr
        result = scale(spec, hw, job, sizes, space, train_tokens=train_tokens,
                       price_per_gpu_hour=price_per_gpu_hour, efficiency_threshold=efficiency_threshold,
                       time_limit_s=time_limit, progress=progress, profile=measured, work_limit=work_limit,
                       jobs=available_cores() if jobs is None else jobs,
                       fallback=full_space if profiled else None)
    if widened := [str(p.gpus) for p in result.points if p.widened]:
        profiled.append(f"--profile {profile}: at {', '.join(widened)} GPUs no plan among the shapes it timed; "
                        "searched every shape there, the others costed by the roofline")
    if csv_out:
        typer.echo(scaling_csv(result), nl=False)
    elif brief:
        typer.echo(scaling_brief(result))
    elif json_out:
        doc = scaling_json(result, spec, hw, job)
        show(without_timings(doc) if no_timings else doc, True)
    else:
        show(scaling_report(result, spec, hw, job), False)
    if any(p.best is not None for p in result.points):
        show_warnings([*notes, *profiled, *hw.kernel_warnings(job.dtype, job.flash_attention)])
    if all(p.best is None for p in result.points):
        infeasible = all(p.status == "INFEASIBLE" for p in result.points)
        reason = next((p.reason for p in result.points if p.reason), "")
        fail(f"no GPU count of {gpus} has a plan that fits" + (f" (at {result.points[-1].gpus}: "
              f"{result.points[-1].reason})" if result.points[-1].reason else "") if infeasible else
              f"no GPU count of {gpus} found a plan within the limits ({reason or 'raise --time-limit'})",
              InfeasibleError.exit_code if infeasible else SolverLimitError.exit_code)
    unproven = [str(p.gpus) for p in result.points if p.status in ("FEASIBLE", "TIME_LIMIT")]
    if unproven and (csv_out or brief or json_out):  # the table says it; these formats on stderr
        show_warnings([f"{', '.join(unproven)} GPUs: --work-limit or --time-limit stopped the search before it "
                       "proved the plan; raise it"])
    if unproven:
        raise typer.Exit(SolverLimitError.exit_code)
