"""The command line of ../shared/CLI.md: typer commands a few lines long over library functions.

`main` is the one place errors become output: every AutotuneError is one red line on stderr and its exit
code. Usage errors (bad option values, unknown options) exit 1 rather than click's 2, because CLI.md gives
2 to "no feasible plan". All formatting lives in render.py; here are only options -> specs.
"""

from __future__ import annotations

from autotune import interrupts

if interrupts.is_entry_point():  # first of all: Ctrl-C during the imports below gets the clean line too
    interrupts.install()

import os  # noqa: E402  (every import below follows the Ctrl-C handling on purpose)
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import dataclass, fields, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import typer  # noqa: E402

from autotune import __version__, render
from autotune.catalog import (
    PROFILES_DIR,
    hardware_names,
    load_hardware,
    load_model,
    load_raw,
    model_names,
    parse_json,
    read_json,
)
from autotune.costmodel.estimate import CostModel
from autotune.costmodel.measured import OpCoverage, check_profile_model, profile_warnings
from autotune.documents import PLAN_FILE, document_trainer, emit_input_from_document
from autotune.emit import TRAINERS, EmitInput, EmitResult
from autotune.emit import emit as emit_config
from autotune.errors import AutotuneError, InfeasibleError, InvalidPlanError, SolverLimitError, SpecError
from autotune.fileio import check_target, slug, write_file, write_files
from autotune.scaling import DEFAULT_EFFICIENCY_THRESHOLD, DEFAULT_TRAIN_TOKENS, global_batch_for_tokens, scale
from autotune.search.planner import DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT, PlanResult, search
from autotune.search.space import SearchSpace, check_space, enumerate_candidates
from autotune.search.trainers import best_per_trainer, reestimator
from autotune.search.validate import validate_plan
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec
from autotune.specs.limits import (
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_JSON_BYTES,
    MAX_PIPELINE_PASSES,
    MAX_SEQ_LEN,
    check_max,
)
from autotune.specs.model import ModelSpec
from autotune.specs.profile import Profile, load_profile
from autotune.specs.tpgrid import MODES
from autotune.specs.trainers import FORK_CAPS, TrainerCaps, caps_for
from autotune.specs.plan import (
    DEFAULT_BUCKET,
    RECOMPUTES,
    SCHEDULES,
    VOCABS,
    Plan,
    check_plan,
    even_split,
    plan_from_dict,
)

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the fastest parallel plan for training a Transformer on a GPU cluster.")



def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"autotune {__version__}")
        raise typer.Exit(0)


@app.callback()
def _global_options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                          help="Print the version and exit.")] = False) -> None:
    """Find the fastest parallel plan for training a Transformer on a GPU cluster."""


# typer >= 0.20 vendors click, older versions use click itself; both export BadParameter, whose base
# ClickException covers every usage error.
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

# ----------------------------------------------------------------------------------- options shared by commands
ModelOpt = Annotated[str, typer.Option("--model", metavar="NAME|FILE",
                                       help="Catalog model (see `autotune models`) or a config.json path.")]
GpuOpt = Annotated[str, typer.Option("--gpu", metavar="NAME|FILE",
                                     help="Catalog GPU (see `autotune hardware`) or a hardware file path.")]
GpusOpt = Annotated[int, typer.Option("--gpus", min=1, max=MAX_GPUS, help=f"GPUs in the job (at most {MAX_GPUS:,}).")]
GpusPerNodeOpt = Annotated[int | None, typer.Option("--gpus-per-node", min=1, max=MAX_GPUS,
                                                    help="GPUs per node (default: from the hardware file).")]
BatchOpt = Annotated[int, typer.Option("--global-batch", help=f"Sequences per optimizer step (at most "
                                       f"{MAX_GLOBAL_BATCH:,}).")]
SeqOpt = Annotated[int, typer.Option("--seq-len", help=f"Tokens per sequence (at most {MAX_SEQ_LEN:,}).")]
DtypeOpt = Annotated[str, typer.Option("--dtype", metavar="bf16|fp16|fp8", help="Matmul dtype.")]
NoFlashOpt = Annotated[bool, typer.Option("--no-flash-attention", help="Unfused attention (s x s scores in HBM).")]
UnfusedOpt = Annotated[bool, typer.Option("--unfused", help="No fused bias/activation/softmax kernels.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
CrossTpOpt = Annotated[bool, typer.Option("--allow-cross-node-tp", help="Allow tp larger than a node.")]
ProfileOpt = Annotated[str | None, typer.Option("--profile", metavar="FILE", help="Measured per-op costs (`autotune "
                                                "profile`); default: profiles/measured/<gpu>-<model>.json if shipped, "
                                                "else the roofline model.")]


def _pin(flag: str, text: str, metavar: str = "N") -> Any:
    return Annotated[str | None, typer.Option(flag, metavar=metavar, help=text)]


TpOpt = _pin("--tp", "Tensor-parallel degree.")
PpOpt = _pin("--pp", "Pipeline-parallel degree.")
DpOpt = _pin("--dp", "Data-parallel degree (default: gpus / (tp*pp*cp)).")
CpOpt = _pin("--cp", "Context-parallel degree (default: 1).")
MbsOpt = _pin("--mbs", "Micro-batch size in sequences (default: 1).")
VppOpt = _pin("--vpp", "Virtual stages per pipeline rank (default: 1).")
RecomputeOpt = _pin("--recompute", "Activation recomputation (default: none).", "|".join(RECOMPUTES))
ScheduleOpt = _pin("--schedule", "Pipeline schedule (default: interleaved if vpp > 1, else 1f1b; v-half has "
                   "vpp 2).",
                   "|".join(SCHEDULES))
ZeroOpt = _pin("--zero", "ZeRO stage (default: 0).", "0|1|2|3")
VocabOpt = _pin("--vocab", "Where the vocabulary layers go: ends (even split), balanced (uneven split) or "
                "parallel (split over all pipeline ranks) (default: ends).", "|".join(VOCABS))
LayersOpt = _pin("--layers-per-stage", "Layers per pipeline stage (default: even split).", "N,N,...")
TpModeOpt = _pin("--tp-mode", "Tensor-parallel mode (default: 1d; 2d/2.5d/3d grids as in paper 2).",
                 "|".join(MODES))
MicroOpt = Annotated[int | None, typer.Option("--num-microbatches",
                                               help="Micro-batches per step (default: global batch / (dp*mbs)).")]
RecomputeLayersOpt = Annotated[int | None, typer.Option("--recompute-layers", help="With full recompute: "
                                                        "layers per stage recomputed (default: all).")]
BucketOpt = Annotated[int | None, typer.Option("--bucket-size", help=f"DP gradient bucket in parameters "
                                               f"(default: {DEFAULT_BUCKET}).")]
SpOpt = Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel",
                                            help="Megatron sequence parallelism (default: on when tp > 1).")]
