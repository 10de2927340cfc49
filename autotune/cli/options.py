"""What the commands share: the typer option types (one definition per flag, so help texts agree), the plan
pins as typed, the parsers of comma lists, and the small checks and output helpers every command uses.

Nothing here knows the typer app: the command modules import from here, and cli/app.py registers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Annotated, Any

import typer

from autotune import interrupts
from autotune.catalog import load_hardware
from autotune.emit import TRAINERS
from autotune.errors import SolverLimitError, SpecError
from autotune.render.common import dump_json, make_console
from autotune.specs.hardware import HardwareSpec
from autotune.specs.job import JobSpec, check_moe_imbalance
from autotune.specs.model import ModelSpec
from autotune.specs.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_MOE_FACTOR, MAX_PIPELINE_PASSES, MAX_SEQ_LEN
from autotune.specs.plan import DEFAULT_BUCKET, RECOMPUTES, SCHEDULES, VOCABS, Plan
from autotune.specs.tpgrid import MODES
from autotune.specs.trainer_jobs import check_job_settings, runs_grad_reduce
from autotune.specs.trainers import FORK_CAPS, TRAINER_CAPS

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
_RECORDED = "; with --plan, the plan document's when not given"
#: estimate's job options: with --plan FILE, a `plan --json` document's job block gives any left out.
ModelOrPlanOpt = Annotated[str | None, typer.Option("--model", metavar="NAME|FILE", help="Catalog model (see "
                                                    "`autotune models`) or a config.json path" + _RECORDED + ".")]
GpuOrPlanOpt = Annotated[str | None, typer.Option("--gpu", metavar="NAME|FILE", help="Catalog GPU (see `autotune "
                                                  "hardware`) or a hardware file path" + _RECORDED + ".")]
GpusOrPlanOpt = Annotated[int | None, typer.Option("--gpus", min=1, max=MAX_GPUS, help=f"GPUs in the job (at most "
                                                   f"{MAX_GPUS:,})" + _RECORDED + ".")]
BatchOrPlanOpt = Annotated[int | None, typer.Option("--global-batch", help=f"Sequences per optimizer step (at most "
                                                    f"{MAX_GLOBAL_BATCH:,})" + _RECORDED + ".")]
SeqOrPlanOpt = Annotated[int | None, typer.Option("--seq-len", help=f"Tokens per sequence (at most {MAX_SEQ_LEN:,})"
                                                  + _RECORDED + ".")]
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
ZeroOpt = _pin("--zero", "ZeRO stage (default: 0; 1 with 16-bit --optimizer-states).", "0|1|2|3")
VocabOpt = _pin("--vocab", "Where the vocabulary layers go: ends (even split), balanced (uneven split) or "
                "parallel (split over all pipeline ranks) (default: ends).", "|".join(VOCABS))
LayersOpt = _pin("--layers-per-stage", "Layers per pipeline stage (default: even split).", "N,N,...")
TpModeOpt = _pin("--tp-mode", "Tensor-parallel mode (default: 1d; 2d/2.5d/3d grids as in paper 2).",
                 "|".join(MODES))
MicroOpt = Annotated[int | None, typer.Option("--num-microbatches",
                                               help="Micro-batches per step (default: global batch / (dp*mbs)).")]
RecomputeLayersOpt = Annotated[int | None, typer.Option("--recompute-layers", help="With full recompute: "
                                                        "layers recomputed in each model chunk (virtual stage), "
                                                        "as Megatron's block method (default: all).")]
BucketOpt = Annotated[int | None, typer.Option("--bucket-size", help="DP gradient bucket in parameters (default: "
                                               "the trainer's own: Megatron max(40M, 1M x dp), DeepSpeed 500M, "
                                               f"else {DEFAULT_BUCKET:,}).")]
SpOpt = Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel",
                                            help="Megatron sequence parallelism (default: on when tp > 1).")]
OverlapOpt = Annotated[bool | None, typer.Option("--tp-overlap/--no-tp-overlap",
                                                 help="TP communication pipelined with the GEMMs (Megatron "
                                                      "--tp-comm-overlap, torchtitan async TP; default: off).")]
EpOverlapOpt = Annotated[bool | None, typer.Option("--ep-overlap/--no-ep-overlap",
                                                   help="MoE models: the expert all-to-all overlapped with another "
                                                        "micro-batch's compute (Megatron "
                                                        "--overlap-moe-expert-parallel-comm; default: off).")]
GradOpt = Annotated[str | None, typer.Option(
    "--grad-reduce", metavar="fp32|bf16|fp16",
    help="Gradient buffer and reduction dtype (default: what the trainer's config runs: fp32; DeepSpeed's, the "
         "model dtype). fp16 only with --dtype fp16.")]
OptimizerStatesOpt = Annotated[str, typer.Option(
    "--optimizer-states", metavar="fp32|bf16|bf16-moments",
    help="Adam's state: bf16 is Megatron's precision-aware optimizer (ZeRO-1) with bf16 moments as "
         "Megatron-LM runs it (master weights kept as 16-bit remainders); bf16-moments as it runs under a "
         "non-delayed fp8 recipe, Megatron-Bridge's default (fp32 master weights), and torchtitan 0.3's "
         "fused_opt_states_bf16 (any ZeRO stage); DeepSpeed keeps bf16 as bf16 master weights (ZeRO 1-3).")]
AttentionOpt = Annotated[str | None, typer.Option(
    "--attention-backend", metavar="cudnn|flash",
    help="Attention kernel of the PyTorch trainers: cuDNN's or FlashAttention-2, about half its speed on an H100 "
         "(default: the trainer's own: cuDNN for torchtitan, which asks SDPA for it, and for DeepSpeed, whose SDPA "
         "picks it from PyTorch 2.9; FlashAttention-2 for Colossal-AI, which calls it; Megatron: cuDNN only).")]
KernelsOpt = Annotated[str | None, typer.Option("--kernels", metavar="megatron|torchtitan|deepspeed|colossalai",
                                                help="Whose kernels and overlap to cost (default: the --trainer "
                                                     "where the command has one, else megatron).")]
#: JobSpec's default load imbalance of learned routing (costmodel/moe.py ROUTED_IMBALANCE).
DEFAULT_MOE_IMBALANCE = next(f.default for f in fields(JobSpec) if f.name == "moe_imbalance")
MAX_MOE_IMBALANCE = MAX_MOE_FACTOR
MoeImbalanceOpt = Annotated[float | None, typer.Option(
    "--moe-imbalance", metavar="X", help="MoE models: tokens of the busiest expert over the mean, the step waits "
    f"for it with ep > 1; >= 1.0 (1.0 = balanced routing, as published benchmarks force; default "
    f"{DEFAULT_MOE_IMBALANCE:g}, learned routing). With ep 1 every GPU runs every expert and none waits.")]
MoeCapacityOpt = Annotated[float | None, typer.Option(
    "--moe-capacity-factor", metavar="C", help="MoE models: each expert takes at most C x the mean tokens and drops "
    "the rest (Megatron's --moe-expert-capacity-factor); default: dropless.")]
MoePadOpt = Annotated[bool, typer.Option(
    "--moe-pad-to-capacity", help="MoE models with --moe-capacity-factor: pad every expert's input to its capacity "
    "(Megatron's --moe-pad-expert-input-to-capacity).")]
MoeDispatcherOpt = Annotated[str, typer.Option(
    "--moe-dispatcher", metavar="alltoall|deepep", help="MoE models: the token dispatcher the cluster runs: "
    "alltoall (NCCL, Megatron's default) or deepep (DeepEP's kernels, Megatron's flex dispatcher; Megatron only, "
    "DeepEP must be installed).")]
EpOpt = _pin("--ep", "Expert-parallel degree, MoE models (default: 1).")
EtpOpt = _pin("--etp", "Expert-tensor-parallel degree, MoE models (default: 1; Megatron's own is tp).")
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
SEpOverlapOpt = Annotated[bool | None, typer.Option("--ep-overlap/--no-ep-overlap",
                                                    help="MoE models: the expert all-to-all overlapped with another "
                                                         "micro-batch's compute (Megatron "
                                                         "--overlap-moe-expert-parallel-comm; default: search both "
                                                         "where Megatron runs it).")]
IdleOpt = Annotated[bool, typer.Option("--allow-idle", help="Allow plans that leave some GPUs unused (any degree "
                                                            "may: a search several times larger).")]
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
    ep_overlap: bool | None = None
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


def check_whole_nodes(gpus: int, hw: HardwareSpec, flag: str = "--gpus") -> None:
    """A job of more than one node uses whole nodes: a part-filled last node leaves a stage short or empty, and no
    scheduler hands out 7.5 nodes. One node may be used in part."""
    node = hw.gpus_per_node
    if gpus > node and gpus % node:
        lower, upper = gpus // node * node, (gpus // node + 1) * node
        raise SpecError(f"{flag} {gpus} is {gpus / node:g} nodes of {node} GPUs ({hw.name}); use whole nodes (e.g. "
                        f"{flag} {lower} or {upper}), or give --gpus-per-node N if your nodes hold N GPUs")


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


def check_moe_flags(model: ModelSpec, imbalance: float | None, dispatcher: str, capacity: float | None,
                    pad: bool) -> None:
    """MoE settings given for a dense model are a mistake (the wrong --model?), as --ep is: one line naming them."""
    given = [flag for flag, on in (("--moe-imbalance", imbalance is not None),
                                   ("--moe-dispatcher", dispatcher != "alltoall"),
                                   ("--moe-capacity-factor", capacity is not None),
                                   ("--moe-pad-to-capacity", pad)) if on]
    if given and not model.is_moe:
        raise SpecError(f"{', '.join(given)}: {model.name} is dense (no experts); drop "
                        f"{'it' if len(given) == 1 else 'them'}")
    if imbalance is not None and model.is_moe:
        check_moe_imbalance(imbalance, model.num_experts, model.moe_top_k, model.name, "--moe-imbalance")


def moe_imbalance_flag(imbalance: float) -> float:
    """--moe-imbalance's value, in its range (the E/k ceiling needs the model: check_moe_flags)."""
    if not 1.0 <= imbalance <= MAX_MOE_IMBALANCE:  # also NaN
        raise SpecError(f"--moe-imbalance {imbalance:g}: the busiest expert's tokens over the mean must be >= 1.0 "
                        f"(1.0 = balanced routing) and <= {MAX_MOE_IMBALANCE:g}")
    return imbalance

