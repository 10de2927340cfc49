"""Pins -> search space, the search under a progress bar, and what `plan` does with its result (--top, --compare,
--no-timings). Named `searching` so it does not shadow the autotune.search package in readers' minds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from autotune.cli.inputs import (check_flush, document_flushes, plan_source, read_document, recorded_overlaps,
                                 refuse_other_job)
from autotune.cli.options import Pins, check_simulation_size, parse_choice_list, parse_int_list, show_warnings
from autotune.costmodel.accumulation import flushed_estimate
from autotune.emit.document import document_model, document_trainer
from autotune.errors import InvalidPlanError, SolverLimitError, SpecError
from autotune.render.common import plan_brief
from autotune.render.plan import Comparison, search_progress
from autotune.search.pins import check_space
from autotune.search.planner import DEFAULT_WORK_LIMIT, PlanResult, search
from autotune.search.space import SearchSpace, enumerate_candidates, for_trainer
from autotune.search.validate import memory_problem
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from autotune.specs.experts import DEEPEP_GROUP_RULE
from autotune.specs.plan import RECOMPUTES, SCHEDULES, VOCABS, check_plan, plan_from_dict
from autotune.specs.profile import Profile
from autotune.specs.tpgrid import MODES
from autotune.specs.trainer_jobs import as_run_model
from autotune.specs.trainers import TrainerCaps


# ------------------------------------------------------------------------------------------ pins -> search space
def search_space(pins: Pins, model: ModelSpec, job: JobSpec, gpus: int, gpus_per_node: int, *,
                 allow_idle: bool, allow_cross_node_tp: bool, trainer: TrainerCaps | None = None) -> SearchSpace:
    """The pins as a SearchSpace (restricted to what `trainer` runs), after checks that turn contradictory pins
    into one-line errors (exit 1): the planner's own "empty space" error (exit 2) is left for spaces that are
    empty without any pin."""
    space = for_trainer(pins_space(pins, allow_idle=allow_idle, allow_cross_node_tp=allow_cross_node_tp), trainer)
    check_space(space, model, job, gpus, gpus_per_node)
    if pins.given() and next(enumerate_candidates(model, job, gpus, gpus_per_node, space), None) is None:
        deepep = ""
        if model.is_moe and job.moe_dispatcher == "deepep" and next(enumerate_candidates(
                model, replace(job, moe_dispatcher="alltoall"), gpus, gpus_per_node, space), None) is not None:
            deepep = f", and the deepep dispatcher needs {DEEPEP_GROUP_RULE}"  # what emptied the space
        if space.etp is not None and set(space.etp) - {1}:
            deepep += ", etp is 1 or tp (which must divide the attention heads)"
        raise SpecError(f"no valid plan for {gpus} GPUs meets {pins.typed()} together (tp x pp x dp x cp must be "
                        f"{gpus}, dp x mbs must divide --global-batch {job.global_batch}, interleaved needs "
                        f"micro-batches divisible by pp{deepep}); relax a pin")
    return space


def pins_space(pins: Pins, *, allow_idle: bool, allow_cross_node_tp: bool) -> SearchSpace:
    """The pins as a SearchSpace, each list parsed (a bad value is a one-line error); no check against a job."""
    def ints(raw: str | None, flag: str, minimum: int = 1) -> tuple[int, ...] | None:
        return None if raw is None else parse_int_list(raw, flag, minimum=minimum)

    def choices(raw: str | None, flag: str, options: Sequence[str]) -> tuple[str, ...] | None:
        return None if raw is None else parse_choice_list(raw, flag, options)

    layers = ints(pins.layers_per_stage, "--layers-per-stage", minimum=0)
    pp = ints(pins.pp, "--pp")
    return SearchSpace(
        tp=ints(pins.tp, "--tp"), pp=(len(layers),) if pp is None and layers is not None else pp,
        dp=ints(pins.dp, "--dp"), cp=ints(pins.cp, "--cp"), mbs=ints(pins.mbs, "--mbs"), vpp=ints(pins.vpp, "--vpp"),
        schedule=choices(pins.schedule, "--schedule", SCHEDULES),
        recompute=choices(pins.recompute, "--recompute", RECOMPUTES), zero=ints(pins.zero, "--zero", minimum=0),
        vocab=choices(pins.vocab, "--vocab", VOCABS),
        sequence_parallel=None if pins.sequence_parallel is None else (pins.sequence_parallel,),
        tp_overlap=None if pins.tp_overlap is None else (pins.tp_overlap,),
        ep_overlap=None if pins.ep_overlap is None else (pins.ep_overlap,),
        layers_per_stage=layers, allow_idle=allow_idle, allow_cross_node_tp=allow_cross_node_tp,
        tp_mode=choices(pins.tp_mode, "--tp-mode", MODES), ep=ints(pins.ep, "--ep"), etp=ints(pins.etp, "--etp"))


def profiled_space(space: SearchSpace, profile: Profile | None, given: bool, job: JobSpec
                   ) -> tuple[SearchSpace, list[str]]:
    """With a --profile FILE the user gave, the search keeps to the tp, cp and micro-batch sizes it timed (each
    dimension the command line leaves free): outside them every op falls back to the roofline, which is far from
    a profile timed on another device (a CPU: about 100x), so the search would drift to the shapes never measured
    (user-tester: a CPU profile of tp 1-4 made tp 4, mbs 8 'best', every op by the roofline). The note says so."""
    if profile is None or not given or not profile.ops or profile.seq_len != job.seq_len or (
            profile.dtype not in (None, job.dtype)):  # timed for another job: it covers none of its shapes
        return space, []
    timed = {"tp": sorted({p.tp for p in profile.ops}), "cp": sorted({p.cp for p in profile.ops}),
             "mbs": sorted({p.mbs for p in profile.ops})}
    free = {dim: tuple(values) for dim, values in timed.items() if getattr(space, dim) is None}
    if not free:
        return space, []
    said = ", ".join(f"{dim} {','.join(map(str, values))}" for dim, values in free.items())
    return replace(space, **free), [f"--profile {profile.path}: searching the shapes it timed ({said}); pin --tp, "
                                    "--cp or --mbs to search others, costed by the roofline"]


def _shape(model: ModelSpec, *, windows: bool = True) -> ModelSpec:
    """A model without its names (a config.json and its catalog twin compare equal); without windows also
    without its sliding window (one a trainer does not build: as_run_model)."""
    out = replace(model, name="", source="", catalog_name="")
    return out if windows else replace(out, sliding_window=0, sliding_window_layers=0)


def _same_model_name(theirs: ModelSpec | None, recorded: dict[str, Any], model: ModelSpec) -> str:
    """The name the document must record for `model`: its own, or the document's where the document's model_spec
    is the same model (a config.json planned, compared under its catalog name, or the other way round)."""
    named = recorded.get("model")
    if theirs is None or not isinstance(named, str) or named == model.name:
        return model.name
    return named if _shape(theirs, windows=False) == _shape(model, windows=False) else model.name


def _said(value: object) -> str:
    """A setting as a plan document writes it (true, not Python's True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def compare_plan(path: str, model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int,
                 space: SearchSpace, profile: Profile | None = None) -> Comparison:
    """The user's plan, checked by the independent validator: rule breaks are errors, not fitting is reported. A
    `plan --json` document of another model, cluster or batch is refused (its plan would be costed for a job it
    was not made for); one planned with other kernels or precision is costed with this run's, with a warning."""
    doc, where = read_document(path, "--compare"), plan_source(path, "--compare")
    plan = plan_from_dict(doc, where, job.trainer)
    recorded = doc.get("job") if isinstance(doc, dict) and isinstance(doc.get("job"), dict) else {}
    theirs = document_model(doc, recorded, where) if isinstance(doc, dict) and "model_spec" in doc else None
    fixed = {"model": _same_model_name(theirs, recorded, model), "gpu": hw.name, "gpus": gpus,
             "gpus_per_node": hw.gpus_per_node, "global_batch": job.global_batch, "seq_len": job.seq_len}
    refuse_other_job(recorded, fixed, where, "compare a plan of the same job, or plan again")
    now = {"dtype": job.dtype, "kernels": job.trainer, "grad_reduce": job.grad_reduce,
           "optimizer_states": job.optimizer_states, "flash_attention": job.flash_attention,
           "fused_kernels": job.fused_kernels}  # a checked torchtitan config without torch.compile: unfused
    if model.is_moe:  # routing as priced (user-tester: a plan of imbalance 1.5 and capacity 1.2 re-costed silently)
        now.update(moe_dispatcher=job.moe_dispatcher, moe_imbalance=job.moe_imbalance,
                   moe_capacity_factor=job.moe_capacity_factor, moe_pad_to_capacity=job.moe_pad_to_capacity)
        if "moe_imbalance" in recorded:  # a document records the capacity only when there is one: dropless
            recorded = {"moe_capacity_factor": 0.0, "moe_pad_to_capacity": False, **recorded}
    differ = [key for key in now if key in recorded and recorded[key] != now[key]]
    if differ:
        show_warnings([f"{where} was planned with {', '.join(f'{k} {_said(recorded[k])}' for k in differ)}; it is "
                       f"costed with this run's ({', '.join(f'{k} {_said(now[k])}' for k in differ)}): give the same "
                       "settings to compare it as planned"])
    searched = document_trainer(doc, where) if theirs is not None else None
    if searched is not None and _shape(as_run_model(theirs, searched.split("+")[0], job.seq_len)) != _shape(model):
        show_warnings([f"{where} was searched for {searched}, whose config builds no sliding window: it is costed "
                       "with this run's model"])
    ran = recorded_overlaps(recorded, where)  # a checked config's overlaps left off and its loss kernel
    if ran:
        job = replace(job, **ran)
        show_warnings([f"{where} records how its config ran ({', '.join(f'{k} {v}' for k, v in sorted(ran.items()))}"
                       "): it is costed so"])
    check_simulation_size(plan, f"--compare {path}")
    # a saved plan states its own tensor-parallel layout, as a launch script does for `check`
    try:
        check_plan(plan, model, job, gpus, hw.gpus_per_node, allow_idle=space.allow_idle, allow_cross_node_tp=True)
    except InvalidPlanError as rule:
        raise SpecError(f"--compare {path}: {rule}") from None
    flushes = document_flushes(doc, plan, where)
    check_flush(plan, model, job, gpus, hw.gpus_per_node, flushes, where)
    if flushes > 1:  # check's document of an accumulating torchtitan config
        show_warnings([f"{where}: check.pipeline_flushes {flushes}: costed as {flushes} runs of its schedule a step, "
                       "as check did"])
    est = flushed_estimate(model, hw, job, profile, plan, flushes)
    return Comparison(path, est, memory_problem(est))


