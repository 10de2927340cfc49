"""Plan documents (`autotune plan --json`, plan.json) read back into what an emitter needs.

A document carries the plan, the model's shape ("model_spec"), the job and the predicted figures, so that a
launch config can be emitted later, elsewhere, without re-planning."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autotune.catalog import catalog_twin, load_model
from autotune.emit import EmitInput
from autotune.errors import InvalidPlanError, SpecError
from autotune.specs._strict import boolean, choice, nonneg_float, positive_float, positive_int, text
from autotune.specs.job import (ATTENTION_BACKENDS, CROSS_ENTROPIES, DTYPES, GRAD_REDUCES, MOE_DISPATCHERS,
                               OPTIMIZER_STATES, JobSpec, check_moe_imbalance)
from autotune.specs.job import TRAINERS as JOB_TRAINERS
from autotune.specs.limits import check_name
from autotune.specs.model import ModelSpec, model_from_dict
from autotune.specs.plan import check_plan, plan_from_dict
from autotune.specs.trainers import FORK_CAPS, TRAINER_CAPS

PLAN_FILE = "plan.json"
_PREDICTIONS = ("step_time_s", "peak_memory_gib", "mfu")
_JOB_KEYS = ("gpu", "gpus_per_node", "global_batch", "seq_len")


def emit_input_from_document(doc: Any, where: str, model: str | None = None) -> EmitInput:
    """Rebuild what an emitter needs from a `plan --json` document (or plan.json): the plan, the model (from
    "model_spec", else the catalog model "job.model"), the job and the predicted figures. The plan is checked
    against the model on its own GPU count; `model`, when given, must be the model the plan is for."""
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: expected a JSON object, the output of `autotune plan --json` or plan.json")
    job = doc.get("job") if isinstance(doc.get("job"), dict) else {}
    missing = [k for k in ("plan", *_PREDICTIONS) if k not in doc] + [f"job.{k}" for k in _JOB_KEYS if k not in job]
    if "model_spec" not in doc and "model" not in job:
        missing.append("model_spec (or job.model)")
    if missing:
        raise SpecError(f"{where}: missing {', '.join(missing)}; save the plan with `autotune plan --json` or "
                        "`autotune plan --out DIR` (plan.json)")
    spec = document_model(doc, job, where)
    if model is not None:
        _check_same_model(spec, model, where)
    job_spec = _document_job(job, where)
    if spec.is_moe and "moe_imbalance" in job:
        check_moe_imbalance(job_spec.moe_imbalance, spec.num_experts, spec.moe_top_k, spec.name,
                            f"{where}: job.moe_imbalance")
    plan = plan_from_dict(doc["plan"], f"{where}: plan", job_spec.trainer)
    if "gpus" in job and positive_int(job, "gpus", f"{where}: job") != plan.num_gpus:
        raise SpecError(f"{where}: job.gpus {job['gpus']} but the plan's tp*pp*dp*cp = {plan.num_gpus}; the "
                        "document was edited by hand: plan again, or make them agree")
    gpus_per_node = positive_int(job, "gpus_per_node", f"{where}: job")
    try:
        check_plan(plan, spec, job_spec, plan.num_gpus, gpus_per_node, allow_cross_node_tp=True)
    except InvalidPlanError as exc:
        raise InvalidPlanError(f"{where}: the plan does not fit model {spec.name}: {exc}") from None
    searched = document_trainer(doc, where)
    return EmitInput(plan=plan, model=spec, job=job_spec, gpu=check_name(job["gpu"], "gpu", f"{where}: job"),
                     searched_for=None if searched is None else searched.split("+")[0],
                     gpus_per_node=gpus_per_node, step_time_s=positive_float(doc, "step_time_s", where),
                     peak_memory_gib=nonneg_float(doc, "peak_memory_gib", where),
                     mfu=nonneg_float(doc, "mfu", where),
                     usable_memory_gib=nonneg_float(doc, "usable_memory_gib", where) if "usable_memory_gib" in doc
                     else 0.0)


def _document_job(job: dict, where: str) -> JobSpec:
    """The JobSpec a document's job block records; a setting JobSpec refuses names the file and its job block."""
    try:
        return JobSpec(global_batch=positive_int(job, "global_batch", f"{where}: job"),
                       seq_len=positive_int(job, "seq_len", f"{where}: job"),
                       dtype=choice(job, "dtype", DTYPES, f"{where}: job") if "dtype" in job else "bf16",
                       flash_attention=boolean(job, "flash_attention", f"{where}: job") if "flash_attention" in job
                       else True,
                       fused_kernels=boolean(job, "fused_kernels", f"{where}: job") if "fused_kernels" in job
                       else True,
                       grad_reduce=choice(job, "grad_reduce", GRAD_REDUCES, f"{where}: job")
                       if "grad_reduce" in job else "fp32",
                       optimizer_states=choice(job, "optimizer_states", OPTIMIZER_STATES, f"{where}: job")
                       if "optimizer_states" in job else "fp32",
                       moe_dispatcher=choice(job, "moe_dispatcher", MOE_DISPATCHERS, f"{where}: job")
                       if "moe_dispatcher" in job else "alltoall",
                       **({"moe_imbalance": positive_float(job, "moe_imbalance", f"{where}: job")}
                          if "moe_imbalance" in job else {}),
                       **({"moe_capacity_factor": positive_float(job, "moe_capacity_factor", f"{where}: job")}
                          if "moe_capacity_factor" in job else {}),
                       **({"moe_pad_to_capacity": boolean(job, "moe_pad_to_capacity", f"{where}: job")}
                          if "moe_pad_to_capacity" in job else {}),
                       trainer=choice(job, "kernels", JOB_TRAINERS, f"{where}: job") if "kernels" in job
                       else "megatron",  # type: ignore[arg-type]
                       attention_backend=choice(job, "attention_backend", ATTENTION_BACKENDS, f"{where}: job")
                       if "attention_backend" in job else None,  # type: ignore[arg-type]
                       # a checked config's fused loss kernel is kept; its unfused loss autotune's files fuse
                       cross_entropy=_fused_loss(job, where))  # type: ignore[arg-type]
    except SpecError as exc:
        if str(exc).startswith(where):
            raise
        raise SpecError(f"{where}: job: {exc}") from None


