"""`autotune check CONFIG`: the plan an existing launch config runs, its estimate, and the best plan under the
same constraints; exit 5 when a stage is predicted out of memory, 4 when the best plan is faster by more than
--max-gap percent. Registered in cli/app.py; the reading is in autotune/check/.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from autotune.check.findings import (EXIT_LIMIT, Finding, binding_term, exit_code, gain_pct, gap_finding,
                                     github_line, memory_findings, trainer_space)
from autotune.check.reading import Reading, in_config_terms
from autotune.check.understood import CHECK_TRAINERS, Understood, read_config, understand
from autotune.cli.inputs import check_flush, load_cost_profile
from autotune.cli.launch import launch_config
from autotune.cli.options import (GpuOpt, GpusOpt, GpusPerNodeOpt, JsonOpt, MoeImbalanceOpt, WorkLimitOpt,
                                  check_moe_flags, check_simulation_size, load_cluster, moe_imbalance_flag,
                                  show_warnings)
from autotune.cli.searching import run_search
from autotune.costmodel.accumulation import flushed_estimate
from autotune.costmodel.estimate import CostModel, Estimate
from autotune.costmodel.moe import deepep_refusal
from autotune.costmodel.stages import StageMemory
from autotune.emit import EmitInput
from autotune.errors import AutotuneError, InfeasibleError, InvalidPlanError, SpecError
from autotune.fileio import check_target, write_files
from autotune.render.common import bucket_warnings, dump_json, plan_line, plan_tag, precision_words, written_report
from autotune.render.estimate import estimate_json
from autotune.search.pins import check_space
from autotune.search.planner import DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import OVERLAP_KEYS, JobSpec
from autotune.specs.plan import check_plan
from autotune.specs.trainer_jobs import runs_mtp
from autotune.specs.trainers import TRAINER_CAPS, seq_len_issue
from autotune.units import gib

FORMATS = ("text", "github")


def check_command(
    config: Annotated[Path, typer.Argument(metavar="CONFIG", help="A Megatron-LM launch script or file of "
                                           "pretrain_gpt.py arguments, a torchtitan TOML (0.2.x) or overrides "
                                           "(0.3.x), or a DeepSpeed JSON.")],
    gpu: GpuOpt, gpus: GpusOpt,
    trainer: Annotated[str | None, typer.Option("--trainer", metavar="|".join(CHECK_TRAINERS),
                                                help="The config's trainer (default: detected).")] = None,
    model: Annotated[str | None, typer.Option("--model", metavar="NAME|FILE", help="The model, where the config "
                                              "does not define it (DeepSpeed always).")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="Tokens per sequence, where the config does not "
                                                "give it (DeepSpeed).")] = None,
    gpus_per_node: GpusPerNodeOpt = None, moe_imbalance: MoeImbalanceOpt = None,
    max_gap: Annotated[float | None, typer.Option("--max-gap", metavar="PCT", help="Exit 4 when the best plan is "
                                                  "faster by more than PCT percent.")] = None,
    output_format: Annotated[str, typer.Option("--format", metavar="text|github", help="github: one workflow "
                                               "annotation line per finding.")] = "text",
    emit_better: Annotated[str | None, typer.Option("--emit-better", metavar="DIR", help="Write the best plan's "
                                                    "config for the same trainer into DIR.")] = None,
    json_out: JsonOpt = False, work_limit: WorkLimitOpt = DEFAULT_WORK_LIMIT,
    time_limit: Annotated[float, typer.Option("--time-limit", metavar="S", help="Wall-clock safety net of the "
                                              "search, in seconds.")] = DEFAULT_TIME_LIMIT_S,
) -> None:
    """Read a launch config, predict it, and compare it with the best plan under the same constraints
    (exit 5: a stage out of memory; 4: the best plan faster than --max-gap)."""
    _check_flags(output_format, json_out, max_gap, time_limit, work_limit, emit_better)
    with _annotated(output_format, config):  # in a workflow, a config it cannot read is annotated too
        kind, reading, fmt = read_config(config, trainer, gpus)
        hw = load_cluster(gpu, gpus_per_node or reading.launch[0])  # a node as the launcher starts it
        u = _understood(config, reading, kind, fmt, gpus, hw, model, seq_len, moe_imbalance)
        measured = load_cost_profile(None, gpu, u.model, hw, u.job)
        cm = CostModel(u.model, hw, u.job, measured)
        est = cm.estimate(u.plan) if u.flushes == 1 else _flushed(u, hw, measured, config, gpus)
        if reading.shard_replicas > 1:
            est = _sharded_memory(est, u, config, reading.shard_replicas)
        if u.trainer == "torchtitan" and not u.job.fused_kernels:
            u = replace(u, notes=(*u.notes, _compile_note(est, u, hw, measured)))
        best, search_note, unproven = _best(u, hw, gpus, measured, time_limit, work_limit)
        findings = _findings(est, best, max_gap, u.notes + hw.kernel_warnings(u.job.dtype, u.job.flash_attention),
                             search_note)
        if unproven:
            findings.append(Finding("warning", "the best plan is not proven the best: --time-limit or --work-limit "
                                    "stopped its search (a better plan may exist; raise the limit)", EXIT_LIMIT))
        written = _emit_better(emit_better, u, best, hw) if emit_better is not None and best is not None else []
        code = exit_code(findings)
        if json_out:
            doc = {**estimate_json(est, u.model, hw, u.job), "op_costs": cm.op_coverage(u.plan).as_dict(),
                   "check": _check_json(config, u, est, best, findings, max_gap, written, code)}
            typer.echo(dump_json(doc))
        else:
            _print_report(output_format, config, u, est, best, hw, findings, written, search_note)
        if code:
            raise typer.Exit(code)


def _check_flags(output_format: str, json_out: bool, max_gap: float | None, time_limit: float, work_limit: float,
                 emit_better: str | None) -> None:
    """The flags' own rules, before any file is read."""
    if output_format not in FORMATS:
        raise SpecError(f"--format {output_format!r}: use text or github")
    if json_out and output_format != "text":
        raise SpecError("--json and --format github each replace the report; pick one")
    if max_gap is not None and not max_gap >= 0:
        raise SpecError(f"--max-gap must be >= 0 percent, got {max_gap:g}")
    if not time_limit > 0:  # also NaN: as plan refuses them
        raise SpecError(f"--time-limit must be > 0 seconds, got {time_limit:g}")
    if not work_limit > 0:
        raise SpecError(f"--work-limit must be > 0, got {work_limit:g}")
    if emit_better is not None:
        check_target(Path(emit_better), directory=True, flag="--emit-better")