OverlapOpt = Annotated[bool | None, typer.Option("--tp-overlap/--no-tp-overlap",
                                                 help="TP communication pipelined with the GEMMs (Megatron "
                                                      "--tp-comm-overlap, torchtitan async TP; default: off).")]
GradOpt = Annotated[str, typer.Option("--grad-reduce", metavar="fp32|bf16",
                                      help="Gradient buffer and reduction dtype (Megatron default fp32).")]
KernelsOpt = Annotated[str | None, typer.Option("--kernels", metavar="megatron|torchtitan|deepspeed|colossalai",
                                                help="Whose kernels and overlap to cost (default: the --trainer, "
                                                     "else megatron).")]
EpOpt = _pin("--ep", "Expert-parallel degree, MoE models (default: 1).")
EtpOpt = _pin("--etp", "Expert-tensor-parallel degree, MoE models (default: 1).")
SEpOpt = _pin("--ep", "Expert-parallel degree, MoE models; one value or a comma list (default: searched).")
SEtpOpt = _pin("--etp", "Expert-tensor-parallel degree, MoE models; one value or a comma list (default: 1 or "
               "tp, searched).")
PlanFileOpt = Annotated[str | None, typer.Option("--plan", metavar="FILE",
                                                 help="Read the plan from a JSON file (- reads stdin).")]

# `plan` takes the same pins as comma lists; what is not pinned is searched.
_LIST = "; one value or a comma list (default: searched)."
STpOpt, SPpOpt = _pin("--tp", "Tensor-parallel degree" + _LIST), _pin("--pp", "Pipeline-parallel degree" + _LIST)
SDpOpt, SCpOpt = _pin("--dp", "Data-parallel degree" + _LIST), _pin("--cp", "Context-parallel degree" + _LIST)
SMbsOpt = _pin("--mbs", "Micro-batch size in sequences" + _LIST)
SVppOpt = _pin("--vpp", "Virtual stages per pipeline rank" + _LIST)
SRecomputeOpt = _pin("--recompute", "Activation recomputation" + _LIST, "|".join(RECOMPUTES))
SScheduleOpt = _pin("--schedule", "Pipeline schedule" + _LIST, "|".join(SCHEDULES))
SZeroOpt = _pin("--zero", "ZeRO stage" + _LIST, "0|1|2|3")
SVocabOpt = _pin("--vocab", "Where the vocabulary layers go" + _LIST, "|".join(VOCABS))
SLayersOpt = _pin("--layers-per-stage", "Pin the partition: layers per pipeline stage (sets --pp).", "N,N,...")
STpModeOpt = _pin("--tp-mode", "Tensor-parallel modes to search (default: 1d; only Colossal-AI runs 2d/2.5d/3d)"
                  + _LIST, "|".join(MODES))
SSpOpt = Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel",
                                             help="Megatron sequence parallelism (default: search both).")]
SOverlapOpt = Annotated[bool | None, typer.Option("--tp-overlap/--no-tp-overlap",
                                                  help="TP communication overlap (default: search both).")]
IdleOpt = Annotated[bool, typer.Option("--allow-idle", help="Allow plans that leave some GPUs unused.")]
TopOpt = Annotated[int, typer.Option("--top", min=0, max=100, metavar="K", help="Runners-up to show (at most 100).")]
TimeLimitOpt = Annotated[float, typer.Option("--time-limit", metavar="S", help="Wall-clock safety net in seconds: "
                                              "if it strikes, the best plan so far is shown (exit 3), and it may "
                                              "differ between machines.")]
WorkLimitOpt = Annotated[float, typer.Option("--work-limit", metavar="W", help="Solver work a search may spend, in "
                                             "CP-SAT deterministic seconds (the same on every machine): an "
                                             "unfinished search stops here with the best plan so far (exit 3).")]
TORCHTITAN_FORMATS = ("cli", "toml")
TrainerOpt = Annotated[str | None, typer.Option("--trainer", metavar="|".join(TRAINERS), help="Search only plans "
                                                "this trainer runs as planned (its schedules, ZeRO stages, CP, TP "
                                                "modes, layer splits); with --out DIR, also write its launch "
                                                "config(s) there. Without it, the output says which trainers run "
                                                "the best plan.")]
ForkOpt = Annotated[str | None, typer.Option("--fork", metavar="|".join(FORK_CAPS), help="With --trainer megatron: "
                                             "also search what a Megatron-LM fork adds: vocab-parallel "
                                             "(sail-sg/VocabularyParallelism: --vocab parallel) or zero-bubble "
                                             "(sail-sg/zero-bubble-pipeline-parallelism: zb-h1, v-half; its flags "
                                             "are not emitted).")]