def _fused_loss(job: dict, where: str) -> str | None:
    """The fused loss kernel a document's job block records (`check --json` of a Megatron config), else None."""
    if "cross_entropy" not in job:
        return None
    kernel = choice(job, "cross_entropy", CROSS_ENTROPIES, f"{where}: job")
    return None if kernel == "unfused" else kernel


def document_trainer(doc: Any, where: str) -> str | None:
    """The trainer a saved plan was searched for ("trainer": "megatron", "megatron+vocab-parallel", ...), or None
    (searched without --trainer, or a document older than the key)."""
    name = doc.get("trainer") if isinstance(doc, dict) else None
    if name is None:
        return None
    known = [*TRAINER_CAPS, *(caps.name for caps in FORK_CAPS.values())]
    if name not in known:
        raise SpecError(f"{where}: trainer must be one of {', '.join(known)} or null, got {name!r}")
    return name


def document_model(doc: dict[str, Any], job: dict[str, Any], where: str) -> ModelSpec:
    if "model_spec" not in doc:
        return load_model(text(job, "model", f"{where}: job"))
    data = doc["model_spec"]
    if isinstance(data, dict) and data.get("max_position_embeddings") == 0:  # 0 = none, which the reader omits
        data = {k: v for k, v in data.items() if k != "max_position_embeddings"}
    spec = model_from_dict(data, f"{where}: model_spec")
    if isinstance(job.get("model"), str) and job["model"] != spec.name:
        raise SpecError(f"{where}: job.model {job['model']!r} is not model_spec's name {spec.name!r}; the document "
                        "was edited by hand: plan again, or make them agree")
    if spec.catalog_name:  # trainers' registries go by it: it must be the catalog model it names
        twin = catalog_twin(spec)
        if twin is None or twin.name != spec.catalog_name:
            raise SpecError(f"{where}: model_spec.catalog_name {spec.catalog_name!r} is not this model's catalog "
                            "twin (its shape differs); drop catalog_name or fix the shape")
    return spec


def _check_same_model(spec: ModelSpec, name: str, where: str) -> None:
    """`--model M` beside a plan: the same catalog name, or a model of the same shape."""
    if name == spec.name:
        return
    other = load_model(name)
    if replace(other, name="", source="") != replace(spec, name="", source=""):
        raise SpecError(f"{where} is for model {spec.name}, not {name}; drop --model or plan for {name}")