def _understood(config: Path, reading: Reading, kind: str, fmt: str | None, gpus: int, hw: HardwareSpec,
                model: str | None, seq_len: int | None, moe_imbalance: float | None) -> Understood:
    """What the config runs, with the launcher's notes, refused (in the config's own terms) where it breaks a
    rule the trainer or autotune enforces."""
    if moe_imbalance is not None:  # the run's routing, which no flag of the config sets
        moe_imbalance_flag(moe_imbalance)
    try:
        u = understand(config, reading, trainer=kind, fmt=fmt, gpus=gpus, model_arg=model, seq_len_arg=seq_len,
                       imbalance_arg=moe_imbalance)
    except SpecError as exc:
        raise type(exc)(in_config_terms(str(exc), kind)) from None
    check_moe_flags(u.model, moe_imbalance, "alltoall", None, False)
    if reading.fp32:  # twice the 16-bit weights, gradients and activations: a fit verdict would be the model's
        fix = "add --bf16" if kind == "megatron" else 'add "bf16": {"enabled": true}'
        raise SpecError(f"{config}: the config trains in fp32 (no 16-bit precision set), which autotune does not "
                        f"cost (it costs 16-bit and fp8 training, with half fp32's memory); {fix} to check that run")
    u = replace(u, notes=u.notes + launch_notes(reading.launch, gpus, hw.gpus_per_node)
                + tuple(bucket_warnings(u.plan, u.model) if reading.bucket_size is not None else ()))
    try:
        check_plan(u.plan, u.model, u.job, gpus, hw.gpus_per_node, allow_cross_node_tp=True)
    except InvalidPlanError as exc:
        default = (f" (no --global-batch-size: Megatron's default is --micro-batch-size x data-parallel size = "
                   f"{u.job.global_batch})" if kind == "megatron" and reading.global_batch is None else "")
        if kind == "torchtitan" and u.plan.schedule == "interleaved" and u.plan.num_microbatches % u.plan.pp:
            default = (" (torch's ScheduleInterleaved1F1B runs it, in rounds of max(1, micro-batches // pp); "
                       "autotune costs Megatron's interleaved order, which needs whole rounds of pp: not costed "
                       "here; a pipeline_parallel_microbatch_size that leaves a multiple of pp micro-batches is)")
        raise InvalidPlanError(in_config_terms(f"{config}: the plan it runs breaks a rule: {exc}{default}", kind)
                               ) from None
    if (issue := seq_len_issue(TRAINER_CAPS[u.trainer], u.plan, u.job.seq_len)) is not None:
        raise SpecError(f"{config}: {issue} (the trainer refuses it at start-up); change the sequence length")
    check_simulation_size(u.plan, str(config))
    if u.model.is_moe and u.job.moe_dispatcher == "deepep" and (why := deepep_refusal(hw)):
        raise SpecError(f"{config}: --moe-flex-dispatcher-backend deepep: {why}; use --moe-token-dispatcher-type "
                        "alltoall")
    return u


