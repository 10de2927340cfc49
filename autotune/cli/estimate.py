"""`autotune estimate`: one plan (pins or --plan FILE), its step time and memory term by term."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import typer

from autotune.catalog import load_model
from autotune.cli.inputs import (JOB_SETTINGS, check_flush, coverage_warnings, document_flushes, job_from_plan_document,
                                 load_cost_profile, plan_source, read_plan, recorded_overlaps, settle_job_settings,
                                 single_plan)
from autotune.cli.options import (AttentionOpt, BatchOrPlanOpt, BriefOpt, BucketOpt, CpOpt, CrossTpOpt, DpOpt, DtypeOpt,
                                  EpOpt, EpOverlapOpt, EtpOpt, ForceProfileOpt, GpuOrPlanOpt, GpusOrPlanOpt,
                                  GpusPerNodeOpt, GradOpt, JsonOpt, KernelsOpt, LayersOpt, MbsOpt, MicroOpt,
                                  ModelOrPlanOpt, MoeCapacityOpt, MoeDispatcherOpt, MoeImbalanceOpt, MoePadOpt,
                                  NoFlashOpt, OptimizerStatesOpt, OverlapOpt, Pins, PlanFileOpt, PpOpt, ProfileOpt,
                                  RecomputeLayersOpt, RecomputeOpt, ScheduleOpt, SeqOrPlanOpt, SpOpt, TpModeOpt, TpOpt,
                                  UnfusedOpt, VocabOpt, VppOpt, ZeroOpt, build_job, check_moe_flags,
                                  check_simulation_size, check_whole_nodes, load_cluster, show, show_warnings,
                                  time_limited)
from autotune.costmodel.accumulation import flushed_estimate, one_flush
from autotune.costmodel.estimate import CostModel
from autotune.emit.document import document_model, document_trainer
from autotune.errors import SpecError
from autotune.render.common import brief_line, bucket_warnings, mfu_warnings
from autotune.render.estimate import estimate_json, estimate_report
from autotune.search.planner import DEFAULT_TIME_LIMIT_S
from autotune.specs.job import JobSpec, check_moe_imbalance
from autotune.specs.plan import Plan, check_plan
from autotune.specs.trainer_jobs import as_run_model, runs_grad_reduce


def estimate(
    ctx: typer.Context, model: ModelOrPlanOpt = None, gpu: GpuOrPlanOpt = None, gpus: GpusOrPlanOpt = None,
    global_batch: BatchOrPlanOpt = None, seq_len: SeqOrPlanOpt = None, gpus_per_node: GpusPerNodeOpt = None,
    dtype: DtypeOpt = "bf16", tp: TpOpt = None, pp: PpOpt = None,
    dp: DpOpt = None, cp: CpOpt = None, mbs: MbsOpt = None, vpp: VppOpt = None, recompute: RecomputeOpt = None,
    schedule: ScheduleOpt = None, zero: ZeroOpt = None, vocab: VocabOpt = None, tp_mode: TpModeOpt = None,
    layers_per_stage: LayersOpt = None, num_microbatches: MicroOpt = None,
    recompute_layers: RecomputeLayersOpt = None, bucket_size: BucketOpt = None,
    sequence_parallel: SpOpt = None, no_flash_attention: NoFlashOpt = False, unfused: UnfusedOpt = False,
    plan_file: PlanFileOpt = None, json_out: JsonOpt = False,
    ops: Annotated[bool, typer.Option("--ops", help="Also show compute time by operator category.")] = False,
    allow_cross_node_tp: CrossTpOpt = False, profile: ProfileOpt = None, tp_overlap: OverlapOpt = None,
    grad_reduce: GradOpt = None, kernels: KernelsOpt = None, brief: BriefOpt = False,
    force_profile: ForceProfileOpt = False, ep: EpOpt = None, etp: EtpOpt = None, ep_overlap: EpOverlapOpt = None,
    moe_imbalance: MoeImbalanceOpt = None, moe_dispatcher: MoeDispatcherOpt = "alltoall",
    moe_capacity_factor: MoeCapacityOpt = None, moe_pad_to_capacity: MoePadOpt = False,
    optimizer_states: OptimizerStatesOpt = "fp32", attention_backend: AttentionOpt = None,
    time_limit: Annotated[float, typer.Option("--time-limit", metavar="S", help="Wall-clock limit in seconds "
                                              "(exit 3 when it strikes).")] = DEFAULT_TIME_LIMIT_S,
) -> None:
    """Evaluate one plan and explain its step time and memory term by term."""
    if brief and json_out:
        raise SpecError("--brief and --json each replace the tables; pick one")
    pins = Pins(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, vpp=vpp, recompute=recompute, schedule=schedule, zero=zero,
                vocab=vocab, layers_per_stage=layers_per_stage, num_microbatches=num_microbatches,
                recompute_layers=recompute_layers, bucket_size=bucket_size, sequence_parallel=sequence_parallel,
                tp_mode=tp_mode, tp_overlap=tp_overlap, ep=ep, etp=etp, ep_overlap=ep_overlap)
    settings = {"dtype": dtype, "no_flash_attention": no_flash_attention, "unfused": unfused,
                "grad_reduce": grad_reduce, "kernels": kernels, "moe_imbalance": moe_imbalance,
                "moe_dispatcher": moe_dispatcher, "moe_capacity_factor": moe_capacity_factor,
                "moe_pad_to_capacity": moe_pad_to_capacity, "optimizer_states": optimizer_states,
                "attention_backend": attention_backend}
    plan, recorded, doc, where, given = None, {}, None, "", set()
    if plan_file is not None:  # re-costed with the job it was planned with, unless the command line gives one
        plan, recorded, doc = read_plan(plan_file, pins)
        where = plan_source(plan_file, "--plan")
    given_job = {"model": model, "gpu": gpu, "gpus": gpus, "gpus_per_node": gpus_per_node,
                 "global_batch": global_batch, "seq_len": seq_len}
    filled = job_from_plan_document(given_job, recorded, where)
    gpus, global_batch, seq_len = filled["gpus"], filled["global_batch"], filled["seq_len"]
    spec = load_model(model) if model is not None else document_model(doc, recorded, where)
    if (searched := document_trainer(doc, where) if doc is not None else None) is not None:
        spec = as_run_model(spec, searched.split("+")[0], seq_len)  # as the trainer it was planned for builds it
    check_moe_flags(spec, moe_imbalance, moe_dispatcher, moe_capacity_factor, moe_pad_to_capacity)
    try:
        hw = load_cluster(filled["gpu"], filled["gpus_per_node"])
    except SpecError:
        if gpu is not None:
            raise
        raise SpecError(f"{where}: job.gpu {filled['gpu']!r} is not a catalog GPU (a plan made with a hardware file "
                        "records only its name); give --gpu FILE") from None
    check_whole_nodes(gpus, hw)
    if plan_file is not None:
        # by name: typer builds its commands with its own copy of click, whose enum is not click's
        given = {name for name in settings if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"}
        fixed = {"model": spec.name, "gpu": hw.name, "gpus": gpus, "gpus_per_node": hw.gpus_per_node,
                 "global_batch": global_batch, "seq_len": seq_len}
        settings = settle_job_settings(recorded, where, settings, given, fixed)
    try:
        job = build_job(global_batch, seq_len, settings["dtype"], settings["no_flash_attention"], settings["unfused"],
                        settings["grad_reduce"], settings["kernels"], settings["moe_imbalance"],
                        settings["moe_dispatcher"], settings["moe_capacity_factor"], settings["moe_pad_to_capacity"],
                        settings["optimizer_states"], settings["attention_backend"])
        if spec.is_moe and "moe_imbalance" in recorded and "moe_imbalance" not in given:  # as the flag is
            check_moe_imbalance(job.moe_imbalance, spec.num_experts, spec.moe_top_k, spec.name, "--moe-imbalance")
    except SpecError as exc:  # some settings may come from the document's job block: name it, and its keys
        if not where:
            raise
        message = str(exc)
        for key, _, param, flag, _ in JOB_SETTINGS:
            if key in recorded and param not in given:
                message = message.replace(f"{flag} ", f"job.{key} ")
        raise SpecError(f"{where}: {message}") from None
    job = replace(job, **recorded_overlaps(recorded, where))
    if plan is None:
        plan = single_plan(pins, spec, job, gpus)
        if spec.is_moe and etp is None and plan.tp > 1:
            show_warnings([f"etp 1 (the default here): experts whole on each GPU of their ep group; Megatron's own "
                           f"default is etp = tp = {plan.tp} (give --etp {plan.tp} to cost that)"])
    # a saved plan states its own tensor-parallel layout (plan --allow-cross-node-tp), as a script does for `check`
    try:
        check_plan(plan, spec, job, gpus, hw.gpus_per_node, allow_cross_node_tp=allow_cross_node_tp or bool(plan_file))
    except SpecError as exc:  # (InvalidPlanError too) a document's plan: say which file
        raise type(exc)(f"{where}: {exc}" if where and not str(exc).startswith(where) else str(exc)) from None
    check_simulation_size(plan, "estimate")
    measured = load_cost_profile(profile, filled["gpu"], spec, hw, job, force_profile)
    cm = CostModel(spec, hw, job, measured)
    flushes = document_flushes(doc, plan, where)
    check_flush(plan, spec, job, gpus, hw.gpus_per_node, flushes, where)
    with time_limited(time_limit, "estimate"):
        if flushes == 1:
            est, shown_plan = cm.estimate(plan), plan
        else:  # check's document of an accumulating torchtitan config: its runs of the schedule, one in the timeline
            est, shown_plan = flushed_estimate(spec, hw, job, measured, plan, flushes), one_flush(plan, job, flushes)[0]
        coverage = cm.op_coverage(plan)
        timeline = None if json_out or brief else cm.timeline(shown_plan)
    show_warnings([*hw.kernel_warnings(job.dtype, job.flash_attention), *mfu_warnings(est),
                   *(bucket_warnings(plan, spec) if bucket_size is not None else [])]
                  + ([f"{where}: check.pipeline_flushes {flushes}: the config runs the {plan.schedule} schedule "
                      f"{flushes} times a step (torchtitan's gradient accumulation with a pipeline), each over "
                      f"{plan.num_microbatches // flushes} micro-batches; costed so, as check did (the timeline shows "
                      "one run)"] if flushes > 1 else [])
                  + coverage_warnings(coverage, plan, measured, job.seq_len)
                  + profile_drift(doc, coverage.source, where)
                  + grad_drift(job, doc, where)
                  + attention_drift(job, recorded, "attention_backend" in given, where))
    if brief:
        typer.echo(brief_line(est))
    elif json_out:
        show({**estimate_json(est, spec, hw, job), "op_costs": coverage.as_dict()}, True)
    else:
        show(estimate_report(est, spec, hw, job, ops=ops, timeline=timeline), False)
        typer.echo(coverage.line())


def profile_drift(doc: object, source: str, where: str) -> list[str]:
    """A saved plan priced with other op times than this estimate's (a --profile FILE it was planned with and the
    command line leaves out): say so, since the figures then differ from the document's."""
    costs = doc.get("op_costs") if isinstance(doc, dict) else None
    planned = costs.get("source") if isinstance(costs, dict) else None
    if not isinstance(planned, str) or planned == source:
        return []
    return [f"{where} was planned with op times from {planned}; this estimate uses {source}: give --profile {planned} "
            "to re-cost it as planned"]