PlanOutOpt = Annotated[str | None, typer.Option("--out", metavar="DIR", help="Directory for plan.json (the --json "
                                                "document) and, with --trainer, the launch config(s).")]
FormatOpt = Annotated[str | None, typer.Option("--torchtitan-format", metavar="|".join(TORCHTITAN_FORMATS),
                                               help="torchtitan: 0.3.0 command-line overrides (cli, default) or a "
                                               "0.2.x TOML file.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Fail (exit 1, nothing written) when the trainer cannot "
                                         "express the plan exactly.")]
MockDataOpt = Annotated[bool, typer.Option("--mock-data", help="Launch files for a smoke run: synthetic data, no "
                                           "tokenizer (without it DATA_PATH, TOKENIZER_MODEL and CHECKPOINT_DIR are "
                                           "required).")]
RunTokensOpt = Annotated[float, typer.Option("--train-tokens", metavar="N", help="Tokens to train: the launch "
                                             "files' step count and LR schedule.")]
CompareOpt = Annotated[str | None, typer.Option("--compare", metavar="FILE", help="Your own plan (JSON, - reads "
                                                "stdin), estimated and shown beside the best one.")]
BriefOpt = Annotated[bool, typer.Option("--brief", help="One line of key=value words per plan instead of tables "
                                        "(for shell pipelines).")]
ForceProfileOpt = Annotated[bool, typer.Option("--force-profile", help="Use a --profile whose collectives were "
                                               "measured on another device kind or backend than the GPU's "
                                               "(refused otherwise).")]
NoTimingsOpt = Annotated[bool, typer.Option("--no-timings", help="Leave the solver's wall time out of --json, so "
                                            "reruns print the same bytes (plan.json never has it).")]


# ------------------------------------------------------------------------------------------ options -> specs
def parse_int_list(raw: str, flag: str, *, minimum: int = 1, maximum: int = MAX_GPUS) -> tuple[int, ...]:
    """'4,8,16' -> (4, 8, 16); anything else is a one-line SpecError naming the flag. No degree, GPU count or
    layer count exceeds MAX_GPUS, so that is the default `maximum`."""
    try:
        values = tuple(int(item) for item in raw.split(","))
    except ValueError:
        raise SpecError(f"{flag} {raw!r}: expected whole numbers separated by commas, e.g. {flag} 4,8") from None
    if any(v < minimum for v in values):
        raise SpecError(f"{flag} {raw!r}: every value must be >= {minimum}")
    if any(v > maximum for v in values):
        raise SpecError(f"{flag} {raw!r}: every value must be <= {maximum:,}")
    return values


def parse_choice_list(raw: str, flag: str, options: Sequence[str]) -> tuple[str, ...]:
    """'none,full' -> ('none', 'full'), each checked against the allowed options."""
    values = tuple(item.strip() for item in raw.split(","))
    bad = [v for v in values if v not in options]
    if bad:
        raise SpecError(f"{flag} {','.join(bad)!r}: must be one of {', '.join(options)}")
    return values