def _print_report(output_format: str, config: Path, u: Understood, est: Estimate, best: Estimate | None,
                  hw: HardwareSpec, findings: list[Finding], written: list[Path], search_note: str | None) -> None:
    """The text report (its verdicts on stderr) or one GitHub workflow annotation per finding."""
    if output_format == "github":
        summary = Finding("notice", f"{u.trainer}: {plan_tag(u.plan)}: step {est.step_time_s:.3f} s, MFU "
                                    f"{100 * est.mfu:.1f}%, peak {gib(est.peak_memory_bytes):.1f} GiB")
        for finding in [summary, *findings]:
            typer.echo(github_line(finding, str(config)))
        return
    typer.echo(_report(config, u, est, best, hw, search_note))
    if written:
        typer.echo(written_report(written))
    for f in findings:  # the verdicts behind the exit code are diagnostics: stderr, as every error
        if f.level != "notice":
            typer.echo(f"{f.level}: {f.message}", err=True)


@contextmanager
def _annotated(output_format: str, config: Path) -> Iterator[None]:
    """With --format github, an error also becomes the file's `::error` annotation (its exit code unchanged)."""
    try:
        yield
    except AutotuneError as exc:
        if output_format == "github":
            typer.echo(github_line(Finding("error", " ".join(str(exc).split()), exc.exit_code), str(config)))
        raise


def launch_notes(launch: tuple[int | None, int | None], gpus: int, per_node: int) -> tuple[str, ...]:
    """What the script's launcher starts, where it is not what is checked (torchrun --nproc_per_node x --nnodes
    against --gpus and the node size)."""
    starts, nodes = launch
    out = []
    if starts is not None and starts != per_node:
        out.append(f"the launcher starts {starts} GPUs a node (--nproc_per_node); checked with --gpus-per-node "
                   f"{per_node}")
    if starts is not None and nodes is not None and starts * nodes != gpus:
        out.append(f"the launcher starts {nodes} x {starts} = {starts * nodes} GPUs (--nnodes x --nproc_per_node); "
                   f"checked here at --gpus {gpus}")
    return tuple(out)


def _compile_note(est: Estimate, u: Understood, hw: HardwareSpec, measured: Any) -> str:
    """What torch.compile would give a torchtitan config that leaves it off: the same plan with fused kernels."""
    job = replace(u.job, fused_kernels=True)
    fused = flushed_estimate(u.model, hw, job, measured, u.plan, u.flushes)
    return (f"no torch.compile of the model: eager kernels (norms, RoPE, SwiGLU, residual adds each a pass over "
            f"memory), costed so, the best plan too; compiling it ([compile] enable, --compile.enable) predicts "
            f"{fused.step_time_s:.3f} s a step, {100 * (1 - fused.step_time_s / est.step_time_s):.1f}% less")


