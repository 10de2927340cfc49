"""Plan documents -> launch configs: the trainer options, the files a trainer writes for a plan (with --strict),
and where they go (`plan --out DIR`, `emit --out`)."""

from __future__ import annotations

import os
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from autotune.catalog import load_hardware
from autotune.cli.inputs import load_cost_profile, recorded_overlaps
from autotune.cli.options import TORCHTITAN_FORMATS, show_warnings
from autotune.cli.searching import without_timings
from autotune.costmodel.estimate import CostModel
from autotune.emit import TRAINERS, EmitInput, EmitResult
from autotune.emit import emit as emit_config
from autotune.emit.document import PLAN_FILE, emit_input_from_document
from autotune.errors import AutotuneError, SpecError
from autotune.fileio import write_file, write_files
from autotune.render.common import dump_json, rounded
from autotune.search.scaling import DEFAULT_TRAIN_TOKENS
from autotune.search.trainers import reestimator
from autotune.specs.limits import check_train_tokens
from autotune.specs.trainers import TrainerCaps, caps_for


# ------------------------------------------------------------------------------------- plan documents -> configs
def document_reestimator(inp: EmitInput, doc: dict[str, Any] | None = None) -> tuple[Any, EmitInput]:
    """The cost model of a saved plan's job (its catalog GPU, the shipped measured profile if any), for the
    headers of what a trainer really runs; None when the GPU is not in the catalog (headers then say so). With
    the document: where it was priced from the same op costs, its stored predictions are checked against its plan
    and replaced, with a warning, when they do not match (a plan.json edited by hand); a dtype the GPU has no
    tensor cores for is a warning too (HardwareSpec.dtype_warnings)."""
    try:
        hw = replace(load_hardware(inp.gpu), gpus_per_node=inp.gpus_per_node)
        cm = CostModel(inp.model, hw, inp.job, load_cost_profile(None, inp.gpu, inp.model, hw, inp.job))
    except AutotuneError as exc:
        if doc is not None:
            show_warnings([f"--plan: its job.gpu {inp.gpu!r} cannot be costed ({exc}); the files state the "
                           "document's stored predictions, unchecked"])
        return None, inp
    if doc is not None:
        show_warnings(hw.kernel_warnings(inp.job.dtype, inp.job.flash_attention))
    figures = reestimator(cm)
    if doc is not None and doc.get("op_costs") == cm.op_coverage(inp.plan).as_dict():
        # a checked config's document records the overlaps it leaves off, which its stored figures include
        off = recorded_overlaps(doc["job"] if isinstance(doc.get("job"), dict) else {}, "--plan")
        now = tuple(rounded(x) for x in figures(inp.plan, replace(inp.job, **off)))
        if now != (inp.step_time_s, inp.peak_memory_gib, inp.mfu):
            show_warnings([f"the plan's stored predictions (step {inp.step_time_s:.3f} s, {inp.peak_memory_gib:.1f} "
                           f"GiB) are not those of its plan (edited since?): the files state its estimate, step "
                           f"{now[0]:.3f} s, {now[1]:.1f} GiB"])
        left = [k for k, on in off.items() if on is False or on == "unfused"]
        if left:
            now = tuple(rounded(x) for x in figures(inp.plan, inp.job))
            show_warnings([f"the checked config left {', '.join(left)} off; the files turn it on, and state that "
                           f"estimate, step {now[0]:.3f} s"])
        inp = replace(inp, step_time_s=now[0], peak_memory_gib=now[1], mfu=now[2])
    return figures, inp


def trainer_caps(trainer: str | None, fork: str | None) -> TrainerCaps | None:
    """--trainer (and --fork) as the capability row the search is restricted to; None: no restriction."""
    if trainer is None:
        if fork is not None:
            raise SpecError(f"--fork {fork} names a fork of a trainer; add --trainer megatron")
        return None
    return caps_for(trainer, fork)


def check_emit_options(trainer: str | None, torchtitan_format: str | None, strict: bool) -> None:
    """The trainer and the options that only make sense with one."""
    if trainer is None:
        if strict or torchtitan_format is not None:
            raise SpecError("--strict and --torchtitan-format apply to a launch config; add --trainer")
        return
    if trainer not in TRAINERS:
        raise SpecError(f"--trainer {trainer!r}: unknown trainer; use one of {', '.join(TRAINERS)}")
    if torchtitan_format not in (None, *TORCHTITAN_FORMATS):
        raise SpecError(f"--torchtitan-format {torchtitan_format!r}: use one of {', '.join(TORCHTITAN_FORMATS)}")