def one(values: tuple[Any, ...], flag: str) -> Any:
    """The single value `estimate` accepts where `plan` would accept a comma list."""
    if len(values) != 1:
        raise SpecError(f"{flag} {','.join(map(str, values))}: estimate evaluates one plan; give one value")
    return values[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Pins:
    """Plan choices as typed on the command line (comma lists, which the `plan` command searches over)."""

    tp: str | None = None
    pp: str | None = None
    dp: str | None = None
    cp: str | None = None
    mbs: str | None = None
    vpp: str | None = None
    recompute: str | None = None
    schedule: str | None = None
    zero: str | None = None
    vocab: str | None = None
    layers_per_stage: str | None = None
    num_microbatches: int | None = None
    recompute_layers: int | None = None
    bucket_size: int | None = None
    sequence_parallel: bool | None = None
    tp_mode: str | None = None
    tp_overlap: bool | None = None
    ep: str | None = None
    etp: str | None = None

    def given(self) -> list[str]:
        """The flags the user set."""
        return ["--" + f.name.replace("_", "-") for f in fields(self) if getattr(self, f.name) is not None]

    def typed(self) -> str:
        """The pins as the user typed them, e.g. '--tp 8 --pp 4,8 --no-sequence-parallel'."""
        words = []
        for f in fields(self):
            value, flag = getattr(self, f.name), "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                words.append(flag if value else flag.replace("--", "--no-", 1))
            elif value is not None:
                words.append(f"{flag} {value}")
        return " ".join(words)


def _one_int(raw: str | None, flag: str, default: int, minimum: int = 1) -> int:
    return default if raw is None else one(parse_int_list(raw, flag, minimum=minimum), flag)


def _one_choice(raw: str | None, flag: str, options: Sequence[str], default: str) -> str:
    return default if raw is None else one(parse_choice_list(raw, flag, options), flag)


def _quotient(total: int, flag: str, parts: dict[str, int], fix: str) -> int:
    """total / prod(parts), or an error giving the numbers and the fix."""
    prod = 1
    for value in parts.values():
        prod *= value
    if total % prod:
        names, values = " x ".join(parts), " x ".join(map(str, parts.values()))
        raise SpecError(f"{flag} {total} is not divisible by {names} = {values} = {prod}; {fix}")
    return total // prod


def single_plan(pins: Pins, model: ModelSpec, job: JobSpec, gpus: int) -> Plan:
    """The one plan `estimate` evaluates: each pin one value; dp, micro-batches, schedule derived."""
    if pins.tp is None or pins.pp is None:
        raise SpecError("estimate needs --tp and --pp (or --plan FILE); the other dimensions have defaults")
    tp, pp = _one_int(pins.tp, "--tp", 1), _one_int(pins.pp, "--pp", 1)
    tp_mode = _one_choice(pins.tp_mode, "--tp-mode", MODES, "1d")
    v_half = pins.schedule is not None and pins.schedule.strip() == "v-half"  # its V is two chunks per rank
    cp, mbs = _one_int(pins.cp, "--cp", 1), _one_int(pins.mbs, "--mbs", 1)
    vpp = _one_int(pins.vpp, "--vpp", 2 if v_half else 1)
    dp = (_one_int(pins.dp, "--dp", 1) if pins.dp is not None
          else _quotient(gpus, "--gpus", {"tp": tp, "pp": pp, "cp": cp}, "change --gpus or a degree"))
    micro = (pins.num_microbatches if pins.num_microbatches is not None
             else _quotient(job.global_batch, "--global-batch", {"dp": dp, "mbs": mbs},
                            f"use a multiple of {dp * mbs}, or change --mbs or --dp"))
    layers = (parse_int_list(pins.layers_per_stage, "--layers-per-stage", minimum=0)
              if pins.layers_per_stage is not None else even_split(model.num_layers, pp))
    return Plan(
        tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, num_microbatches=micro, vpp=vpp,
        schedule=_one_choice(pins.schedule, "--schedule", SCHEDULES, "interleaved" if vpp > 1 else "1f1b"),
        recompute=_one_choice(pins.recompute, "--recompute", RECOMPUTES, "none"),
        recompute_layers=pins.recompute_layers, zero=_one_int(pins.zero, "--zero", 0, minimum=0),
        sequence_parallel=(tp > 1 and tp_mode == "1d") if pins.sequence_parallel is None else pins.sequence_parallel,
        vocab=_one_choice(pins.vocab, "--vocab", VOCABS, "ends"), layers_per_stage=layers,
        bucket_size=DEFAULT_BUCKET if pins.bucket_size is None else pins.bucket_size, tp_mode=tp_mode,
        tp_overlap=bool(pins.tp_overlap), ep=_one_int(pins.ep, "--ep", 1), etp=_one_int(pins.etp, "--etp", 1))


def read_plan(path: str, pins: Pins) -> Plan:
    """A plan from a JSON file (or stdin for '-'); the command line may not pin anything beside it."""
    given = pins.given()
    if given:
        raise SpecError(f"--plan {path} gives the whole plan; drop {', '.join(given)} or drop --plan")
    return load_plan_file(path, "--plan")


def load_plan_file(path: str, flag: str) -> Plan:
    """A plan object (or a whole `plan --json` document) from a file, or stdin for '-'."""
    return plan_from_dict(read_document(path, flag), path if path != "-" else f"{flag} -")


def read_document(path: str, flag: str) -> Any:
    """A JSON document from a file, or from stdin for '-'; I/O and syntax problems are one-line errors."""
    if path != "-":
        return read_json(Path(path), "plan file")
    try:
        raw = sys.stdin.buffer.read(MAX_JSON_BYTES + 1) if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    except OSError as exc:
        raise SpecError(f"{flag} -: cannot read stdin ({exc})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise SpecError(f"{flag} -: more than the maximum of {MAX_JSON_BYTES:,} bytes on stdin; give a plan document")
    return parse_json(raw, f"{flag} -: stdin")


def load_cost_profile(path: str | None, gpu: str, model: ModelSpec, hw: HardwareSpec, job: JobSpec,
                      force: bool = False) -> Profile | None:
    """--profile FILE, else the shipped profiles/measured/<gpu>-<model>.json, else None (roofline); a profile
    for another model is an error, one measured on another device or dtype a warning."""
    if path is None:
        shipped = PROFILES_DIR / "measured" / f"{slug(gpu)}-{slug(model.name)}.json"  # never a path from input
        if not shipped.is_file():
            return None
        path = str(shipped)
    profile = load_profile(path)
    check_profile_model(profile, model)
    check_comm_profile(profile, hw, force)
    show_warnings(profile_warnings(profile, hw, job.dtype))
    return profile


def check_comm_profile(profile: Profile, hw: HardwareSpec, force: bool) -> None:
    """Measured collectives replace the GPU's links (costmodel/measured.apply_comm): ones timed on a CPU, over
    gloo or on another GPU would price the cluster's NVLink and network at that speed, so they are refused unless
    --force-profile says so."""
    if not profile.comm or force:
        return
    backends = sorted({tier.backend for tier in profile.comm.values()})
    same_gpu = profile.device.kind == "cuda" and hw.name.split("-")[0].lower() in profile.device.name.lower()
    if not same_gpu or backends != ["nccl"]:
        raise SpecError(f"--profile {profile.path}: its collectives ({', '.join(sorted(profile.comm))}) were timed on "
                        f"{profile.device.kind} {profile.device.name!r} over {', '.join(backends)}, not on {hw.name} "
                        f"over nccl, and would replace {hw.name}'s links; measure them on the cluster (`autotune "
                        "profile --comm --device cuda`), or add --force-profile to use them anyway")


def coverage_warnings(coverage: OpCoverage, plan: Plan) -> list[str]:
    """A warning when a profile is in use but the plan's shapes are outside it (those ops cost by roofline)."""
    if coverage.source == "roofline" or not coverage.fallback:
        return []
    return [f"the plan's shapes (tp {plan.tp}, mbs {plan.mbs}, cp {plan.cp}) are outside --profile {coverage.source}: "
            f"{coverage.total - coverage.measured} of {coverage.total} ops cost by the roofline instead; measure "
            f"them with `autotune profile --tp {plan.tp} --mbs {plan.mbs}`"]


def check_whole_nodes(gpus: int, hw: HardwareSpec, flag: str = "--gpus") -> None:
    """A job of more than one node uses whole nodes: a part-filled last node leaves a stage short or empty, and no
    scheduler hands out 7.5 nodes. One node may be used in part."""
    node = hw.gpus_per_node
    if gpus > node and gpus % node:
        lower, upper = gpus // node * node, (gpus // node + 1) * node
        raise SpecError(f"{flag} {gpus} is {gpus / node:g} nodes of {node} GPUs ({hw.name}); use whole nodes (e.g. "
                        f"{flag} {lower} or {upper}), or give --gpus-per-node N if your nodes hold N GPUs")


def distinct_fitting(result: PlanResult, top: int) -> PlanResult:
    """`--top K`: the K fastest runners-up that fit, none shown alike (the same choices as the best plan or an
    earlier row, differing only in layer split or bucket), without the candidates that do not fit in memory."""
    seen = {render.plan_brief(result.best.plan)}
    kept = []
    for runner in result.runners_up:
        key = render.plan_brief(runner.estimate.plan)
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


def time_limited(seconds: float, what: str) -> interrupts.deadline:
    """`--time-limit` for a command without a search (estimate, calibrate): past it, one line and exit 3."""
    if not seconds > 0:
        raise SpecError(f"--time-limit must be > 0 seconds, got {seconds:g}")
    return interrupts.deadline(seconds, lambda: SolverLimitError(
        f"{what}: --time-limit {seconds:g} s reached before it finished; raise --time-limit"))


def load_cluster(gpu: str, gpus_per_node: int | None) -> HardwareSpec:
    """The GPU spec, with the node size overridden from the command line if given."""
    hw = load_hardware(gpu)
    return hw if gpus_per_node is None else replace(hw, gpus_per_node=gpus_per_node)


def build_job(global_batch: int, seq_len: int, dtype: str, no_flash: bool, unfused: bool,
              grad_reduce: str = "fp32", kernels: str | None = None) -> JobSpec:
    return JobSpec(global_batch=global_batch, seq_len=seq_len, dtype=dtype,  # type: ignore[arg-type]
                   flash_attention=not no_flash, fused_kernels=not unfused,
                   grad_reduce=grad_reduce, trainer=kernels or "megatron")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ pins -> search space
def search_space(pins: Pins, model: ModelSpec, job: JobSpec, gpus: int, gpus_per_node: int, *,
                 allow_idle: bool, allow_cross_node_tp: bool, trainer: TrainerCaps | None = None) -> SearchSpace:
    """The pins as a SearchSpace (restricted to what `trainer` runs), after checks that turn contradictory pins
    into one-line errors (exit 1): the planner's own "empty space" error (exit 2) is left for spaces that are
    empty without any pin."""
    space = replace(pins_space(pins, allow_idle=allow_idle, allow_cross_node_tp=allow_cross_node_tp), trainer=trainer)
    check_space(space, model, job, gpus, gpus_per_node)
    if pins.given() and next(enumerate_candidates(model, job, gpus, gpus_per_node, space), None) is None:
        raise SpecError(f"no valid plan for {gpus} GPUs meets {pins.typed()} together (tp x pp x dp x cp must be "
                        f"{gpus}, dp x mbs must divide --global-batch {job.global_batch}, interleaved needs "
                        "micro-batches divisible by pp); relax a pin")
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
        layers_per_stage=layers, allow_idle=allow_idle, allow_cross_node_tp=allow_cross_node_tp,
        tp_mode=choices(pins.tp_mode, "--tp-mode", MODES), ep=ints(pins.ep, "--ep"), etp=ints(pins.etp, "--etp"))


def compare_plan(path: str, model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int,
                 space: SearchSpace, profile: Profile | None = None) -> render.Comparison:
    """The user's plan, checked by the independent validator: rule breaks are errors, not fitting is reported."""
    plan = load_plan_file(path, "--compare")
    check_simulation_size(plan, f"--compare {path}")
    cm = CostModel(model, hw, job, profile)
    flags = {"allow_idle": space.allow_idle, "allow_cross_node_tp": space.allow_cross_node_tp}
    try:
        return render.Comparison(path, validate_plan(plan, cm, gpus, **flags), None)
    except InvalidPlanError as exc:
        try:
            check_plan(plan, model, job, gpus, hw.gpus_per_node, **flags)
        except InvalidPlanError as rule:
            raise SpecError(f"--compare {path}: {rule}") from None
        return render.Comparison(path, cm.estimate(plan), str(exc))


def check_simulation_size(plan: Plan, where: str) -> None:
    """Estimating a plan simulates every pass of its pipeline schedule: at most MAX_PIPELINE_PASSES of them."""
    passes = plan.num_microbatches * plan.pp * plan.vpp
    if passes > MAX_PIPELINE_PASSES:
        raise SpecError(f"{where}: {plan.num_microbatches} micro-batches x pp {plan.pp} x vpp {plan.vpp} = "
                        f"{passes:,} pipeline passes exceed the maximum of {MAX_PIPELINE_PASSES:,} simulated; use a "
                        "larger --mbs or --dp, or a smaller --global-batch")


def run_search(model: ModelSpec, hw: HardwareSpec, job: JobSpec, gpus: int, space: SearchSpace, *, top_k: int,
               time_limit_s: float, profile: Profile | None = None,
               work_limit: float = DEFAULT_WORK_LIMIT) -> PlanResult:
    """`search` under a progress bar; a limit hit with a plan in hand returns it (status FEASIBLE)."""
    if not time_limit_s > 0:
        raise SpecError(f"--time-limit must be > 0 seconds, got {time_limit_s:g}")
    with render.search_progress(True) as progress:  # on a terminal even with --json: the bar goes to stderr
        try:
            return search(model, hw, job, gpus, space, top_k=top_k, time_limit_s=time_limit_s, progress=progress,
                          profile=profile, work_limit=work_limit)
        except SolverLimitError as exc:
            if isinstance(exc.result, PlanResult):
                return exc.result
            raise


def _show(renderable: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(render.dump_json(renderable))
    else:
        render.make_console().print(renderable)


# ------------------------------------------------------------------------------------- plan documents -> configs
def document_reestimator(inp: EmitInput) -> Any:
    """The cost model of a saved plan's job (its catalog GPU, the shipped measured profile if any), for the
    headers of what a trainer really runs; None when the GPU is not in the catalog (headers then say so)."""
    try:
        hw = replace(load_hardware(inp.gpu), gpus_per_node=inp.gpus_per_node)
        return reestimator(CostModel(inp.model, hw, inp.job, load_cost_profile(None, inp.gpu, inp.model, hw,
                                                                                inp.job)))
    except AutotuneError:
        return None


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
    if not train_tokens > 0 or train_tokens == float("inf"):
        raise SpecError(f"--train-tokens {train_tokens:g}: must be a number of tokens > 0, e.g. 1e12")
    inp = replace(inp, reestimate=reestimate, mock_data=mock_data, train_tokens=train_tokens)
    result = emit_config(trainer, inp, torchtitan_format=torchtitan_format or TORCHTITAN_FORMATS[0])
    if strict and result.warnings:
        show_warnings(result.warnings)
        raise SpecError(f"--strict: {trainer} cannot express this plan exactly ({len(result.warnings)} warning(s) "
                        "above); nothing was written")
    return result


def show_warnings(warnings: Sequence[str]) -> None:
    """Each warning as one `warning: ...` line on stderr."""
    for warning in warnings:
        typer.secho(f"warning: {' '.join(warning.split())}", fg="yellow", err=True)


def save_plan(out: str, doc: dict[str, Any], trainer: str | None, *, torchtitan_format: str | None,
              strict: bool, reestimate: Any = None, mock_data: bool = False,
              train_tokens: float = DEFAULT_TRAIN_TOKENS) -> list[Path]:
    """`plan --out DIR`: plan.json and, with a trainer, its launch config, built from that same document (so
    that `autotune emit --plan DIR/plan.json` gives the same bytes); all written atomically."""
    files, warnings = [(PLAN_FILE, render.dump_json(without_timings(doc)) + "\n")], ()
    if trainer is not None:
        inp = emit_input_from_document(doc, PLAN_FILE)
        result = launch_config(trainer, inp, torchtitan_format=torchtitan_format, strict=strict,
                               reestimate=reestimate, mock_data=mock_data, train_tokens=train_tokens)
        files, warnings = files + list(result.files), result.warnings
    written = write_files(Path(out), files)
    show_warnings(warnings)
    return written


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
        return [write_file(target, files[0][1])]
    return write_files(target, files)


# ------------------------------------------------------------------------------------------------ commands
@app.command()
def models(json_out: JsonOpt = False) -> None:
    """List the catalog models."""
    entries = [(load_model(name), load_raw("models", name)) for name in model_names()]
    _show(render.models_json(entries) if json_out else render.models_table(entries), json_out)


@app.command()
def hardware(json_out: JsonOpt = False) -> None:
    """List the catalog GPUs."""
    entries = [(load_hardware(name), load_raw("hardware", name)) for name in hardware_names()]
    _show(render.hardware_json(entries) if json_out else render.hardware_table(entries), json_out)


@app.command()
def estimate(
    model: ModelOpt, gpu: GpuOpt, gpus: GpusOpt, global_batch: BatchOpt, seq_len: SeqOpt,
    gpus_per_node: GpusPerNodeOpt = None, dtype: DtypeOpt = "bf16", tp: TpOpt = None, pp: PpOpt = None,
    dp: DpOpt = None, cp: CpOpt = None, mbs: MbsOpt = None, vpp: VppOpt = None, recompute: RecomputeOpt = None,
    schedule: ScheduleOpt = None, zero: ZeroOpt = None, vocab: VocabOpt = None, tp_mode: TpModeOpt = None,
    layers_per_stage: LayersOpt = None, num_microbatches: MicroOpt = None,
    recompute_layers: RecomputeLayersOpt = None, bucket_size: BucketOpt = None,
    sequence_parallel: SpOpt = None, no_flash_attention: NoFlashOpt = False, unfused: UnfusedOpt = False,
    plan_file: PlanFileOpt = None, json_out: JsonOpt = False,
    ops: Annotated[bool, typer.Option("--ops", help="Also show compute time by operator category.")] = False,
    allow_cross_node_tp: CrossTpOpt = False, profile: ProfileOpt = None, tp_overlap: OverlapOpt = None,
    grad_reduce: GradOpt = "fp32", kernels: KernelsOpt = None, brief: BriefOpt = False,
    force_profile: ForceProfileOpt = False, ep: EpOpt = None, etp: EtpOpt = None,
    time_limit: Annotated[float, typer.Option("--time-limit", metavar="S", help="Wall-clock limit in seconds "
                                              "(exit 3 when it strikes).")] = DEFAULT_TIME_LIMIT_S,
) -> None:
    """Evaluate one plan and explain its step time and memory term by term."""
    if brief and json_out:
        raise SpecError("--brief and --json each replace the tables; pick one")
    spec, hw = load_model(model), load_cluster(gpu, gpus_per_node)
    check_whole_nodes(gpus, hw)
    job = build_job(global_batch, seq_len, dtype, no_flash_attention, unfused, grad_reduce, kernels)
    pins = Pins(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, vpp=vpp, recompute=recompute, schedule=schedule, zero=zero,
                vocab=vocab, layers_per_stage=layers_per_stage, num_microbatches=num_microbatches,
                recompute_layers=recompute_layers, bucket_size=bucket_size, sequence_parallel=sequence_parallel,
                tp_mode=tp_mode, tp_overlap=tp_overlap, ep=ep, etp=etp)
    plan = read_plan(plan_file, pins) if plan_file is not None else single_plan(pins, spec, job, gpus)
    check_plan(plan, spec, job, gpus, hw.gpus_per_node, allow_cross_node_tp=allow_cross_node_tp)
    check_simulation_size(plan, "estimate")
    cm = CostModel(spec, hw, job, load_cost_profile(profile, gpu, spec, hw, job, force_profile))
    with time_limited(time_limit, "estimate"):
        est, coverage = cm.estimate(plan), cm.op_coverage(plan)
        timeline = None if json_out or brief else cm.timeline(plan)
    show_warnings(coverage_warnings(coverage, plan))
    if brief:
        typer.echo(render.brief_line(est))
    elif json_out:
        _show({**render.estimate_json(est, spec, hw, job), "op_costs": coverage.as_dict()}, True)
    else:
        _show(render.estimate_report(est, spec, hw, job, ops=ops, timeline=timeline), False)
        typer.echo(coverage.line())


@app.command()
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
    profile: ProfileOpt = None, tp_overlap: SOverlapOpt = None, grad_reduce: GradOpt = "fp32",
    kernels: KernelsOpt = None, fork: ForkOpt = None, brief: BriefOpt = False,
    force_profile: ForceProfileOpt = False, no_timings: NoTimingsOpt = False,
    mock_data: MockDataOpt = False, train_tokens: RunTokensOpt = DEFAULT_TRAIN_TOKENS, ep: SEpOpt = None,
    etp: SEtpOpt = None,
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
    spec, hw = load_model(model), load_cluster(gpu, gpus_per_node)
    check_whole_nodes(gpus, hw)
    job = build_job(global_batch, seq_len, dtype, no_flash_attention, unfused, grad_reduce, kernels or trainer)
    pins = Pins(tp=tp, pp=pp, dp=dp, cp=cp, mbs=mbs, vpp=vpp, recompute=recompute, schedule=schedule, zero=zero,
                vocab=vocab, layers_per_stage=layers_per_stage, sequence_parallel=sequence_parallel, tp_mode=tp_mode,
                tp_overlap=tp_overlap, ep=ep, etp=etp)
    space = search_space(pins, spec, job, gpus, hw.gpus_per_node, allow_idle=allow_idle,
                         allow_cross_node_tp=allow_cross_node_tp, trainer=caps)
    measured = load_cost_profile(profile, gpu, spec, hw, job, force_profile)
    mine = compare_plan(compare, spec, hw, job, gpus, space, measured) if compare is not None else None
    left = max(time_limit - (time.monotonic() - started), 1e-3)
    result = distinct_fitting(run_search(spec, hw, job, gpus, space, top_k=top, time_limit_s=left,
                                         profile=measured, work_limit=work_limit), top)
    coverage = CostModel(spec, hw, job, measured).op_coverage(result.best.plan)
    show_warnings(coverage_warnings(coverage, result.best.plan))
    doc = {**render.plan_json(result, spec, hw, job, mine), "trainer": None if caps is None else caps.name,
           "op_costs": coverage.as_dict()}
    fits = () if caps is not None else best_per_trainer(spec, hw, job, gpus, space, result.best.plan,
                                                        profile=measured, work_limit=work_limit,
                                                        time_limit_s=max(time_limit - (time.monotonic() - started),
                                                                         1e-3), own_kernels=kernels is None)
    if fits:
        doc["trainers"] = render.trainers_json(fits)
    written = [] if out is None else save_plan(out, doc, trainer, torchtitan_format=torchtitan_format, strict=strict,
                                               reestimate=reestimator(CostModel(spec, hw, job, measured)),
                                               mock_data=mock_data, train_tokens=train_tokens)
    if brief:
        typer.echo(render.brief_line(result.best))
    elif json_out:
        shown = without_timings(doc) if no_timings else doc
        _show(render.with_files(shown, written) if out is not None else shown, True)
    else:
        typer.echo(coverage.line())
        timeline = CostModel(spec, hw, job, measured).timeline(result.best.plan)
        _show(render.plan_report(result, spec, hw, job, mine, timeline), False)
        if fits:
            _show(render.trainers_report(fits, result.best), False)
        elif caps is not None:
            _show(render.Text(f"searched only plans {caps.name} runs as planned (autotune/specs/trainers.py)"), False)
        if written:
            typer.echo(render.written_report(written))
    if result.status != "OPTIMAL" or result.limit == "time":
        raise typer.Exit(SolverLimitError.exit_code)


@app.command("emit")
def emit_command(
    plan_file: Annotated[str, typer.Option("--plan", metavar="FILE|-", help="A saved plan: plan.json or the output "
                                           "of `autotune plan --json` (- reads stdin).")],
    trainer: Annotated[str, typer.Option("--trainer", metavar="|".join(TRAINERS), help="Trainer to configure.")],
    out: Annotated[str | None, typer.Option("--out", metavar="FILE|DIR", help="Where to write (default: stdout, "
                                            "for a single file); a trainer writing several files needs a DIR.")] = None,
    torchtitan_format: FormatOpt = None, strict: StrictOpt = False,
    model: Annotated[str | None, typer.Option("--model", metavar="NAME|FILE", help="Check that the plan is for "
                                              "this model.")] = None,
    mock_data: MockDataOpt = False, train_tokens: RunTokensOpt = DEFAULT_TRAIN_TOKENS,
) -> None:
    """Write a trainer's launch config from a saved plan."""
    check_emit_options(trainer, torchtitan_format, strict)
    if out is not None:
        check_target(Path(out), directory=False)
    where = "the plan on stdin" if plan_file == "-" else plan_file
    doc = read_document(plan_file, "--plan")
    inp = emit_input_from_document(doc, where, model)
    planned_for = document_trainer(doc, where)
    if planned_for is not None and planned_for.split("+")[0] != trainer:
        show_warnings([f"{where} was searched for {planned_for}, not {trainer}: {trainer} may not run it as planned "
                       f"(plan again with --trainer {trainer} for the best plan it runs)"])
    result = launch_config(trainer, inp, torchtitan_format=torchtitan_format, strict=strict,
                           reestimate=document_reestimator(inp), mock_data=mock_data, train_tokens=train_tokens)
    written = write_launch(out, trainer, result)
    show_warnings(result.warnings)
    if written:
        typer.echo(render.written_report(written))


@app.command("scale")
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
    jobs: Annotated[int, typer.Option("--jobs", min=1, metavar="N", help="Sizes searched at once, in separate "
                                      "processes (the answer is the same for any N).")] = 1,
    json_out: JsonOpt = False,
    csv_out: Annotated[bool, typer.Option("--csv", help="Print CSV (one row per size) instead of tables.")] = False,
    profile: ProfileOpt = None,
    trainer: Annotated[str | None, typer.Option("--trainer", metavar="|".join(TRAINERS), help="Search only plans "
                                                "this trainer runs (and cost its kernels).")] = None,
    fork: ForkOpt = None, brief: BriefOpt = False, force_profile: ForceProfileOpt = False,
    no_timings: NoTimingsOpt = False,
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
    sizes = parse_int_list(gpus, "--gpus")
    for size in sizes:
        check_whole_nodes(size, hw)
    batch = global_batch if global_batch is not None else global_batch_for_tokens(tokens_per_step, seq_len)
    caps = trainer_caps(trainer, fork)
    job = build_job(batch, seq_len, dtype, no_flash_attention, unfused, kernels=trainer)
    pins = Pins(tp=tp, pp=pp, cp=cp, mbs=mbs, vpp=vpp, recompute=recompute, schedule=schedule, zero=zero,
                vocab=vocab, sequence_parallel=sequence_parallel, tp_mode=tp_mode)
    space = replace(pins_space(pins, allow_idle=False, allow_cross_node_tp=allow_cross_node_tp), trainer=caps)
    measured = load_cost_profile(profile, gpu, spec, hw, job, force_profile)
    with render.scale_progress(True) as progress:  # on a terminal even with --json/--csv: it goes to stderr
        result = scale(spec, hw, job, sizes, space, train_tokens=train_tokens,
                       price_per_gpu_hour=price_per_gpu_hour, efficiency_threshold=efficiency_threshold,
                       time_limit_s=time_limit, progress=progress, profile=measured, work_limit=work_limit,
                       jobs=jobs)
    if csv_out:
        typer.echo(render.scaling_csv(result), nl=False)
    elif brief:
        typer.echo(render.scaling_brief(result))
    elif json_out:
        doc = render.scaling_json(result, spec, hw, job)
        _show(without_timings(doc) if no_timings else doc, True)
    else:
        _show(render.scaling_report(result, spec, hw, job), False)
    if all(p.best is None for p in result.points):
        infeasible = all(p.status == "INFEASIBLE" for p in result.points)
        reason = next((p.reason for p in result.points if p.reason), "")
        _fail(f"no GPU count of {gpus} has a plan that fits" + (f" (at {result.points[-1].gpus}: "
              f"{result.points[-1].reason})" if result.points[-1].reason else "") if infeasible else
              f"no GPU count of {gpus} found a plan within the limits ({reason or 'raise --time-limit'})",
              InfeasibleError.exit_code if infeasible else SolverLimitError.exit_code)
    if any(p.status in ("FEASIBLE", "TIME_LIMIT") for p in result.points):
        raise typer.Exit(SolverLimitError.exit_code)


# ------------------------------------------------------------------------------------------------ entry point
def _fail(message: str, code: int) -> None:
    """One red line on stderr (newlines folded so scripts can rely on a single line), then exit."""
    typer.secho(f"error: {' '.join(message.split())}", fg="red", err=True)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry: run the app, turning every expected failure into `error: ...` and an exit code.
    Ctrl-C is `error: interrupted`, exit 130 (autotune/interrupts.py, for the command itself; a KeyboardInterrupt
    where that is not installed, e.g. main(argv) called in-process)."""
    if argv is not None:
        _run(argv)
    interrupts.install()
    try:
        _run(None)
    except SystemExit as exc:
        interrupts.finish(exc.code)


_COMMANDS: list[Any] = []


def _command() -> Any:
    """The click command typer builds from `app`, built once per process (it costs about 50 ms, which in-process
    callers such as the fuzz test would pay on every call); every command is registered by then."""
    if not _COMMANDS:
        _COMMANDS.append(typer.main.get_command(app))
    return _COMMANDS[0]


def _run(argv: Sequence[str] | None) -> None:
    try:
        code = _command().main(args=None if argv is None else list(argv), prog_name="autotune",
                               standalone_mode=False)
    except AutotuneError as exc:
        _fail(str(exc), exc.exit_code)
    except _CLICK_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `autotune`: the help is the message
            typer.echo(exc.format_message())
            raise SystemExit(0) from None
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        _fail(exc.format_message() + hint, 1)
    except KeyboardInterrupt:
        _fail("interrupted", interrupts.EXIT_CODE)
    except typer.Abort as exc:  # click turns a KeyboardInterrupt into Abort
        if isinstance(exc.__cause__, KeyboardInterrupt):
            _fail("interrupted", interrupts.EXIT_CODE)
        _fail("aborted", 1)
    raise SystemExit(code if isinstance(code, int) else 0)


import autotune.cli_calibrate  # noqa: E402, F401  (registers `autotune calibrate` on app; must follow `app`)
import autotune.cli_profile  # noqa: E402, F401  (registers `autotune profile` on app; must follow `app`)
import autotune.cli_check  # noqa: E402, F401  (registers `autotune check` on app; must follow `app`)