def attention_drift(job: JobSpec, recorded: dict, given: bool, where: str) -> list[str]:
    """A plan document for torchtitan's or DeepSpeed's kernels that records no attention kernel was written before
    autotune costed theirs as cuDNN's (FlashAttention-2 until 2026-11-24): re-costed with cuDNN, with a warning."""
    if given or recorded.get("kernels") not in ("torchtitan", "deepspeed") or "attention_backend" in recorded:
        return []
    return [f"{where} records no job.attention_backend: written when {job.trainer}'s attention was costed as "
            "FlashAttention-2's, it is re-costed with cuDNN's, which its code runs; give --attention-backend flash "
            "to cost it as it was"]


def grad_drift(job: JobSpec, doc: object, where: str) -> list[str]:
    """A plan document for a trainer (its "trainer") costed with gradient buffers that trainer's config does not keep
    (a document written before DeepSpeed's were costed in the model dtype): re-costed as recorded, with a warning
    naming what the config runs."""
    trainer = doc.get("trainer") if isinstance(doc, dict) else None
    runs = runs_grad_reduce(trainer, job.dtype, job.grad_reduce) if isinstance(trainer, str) else job.grad_reduce
    if runs == job.grad_reduce:
        return []
    return [f"{where}: costed with {job.grad_reduce} gradient buffers as its job.grad_reduce records; {trainer}'s "
            f"config keeps {runs} (set job.grad_reduce to {runs} in the file, or plan again, to cost that)"]