def build_job(global_batch: int, seq_len: int, dtype: str, no_flash: bool, unfused: bool,
              grad_reduce: str | None = None, kernels: str | None = None, moe_imbalance: float | None = None,
              moe_dispatcher: str = "alltoall", moe_capacity: float | None = None, moe_pad: bool = False,
              optimizer_states: str = "fp32", attention_backend: str | None = None) -> JobSpec:
    if moe_capacity is not None and not moe_capacity > 0:  # 0 is JobSpec's dropless: a given 0 is a mistake
        raise SpecError(f"--moe-capacity-factor {moe_capacity:g}: an expert's capacity over the mean tokens must be "
                        "> 0 (leave it out for dropless routing)")
    imbalance = moe_imbalance_flag(DEFAULT_MOE_IMBALANCE if moe_imbalance is None else moe_imbalance)
    job = JobSpec(global_batch=global_batch, seq_len=seq_len, dtype=dtype,  # type: ignore[arg-type]
                  flash_attention=not no_flash, fused_kernels=not unfused, moe_imbalance=imbalance,
                  moe_dispatcher=moe_dispatcher,  # type: ignore[arg-type]
                  moe_capacity_factor=0.0 if moe_capacity is None else moe_capacity, moe_pad_to_capacity=moe_pad,
                  grad_reduce=grad_reduce or runs_grad_reduce(kernels, dtype),  # type: ignore[arg-type]
                  optimizer_states=optimizer_states,  # type: ignore[arg-type]
                  trainer=kernels or "megatron",  # type: ignore[arg-type]
                  attention_backend=attention_backend)  # type: ignore[arg-type]
    check_job_settings(TRAINER_CAPS[job.trainer], job)  # the kernels' trainer must run what is priced
    return job