def launch_config(trainer: str, inp: EmitInput, *, torchtitan_format: str | None, strict: bool,
                  reestimate: Any = None, mock_data: bool = False,
                  train_tokens: float = DEFAULT_TRAIN_TOKENS) -> EmitResult:
    """The trainer's files for a plan; under --strict any warning is an error (shown first, nothing written).
    `reestimate` prices what the trainer really runs, for the files' headers (emit/common.py); `mock_data` and
    `train_tokens` shape the run (emit/runfiles.py)."""
    check_train_tokens(train_tokens)
    inp = replace(inp, reestimate=reestimate, mock_data=mock_data, train_tokens=train_tokens)
    result = emit_config(trainer, inp, torchtitan_format=torchtitan_format or TORCHTITAN_FORMATS[0])
    if strict and result.warnings:
        show_warnings(result.warnings)
        raise SpecError(f"--strict: {trainer} cannot express this plan exactly (the warnings above say where); "
                        "nothing was written")
    return result


def save_plan(out: str, doc: dict[str, Any], trainer: str | None, *, torchtitan_format: str | None,
              strict: bool, reestimate: Any = None, mock_data: bool = False,
              train_tokens: float = DEFAULT_TRAIN_TOKENS) -> list[Path]:
    """`plan --out DIR`: plan.json and, with a trainer, its launch config, built from that same document (so
    that `autotune emit --plan DIR/plan.json` gives the same bytes); all written atomically."""
    files, warnings = [(PLAN_FILE, dump_json(without_timings(doc)) + "\n")], ()
    if trainer is not None:
        inp = emit_input_from_document(doc, PLAN_FILE)
        result = launch_config(trainer, inp, torchtitan_format=torchtitan_format, strict=strict,
                               reestimate=reestimate, mock_data=mock_data, train_tokens=train_tokens)
        files, warnings = files + list(result.files), result.warnings
    written = write_files(Path(out), files)
    show_warnings((*warnings, *stale_launch_files(Path(out), [name for name, _ in files])))
    return written


#: The files some trainer's launch config is made of (emit/*.py): one left in --out DIR from an earlier plan
#: for another trainer would sit beside a plan.json that no longer describes it
LAUNCH_FILES = ("launch_*.sh", "sbatch_*.sh", "ds_config.json", "ds_pipeline.json", "torchtitan.toml",
                "torchtitan_overrides.txt", "autotune_torchtitan_config.py", "colossalai_config.py")


def stale_launch_files(directory: Path, written: list[str]) -> list[str]:
    """A warning naming the launch files in `directory` this run did not write (none: no warning)."""
    stale = sorted({p.name for pattern in LAUNCH_FILES for p in directory.glob(pattern) if p.is_file()} - set(written))
    if not stale:
        return []
    return [f"--out {directory}: {', '.join(stale)} from an earlier run sit beside this plan.json, which does not "
            "describe them; remove them, or use a new --out"]


def write_launch(out: str | None, trainer: str, result: EmitResult) -> list[Path]:
    """`emit`'s output: a single file to stdout (no --out) or to --out FILE / into --out DIR; several files need
    --out DIR. Writes are atomic; returns the paths written."""
    files = list(result.files)
    if out is None:
        if len(files) != 1:
            raise SpecError(f"{trainer} writes {len(files)} files ({', '.join(n for n, _ in files)}); give --out DIR")
        typer.echo(files[0][1], nl=False)
        return []
    target = Path(out)
    if len(files) == 1 and not (target.is_dir() or out.endswith(("/", os.sep))):
        name, text = files[0]  # a torchtitan TOML's run line names the file it reads: the one written, as given
        return [write_file(target, text.replace(f"--job.config_file {name}", f"--job.config_file {shlex.quote(out)}"))]
    if target.suffix and not target.is_dir():  # --out run.sh for several files: a directory of that name, said
        show_warnings([f"--out {out}: {trainer} writes {len(files)} files, so {out} is a directory holding them"])
    return write_files(target, files)