def _sharded_memory(est: Estimate, u: Understood, config: Path, replicas: int) -> Estimate:
    """est with the memory of a run whose state is sharded over 1/replicas of its data-parallel ranks (torchtitan's
    HSDP, Megatron's distributed-optimizer instances): what the ZeRO stage shards (the optimizer from stage 1, the
    gradients from 2, the weights from 3) is `replicas` times larger, whether over dp x cp or over the experts'
    data-parallel ranks; megatron-core's parallel_state asserts that both divide by the instances."""
    p = u.plan
    if (p.dp * p.cp) % replicas or p.expert_dp % replicas:
        raise SpecError(f"{config}: {replicas} distributed-optimizer instances (or HSDP replicas) must divide the data "
                        f"x context-parallel size {p.dp * p.cp} and the expert data-parallel size {p.expert_dp} "
                        "(megatron-core parallel_state asserts both); change the instances or the degrees")
    z = p.zero

    def widened(m: StageMemory) -> StageMemory:
        return m._replace(weights=m.weights * (replicas if z >= 3 else 1),
                          gradients=m.gradients * (replicas if z >= 2 else 1),
                          optimizer=m.optimizer * (replicas if z >= 1 else 1))

    return replace(est, stages=tuple(s._replace(memory=widened(s.memory)) for s in est.stages))


def _flushed(u: Understood, hw: HardwareSpec, measured: Any, config: Path, gpus: int) -> Estimate:
    """The step of a config that runs its pipeline schedule u.flushes times (costmodel/accumulation.py)."""
    check_flush(u.plan, u.model, u.job, gpus, hw.gpus_per_node, u.flushes, str(config))
    return flushed_estimate(u.model, hw, u.job, measured, u.plan, u.flushes)


def _best(u: Understood, hw: HardwareSpec, gpus: int, measured: Any, time_limit: float,
          work_limit: float) -> tuple[Estimate | None, str | None, bool]:
    """The best plan the trainer runs on the same GPUs and job, or None and why; and whether a limit stopped its
    search before it was proven the best. It is costed as autotune's config of it runs (as_emitted)."""
    space = trainer_space(u.trainer, u.plan)
    try:
        check_space(space, u.model, as_emitted(u.job), gpus, hw.gpus_per_node)  # an MoE model DeepSpeed gets no
        # config for has no best plan to propose (plan --trainer refuses it alike)
        result = run_search(u.model, hw, as_emitted(u.job), gpus, space, top_k=0,
                            time_limit_s=time_limit, profile=measured, work_limit=work_limit)
    except (InfeasibleError, SpecError) as exc:  # nothing to compare with: the config's own verdict stands
        return None, str(exc), False
    return result.best, None, result.status != "OPTIMAL"


def _findings(est: Estimate, best: Estimate | None, max_gap: float | None, notes: tuple[str, ...],
              search_note: str | None) -> list[Finding]:
    # a config that does not fit has no step time to compare: its finding is the memory, exit 5
    gap = gap_finding(est, best, max_gap) if est.fits else None
    findings = memory_findings(est) + ([gap] if gap is not None else [])
    findings += [Finding("notice", note) for note in notes]
    if search_note is not None:
        findings.append(Finding("notice", f"no best plan to compare with: {search_note}"))
    return findings


def as_emitted(job: JobSpec) -> JobSpec:
    """The job as autotune's own config runs it: the overlaps a config may leave off (Megatron's
    --overlap-grad-reduce, --overlap-param-gather and p2p overlap, DeepSpeed's overlap_comm) are written on by
    every emitter, and so is Megatron's --cross-entropy-loss-fusion (the config's fused kernel, else the trainer's
    own)."""
    fused = job.cross_entropy if job.cross_entropy != "unfused" else None
    return replace(job, cross_entropy=fused, **dict.fromkeys(OVERLAP_KEYS, True))


def _emit_better(out: str, u: Understood, best: Estimate, hw: HardwareSpec) -> list[Path]:
    inp = EmitInput(plan=best.plan, model=u.model, job=as_emitted(u.job), gpu=hw.name, gpus_per_node=hw.gpus_per_node,
                    step_time_s=best.step_time_s, peak_memory_gib=gib(best.peak_memory_bytes), mfu=best.mfu,
                    usable_memory_gib=gib(best.usable_memory_bytes))
    result = launch_config(u.trainer, inp, torchtitan_format=u.torchtitan_format, strict=False)
    written = write_files(Path(out), list(result.files), flag="--emit-better")
    show_warnings(result.warnings)
    return written


def _brief(est: Estimate | None) -> dict[str, Any] | None:
    if est is None:
        return None
    return {"plan": est.plan.to_dict(), "step_time_s": round(est.step_time_s, 6),
            "tokens_per_s": round(est.tokens_per_s, 6), "mfu": round(est.mfu, 6),
            "peak_memory_gib": round(gib(est.peak_memory_bytes), 6), "fits": est.fits}


