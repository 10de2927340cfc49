"""`autotune plan`: search for the fastest plan that fits; with --trainer T only plans T runs, with --out DIR
also plan.json and T's launch files."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.text import Text

from autotune.catalog import load_model
from autotune.cli.inputs import coverage_warnings, load_cost_profile
from autotune.cli.launch import check_emit_options, save_plan, trainer_caps
from autotune.cli.options import (AttentionOpt, BatchOpt, BriefOpt, CompareOpt, CrossTpOpt, DtypeOpt, ForceProfileOpt,
                                  ForkOpt, FormatOpt, GpuOpt, GpusOpt, GpusPerNodeOpt, GradOpt, IdleOpt, JsonOpt,
                                  KernelsOpt, MockDataOpt, ModelOpt, MoeCapacityOpt, MoeDispatcherOpt, MoeImbalanceOpt,
                                  MoePadOpt, NoFlashOpt, NoTimingsOpt, OptimizerStatesOpt, Pins, PlanOutOpt, ProfileOpt,
                                  RunTokensOpt, SCpOpt, SDpOpt, SEpOpt, SEpOverlapOpt, SEtpOpt, SLayersOpt, SMbsOpt,
                                  SOverlapOpt, SPpOpt, SRecomputeOpt, SScheduleOpt, SSpOpt, STpModeOpt, STpOpt,
                                  SVocabOpt, SVppOpt, SZeroOpt, SeqOpt, StrictOpt, TimeLimitOpt, TopOpt, TrainerOpt,
                                  UnfusedOpt, WorkLimitOpt, build_job, check_moe_flags, check_whole_nodes, load_cluster,
                                  show, show_warnings)
from autotune.cli.searching import (compare_plan, distinct_fitting, profiled_space, run_search, search_space,
                                    without_timings)
from autotune.costmodel.estimate import CostModel
from autotune.errors import InfeasibleError, SolverLimitError, SpecError
from autotune.fileio import check_target
from autotune.render.common import brief_line, mfu_warnings, with_files, written_report
from autotune.render.plan import infeasible_json, limit_note, plan_json, plan_report
from autotune.render.trainers import trainers_json, trainers_report
from autotune.search.planner import DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT
from autotune.search.scaling import DEFAULT_TRAIN_TOKENS
from autotune.search.trainers import best_per_trainer, reestimator
from autotune.specs.limits import check_train_tokens
from autotune.specs.trainer_jobs import (as_run, check_job_settings, check_trainer_settings,
                                         runs_grad_reduce)


def plan(
    model: ModelOpt, gpu: GpuOpt, gpus: GpusOpt, global_batch: BatchOpt, seq_len: SeqOpt,
    gpus_per_node: GpusPerNodeOpt = None, dtype: DtypeOpt = "bf16", tp: STpOpt = None, pp: SPpOpt = None,
    dp: SDpOpt = None, cp: SCpOpt = None, mbs: SMbsOpt = None, vpp: SVppOpt = None, recompute: SRecomputeOpt = None,
    schedule: SScheduleOpt = None, zero: SZeroOpt = None, vocab: SVocabOpt = None, tp_mode: STpModeOpt = None,
    layers_per_stage: SLayersOpt = None, sequence_parallel: SSpOpt = None, allow_idle: IdleOpt = False,
    allow_cross_node_tp: CrossTpOpt = False, no_flash_attention: NoFlashOpt = False, unfused: UnfusedOpt = False,
    top: TopOpt = 3, time_limit: TimeLimitOpt = DEFAULT_TIME_LIMIT_S, work_limit: WorkLimitOpt = DEFAULT_WORK_LIMIT,
    compare: CompareOpt = None, json_out: JsonOpt = False,
    trainer: TrainerOpt = None, out: PlanOutOpt = None, torchtitan_format: FormatOpt = None, strict: StrictOpt = False,
    profile: ProfileOpt = None, tp_overlap: SOverlapOpt = None, grad_reduce: GradOpt = None,
    kernels: KernelsOpt = None, fork: ForkOpt = None, brief: BriefOpt = False,
    force_profile: ForceProfileOpt = False, no_timings: NoTimingsOpt = False,
    mock_data: MockDataOpt = False, train_tokens: RunTokensOpt = DEFAULT_TRAIN_TOKENS, ep: SEpOpt = None,
    etp: SEtpOpt = None, ep_overlap: SEpOverlapOpt = None, moe_imbalance: MoeImbalanceOpt = None,
    moe_dispatcher: MoeDispatcherOpt = "alltoall",
    moe_capacity_factor: MoeCapacityOpt = None, moe_pad_to_capacity: MoePadOpt = False,
    optimizer_states: OptimizerStatesOpt = "fp32", attention_backend: AttentionOpt = None,
) -> None:
    """Search for the fastest plan that fits; show it, the runners-up and why they lost (exit 3: not proven).
    With --trainer T, only plans T runs; with --out DIR, also write DIR/plan.json and T's launch config(s)."""
    started = time.monotonic()  # --time-limit bounds the whole command: the trainers' searches get what is left
    check_emit_options(trainer, torchtitan_format, strict)
    if brief and json_out:
        raise SpecError("--brief and --json each replace the tables; pick one")
    if not time_limit > 0:
        raise SpecError(f"--time-limit must be > 0 seconds, got {time_limit:g}")
    caps = trainer_caps(trainer, fork)
    if (strict or torchtitan_format is not None) and out is None:
        raise SpecError("--strict and --torchtitan-format apply to the launch config written with --out DIR; add it")
    if out is not None:
        check_target(Path(out), directory=True)
    check_train_tokens(train_tokens)
    spec, hw = load_model(model), load_cluster(gpu, gpus_per_node)
    check_moe_flags(spec, moe_imbalance, moe_dispatcher, moe_capacity_factor, moe_pad_to_capacity)
    check_whole_nodes(gpus, hw)
    job = build_job(global_batch, seq_len, dtype, no_flash_attention, unfused,
                    grad_reduce or runs_grad_reduce(trainer or kernels, dtype), kernels or trainer,
                    moe_imbalance, moe_dispatcher, moe_capacity_factor, moe_pad_to_capacity, optimizer_states,
                    attention_backend)
    check_job_settings(caps, job)
    check_trainer_settings(caps, job)
    # searched and costed as the trainer's config builds it; the document keeps the model as given (emit and
    # estimate --plan apply as_run_model from the trainer it records). With --out the emitter says the note
    # beside the launch files.
    built, notes = as_run(spec, trainer, seq_len)
    notes = notes if out is None else []
    if torchtitan_format == "toml" and job.optimizer_states != "fp32":
        raise SpecError(f"--optimizer-states {job.optimizer_states} with --torchtitan-format toml: torchtitan 0.2.x "
                        "keeps fp32 Adam states; use the 0.3.0 overrides (--torchtitan-format cli) or "
                        "--optimizer-states fp32")
    pins = Pins(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, vpp=vpp, recompute=recompute, schedule=schedule, zero=zero,
                vocab=vocab, layers_per_stage=layers_per_stage, sequence_parallel=sequence_parallel, tp_mode=tp_mode,
                tp_overlap=tp_overlap, ep=ep, etp=etp, ep_overlap=ep_overlap)
    space = search_space(pins, spec, job, gpus, hw.gpus_per_node, allow_idle=allow_idle,
                         allow_cross_node_tp=allow_cross_node_tp, trainer=caps)
    measured = load_cost_profile(profile, gpu, spec, hw, job, force_profile)
    full_space = space
    space, profiled = profiled_space(space, measured, profile is not None, job)
    mine = compare_plan(compare, built, hw, job, gpus, space, measured) if compare is not None else None
    left = max(time_limit - (time.monotonic() - started), 1e-3)
    try:
        try:
            searched = run_search(built, hw, job, gpus, space, top_k=top, time_limit_s=left, profile=measured,
                                  work_limit=work_limit)
        except InfeasibleError:
            if not profiled:
                raise
            profiled = [f"--profile {profile}: no plan among the shapes it timed; searched every shape, the others "
                        "costed by the roofline"]
            searched = run_search(built, hw, job, gpus, full_space, top_k=top, time_limit_s=left, profile=measured,
                                  work_limit=work_limit)
    except InfeasibleError as exc:
        if json_out:  # CLI.md: --json prints one object whatever the outcome; the error line goes to stderr too
            show(infeasible_json(spec, hw, job, gpus, str(exc), mine), True)
        raise
    result = distinct_fitting(searched, top)
    coverage = CostModel(built, hw, job, measured).op_coverage(result.best.plan)
    show_warnings([*notes, *profiled, *hw.kernel_warnings(job.dtype, job.flash_attention), *mfu_warnings(result.best)]
                  + coverage_warnings(coverage, result.best.plan, measured, job.seq_len)
                  + ([f"--top {top}: the runners-up search stopped at its cap of candidates visited; the list is in "
                      "order but may miss strategies that belong in it (a smaller --top completes sooner)"]
                     if result.runners_up_cut else []))
    doc = {**plan_json(result, spec, hw, job, mine), "trainer": None if caps is None else caps.name,
           "op_costs": coverage.as_dict()}
    fits = () if caps is not None else best_per_trainer(spec, hw, job, gpus, space, result.best.plan,
                                                        profile=measured, work_limit=work_limit,
                                                        time_limit_s=max(time_limit - (time.monotonic() - started),
                                                                         1e-3), own_kernels=kernels is None)
    if fits:
        doc["trainers"] = trainers_json(fits)
    written = [] if out is None else save_plan(out, doc, trainer, torchtitan_format=torchtitan_format, strict=strict,
                                               reestimate=reestimator(CostModel(built, hw, job, measured)),
                                               mock_data=mock_data, train_tokens=train_tokens)
    if brief:  # the best plan's line as before, then one per runner-up (--top), marked so a script can tell
        typer.echo("\n".join([f"{brief_line(result.best)} status={result.status}"]
                              + [brief_line(r.estimate, prefix=f"runner_up={k}")
                                 for k, r in enumerate(result.runners_up, 1)]
                              + ([] if mine is None else [brief_line(mine.estimate, prefix="compared=yes")])))
    elif json_out:
        shown = without_timings(doc) if no_timings else doc
        show(with_files(shown, written) if out is not None else shown, True)
    else:
        typer.echo(coverage.line())
        timeline = CostModel(built, hw, job, measured).timeline(result.best.plan)
        show(plan_report(result, spec, hw, job, mine, timeline), False)
        if fits:
            show(trainers_report(fits, result.best), False)
        elif caps is not None:
            show(Text(f"searched only plans {caps.name} runs as planned (autotune/specs/trainers.py)"), False)
        if written:
            typer.echo(written_report(written))
    if (brief or json_out) and (note := limit_note(result)):  # the tables say it; these formats on stderr
        show_warnings([note])
    if result.status != "OPTIMAL" or result.limit == "time":
        raise typer.Exit(SolverLimitError.exit_code)