def check_simulation_size(plan: Plan, where: str) -> None:
    """Estimating a plan simulates every pass of its pipeline schedule: at most MAX_PIPELINE_PASSES of them."""
    passes = plan.num_microbatches * plan.pp * plan.vpp
    if passes > MAX_PIPELINE_PASSES:
        raise SpecError(f"{where}: {plan.num_microbatches} micro-batches x pp {plan.pp} x vpp {plan.vpp} = "
                        f"{passes:,} pipeline passes exceed the maximum of {MAX_PIPELINE_PASSES:,} simulated; use a "
                        "larger --mbs or --dp, or a smaller --global-batch")


# ------------------------------------------------------------------------------------------------ output
def show(renderable: Any, as_json: bool) -> None:
    """One JSON document, or a rich renderable on stdout."""
    if as_json:
        typer.echo(dump_json(renderable))
    else:
        make_console().print(renderable)


def show_warnings(warnings: Sequence[str]) -> None:
    """Each warning as one `warning: ...` line on stderr."""
    for warning in warnings:
        typer.secho(f"warning: {' '.join(warning.split())}", fg="yellow", err=True)


def fail(message: str, code: int) -> None:
    """One red line on stderr (newlines folded so scripts can rely on a single line), then exit."""
    typer.secho(f"error: {' '.join(message.split())}", fg="red", err=True)
    raise SystemExit(code)