def _check_json(config: Path, u: Understood, est: Estimate, best: Estimate | None, findings: list[Finding],
                max_gap: float | None, written: list[Path], code: int) -> dict[str, Any]:
    stages = []
    for s in est.stages:
        term, size = binding_term(s)
        stages.append({"stage": s.index, "memory_gib": round(gib(s.memory.total), 6), "binding_term": term,
                       "binding_gib": round(gib(size), 6), "fits": s.memory.total <= est.usable_memory_bytes})
    return {"config": str(config), "trainer": u.trainer, "torchtitan_format": u.torchtitan_format,
            "pipeline_flushes": u.flushes,  # runs of the schedule a step (torchtitan's accumulation with a pipeline)
            "notes": list(u.notes), "stages": stages, "best": _brief(best),
            "gain_pct": None if best is None or not est.fits else round(gain_pct(est, best), 6), "max_gap_pct": max_gap,
            "findings": [f.as_dict() for f in findings], "emitted": [str(p) for p in written], "exit_code": code}


def _kernel_words(u: Understood) -> str:
    """The kernels the config runs, as costed: torchtitan's fused kernels are torch.compile's (off by default),
    the other trainers' their own unless the config turns the fusions off."""
    if u.trainer == "torchtitan":
        return "torchtitan kernels, " + ("the model under torch.compile" if u.job.fused_kernels else
                                         "the model eager (no torch.compile: costed unfused)")
    return f"{u.trainer} kernels" + ("" if u.job.fused_kernels else ", fusions off (costed unfused)")


def _report(config: Path, u: Understood, est: Estimate, best: Estimate | None, hw: HardwareSpec,
            search_note: str | None = None) -> str:
    job, usable = u.job, gib(est.usable_memory_bytes)
    lines = [f"config: {config} ({u.trainer}" + (f", {u.torchtitan_format}" if u.torchtitan_format else "") + ")",
             f"understood: {u.model.name}" + (f" with {mtp} MTP module(s)" if (mtp := runs_mtp(u.model, job)) else "")
             + f" on {hw.name} x {u.plan.num_gpus} ({hw.gpus_per_node} per node), global "
             f"batch {job.global_batch} x {job.seq_len} tokens, {precision_words(job)}, {_kernel_words(u)}",
             f"plan: {plan_line(u.plan)}"]
    lines += [f"note: {note}" for note in u.notes]
    lines += ["", f"predicted: step {est.step_time_s:.3f} s, {est.tokens_per_s:,.0f} tokens/s, MFU "
                  f"{100 * est.mfu:.1f}%, peak memory {gib(est.peak_memory_bytes):.2f} of {usable:.2f} GiB usable "
                  f"({'fits' if est.fits else 'DOES NOT FIT'})",
              "memory per stage (GiB), and the largest term:"]
    for s in est.stages:
        term, size = binding_term(s)
        tags = ("E" if s.has_embedding else "") + ("H" if s.has_head else "")
        over = "" if s.memory.total <= est.usable_memory_bytes else "  OUT OF MEMORY"
        lines.append(f"  stage {s.index:>2} {tags:<2} {s.layers:>3} layers  {gib(s.memory.total):7.2f}  "
                     f"{term} {gib(size):.2f}{over}")
    lines.append("")
    if best is None:
        lines.append(f"best plan for {u.trainer}: " + (f"none ({search_note})" if search_note else
                                                        "none fits on these GPUs"))
    else:
        gain = gain_pct(est, best)
        verdict = ("the config does not fit, so its step time is no comparison" if not est.fits else
                   f"{gain:.1f}% faster than the config" if gain >= 0.05 else
                   f"the config is {-gain:.1f}% faster (it uses a setting the search for {u.trainer} does not try)"
                   if gain <= -0.05 else "the config is as fast as the best plan")
        lines += [f"best plan for {u.trainer} on the same GPUs, batch and sequence: {plan_line(best.plan)}",
                  f"  step {best.step_time_s:.3f} s, {best.tokens_per_s:,.0f} tokens/s, MFU {100 * best.mfu:.1f}%, "
                  f"peak memory {gib(best.peak_memory_bytes):.2f} GiB: {verdict}"]
    return "\n".join(lines)