def run_search(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, space: SearchSpace, *, top_k: int,
               time_limit_s: float, profile: Profile | None = None,
               work_limit: float = DEFAULT_WORK_LIMIT) -> PlanResult:
    """`search` under a progress bar; a limit hit with a plan in hand returns it (status FEASIBLE)."""
    if not time_limit_s > 0:
        raise SpecError(f"--time-limit must be > 0 seconds, got {time_limit_s:g}")
    with search_progress(True) as progress:  # on a terminal even with --json: the bar goes to stderr
        try:
            return search(model, hw, job, gpus, space, top_k=top_k, time_limit_s=time_limit_s, progress=progress,
                          profile=profile, work_limit=work_limit)
        except SolverLimitError as exc:
            if isinstance(exc.result, PlanResult):
                return exc.result
            raise


def distinct_fitting(result: PlanResult, top: int) -> PlanResult:
    """`--top K`: the K fastest runners-up that fit, none shown alike (the same choices as the best plan or an
    earlier row, differing only in layer split or bucket), without the candidates that do not fit in memory."""
    seen = {plan_brief(result.best.plan)}
    kept = []
    for runner in result.runners_up:
        key = plan_brief(runner.estimate.plan)
        if runner.estimate.fits and key not in seen:
            seen.add(key)
            kept.append(runner)
    return replace(result, runners_up=tuple(kept[:top]))


def without_timings(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without the solver's wall time (plan.json, --no-timings): the same bytes on every rerun."""
    if isinstance(doc.get("solver"), dict):
        doc = {**doc, "solver": {k: v for k, v in doc["solver"].items() if k != "wall_s"}}
    if isinstance(doc.get("points"), list):
        doc = {**doc, "points": [{k: v for k, v in p.items() if k != "wall_s"} for p in doc["points"]]}
    return doc
