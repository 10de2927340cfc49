"""Pins that can never hold (--tp that splits no heads, --vocab parallel with tied embeddings, a pin the chosen
trainer never runs, a --layers-per-stage that does not sum to the model) as one-line errors naming the flag and the
fix, before the search starts. The generators in space.py obey the same rules silently; here each pin is checked
on its own so the message can say which flag to change.
"""

from __future__ import annotations

from autotune.errors import SpecError
from autotune.search.space import MAX_CP, MAX_VPP, SearchSpace, grid_fits
from autotune.specs.job import JobSpec, state_zero_stages
from autotune.specs.model import ModelSpec
from autotune.specs.plan import is_even_split, positions_issue
from autotune.specs.trainers import DEEPSPEED_MOE, TrainerCaps


def check_space(space: SearchSpace, model: ModelSpec, job: JobSpec, gpus: int, gpus_per_node: int) -> None:
    """Turn pins that can never hold into one-line errors naming the flag and the fix (exit 1); the planner's
    own "empty space" error (exit 2) is left for spaces that are empty without a contradictory pin."""
    if (why := positions_issue(model, job.seq_len)) is not None:
        raise SpecError(why)
    _check_degrees(space, model, job, gpus, gpus_per_node)
    _check_choices(space, model)
    costed = set(job.state_zero_stages) & set(state_zero_stages(
        job.trainer if space.trainer is None else space.trainer.name, job.optimizer_states))
    if space.zero is not None and not set(space.zero) & costed:
        stages = ",".join(map(str, sorted(costed)))
        raise SpecError(f"--zero {','.join(map(str, space.zero))} with --optimizer-states {job.optimizer_states}: "
                        f"these Adam states are costed under ZeRO {stages} here (Megatron's distributed optimizer; "
                        f"DeepSpeed's ZeRO 1-3); pin --zero {stages} or use --optimizer-states fp32")
    if space.trainer is not None:
        _check_trainer(space, space.trainer)
        _check_moe(space.trainer, model)
    if space.layers_per_stage is not None:
        _check_layers(space, space.layers_per_stage, model)


def _check_degrees(space: SearchSpace, model: ModelSpec, job: JobSpec, gpus: int, gpus_per_node: int) -> None:
    """Each pinned degree on its own: heads, node size, GPU count, layers, batch, sequence."""
    grids = [m for m in space.tp_mode or ("1d",) if m != "1d"]
    for tp in space.tp or ():
        if grids and (tp == 1 or any(grid_fits(m, tp, model) for m in grids)):
            continue
        if grids and "1d" not in (space.tp_mode or ()):
            raise SpecError(f"--tp {tp} is not a {'/'.join(grids)} tensor-parallel grid that splits {model.name} "
                            "(2-D: q^2, 2.5-D: d*q^2, 3-D: q^3, with q dividing the heads and widths)")
        if model.num_heads % tp or model.num_kv_heads % tp:
            ok = [d for d in range(1, model.num_heads + 1) if model.num_heads % d == 0 and model.num_kv_heads % d == 0]
            raise SpecError(f"--tp {tp} does not divide the {model.num_heads} attention heads and "
                            f"{model.num_kv_heads} key/value heads of {model.name}; "
                            f"use one of {', '.join(map(str, ok))}")
        if tp > gpus_per_node and not space.allow_cross_node_tp:
            raise SpecError(f"tp {tp} exceeds the {gpus_per_node} GPUs of a node; pass --allow-cross-node-tp")
        if gpus_per_node % tp and gpus > gpus_per_node and not space.allow_cross_node_tp:
            raise SpecError(f"tp {tp} does not divide the {gpus_per_node} GPUs of a node, so some tp groups would "
                            "straddle two nodes; pick a tp that divides it or pass --allow-cross-node-tp")
    for flag, values in (("--tp", space.tp), ("--pp", space.pp), ("--cp", space.cp), ("--dp", space.dp)):
        for v in values or ():
            if space.allow_idle and v > gpus:  # idle GPUs: any degree up to the GPU count (space.degree_values)
                raise SpecError(f"{flag} {v} exceeds --gpus {gpus}")
            if not space.allow_idle and gpus % v:
                raise SpecError(f"{flag} {v} does not divide --gpus {gpus}")
    for pp in space.pp or ():
        if pp > model.num_layers:
            raise SpecError(f"--pp {pp} exceeds the {model.num_layers} layers of {model.name}")
    for flag, values in (("--dp", space.dp), ("--mbs", space.mbs)):
        for v in values or ():
            if job.global_batch % v:
                raise SpecError(f"{flag} {v} does not divide --global-batch {job.global_batch}")
    for cp in space.cp or ():
        if cp > 1 and job.seq_len % (2 * cp):
            raise SpecError(f"--cp {cp} needs --seq-len divisible by 2 x cp = {2 * cp} (load-balanced ring "
                            f"attention), got {job.seq_len}")


def _check_choices(space: SearchSpace, model: ModelSpec) -> None:
    """Pins that contradict each other: vpp vs schedule, ZeRO vs pp, sequence parallelism vs tp."""
    if any(z > 3 for z in space.zero or ()):
        raise SpecError(f"--zero {max(space.zero or ())}: ZeRO stages are 0, 1, 2 and 3")
    for v in space.vpp or ():
        if v > 1 and (v > MAX_VPP or model.num_layers % v):
            raise SpecError(f"--vpp {v} must divide the {model.num_layers} layers of {model.name} and be <= {MAX_VPP} "
                            "(the search keeps every model chunk the same size; `estimate` costs an uneven layout)")
    if space.schedule == ("1f1b",) and space.vpp is not None and 1 not in space.vpp:
        raise SpecError("--schedule 1f1b has one model chunk per rank; drop --vpp or use --schedule interleaved")
    if space.schedule == ("interleaved",) and space.vpp == (1,):
        raise SpecError("--schedule interleaved needs --vpp >= 2")
    if space.zero and min(space.zero) >= 2 and space.pp and min(space.pp) > 1:
        raise SpecError(f"--zero {','.join(map(str, space.zero))} shards gradients, which pipeline parallelism "
                        "forbids; use --zero 0,1 with --pp > 1")
    if space.vocab == ("parallel",) and model.tied_embeddings:
        raise SpecError(f"--vocab parallel needs untied input and output embeddings, and {model.name} ties them; "
                        "use --vocab ends or balanced")
    if space.vocab == ("parallel",) and space.pp == (1,):
        raise SpecError("--vocab parallel splits the vocabulary layers over pipeline ranks: it needs --pp >= 2")
    if space.sequence_parallel == (True,) and space.tp == (1,):
        raise SpecError("--sequence-parallel needs tp > 1; drop it or pin --tp > 1")
    if space.pp == (1,) and space.schedule is not None and "1f1b" not in space.schedule:
        raise SpecError(f"--schedule {','.join(space.schedule)} pipelines micro-batches over ranks: it needs "
                        "--pp >= 2 (or --schedule 1f1b for pp 1)")
    _check_experts(space, model)


def _check_experts(space: SearchSpace, model: ModelSpec) -> None:
    """Expert-parallel pins against the model (the same rules check_plan applies to one plan)."""
    for flag, values in (("--ep", space.ep), ("--etp", space.etp)):
        if not model.is_moe and values is not None and set(values) != {1}:
            raise SpecError(f"{flag} {','.join(map(str, values))}: {model.name} is dense (no experts); drop {flag}")
    if space.ep_overlap == (True,) and (not model.is_moe or space.ep == (1,)):
        raise SpecError(f"--ep-overlap overlaps the expert all-to-all, which {model.name} "
                        + ("does not have (it is dense)" if not model.is_moe else "does not run at --ep 1")
                        + "; drop --ep-overlap")
    if space.ep_overlap == (True,):  # megatron-core's rules (specs/experts.check_ep_overlap), said as pins
        if space.recompute == ("full",):
            raise SpecError("--ep-overlap with --recompute full: megatron-core overlaps the expert all-to-all only "
                            "without full recomputation; pin --recompute none or selective, or drop --ep-overlap")
        if space.pp is not None and min(space.pp) > 1 and space.schedule is not None and \
                "interleaved" not in space.schedule:
            raise SpecError("--ep-overlap with --pp > 1 runs in the interleaved schedule (megatron-core needs a "
                            "virtual pipeline); pin --schedule interleaved, or drop --ep-overlap")
        if model.mtp_layers > 1:
            raise SpecError(f"--ep-overlap: megatron-core overlaps at most one MTP layer, and {model.name} has "
                            f"{model.mtp_layers}; drop --ep-overlap")
    if not model.is_moe:
        return
    tps = set(space.tp) if space.tp is not None else None
    for etp in space.etp or ():  # the search's two layouts (search/experts.py): experts whole, or split like attention
        if etp != 1 and tps is not None and etp not in tps:
            raise SpecError(f"--etp {etp}: the search splits experts 1 or tp ways (here --tp "
                            f"{','.join(map(str, sorted(tps)))}); pin --tp {etp} too, or cost etp {etp} with "
                            "`autotune estimate`")
    for ep in space.ep or ():
        if model.num_experts % ep:
            ok = [d for d in range(1, model.num_experts + 1) if model.num_experts % d == 0]
            raise SpecError(f"--ep {ep} does not divide the {model.num_experts} experts of {model.name}; use one of "
                            f"{', '.join(map(str, ok))}")


def _check_moe(caps: TrainerCaps, model: ModelSpec) -> None:
    """An MoE model the chosen trainer cannot build (specs/trainers.py's row says which it can)."""
    if not model.is_moe or (caps.moe and (caps.moe_models is None or model.known_as in caps.moe_models)):
        return
    if caps.moe:
        raise SpecError(f"--trainer {caps.name}: it has no model {model.name} (its MoE models: "
                        f"{', '.join(caps.moe_models or ())}); use --trainer megatron")
    raise SpecError(f"--trainer {caps.name}: autotune writes no expert-parallel (MoE) config for it"
                    + (f" ({DEEPSPEED_MOE})" if caps.name == "deepspeed" else "")
                    + f"; use --trainer megatron for {model.name}")


def _check_trainer(space: SearchSpace, caps: TrainerCaps) -> None:
    """Pins the chosen trainer never runs: the flag, what the trainer runs instead, and the way out."""
    name = caps.name.replace("+", " --fork ")
    zeros = sorted(set(caps.zero_flat) | set(caps.zero_pipelined))
    runs: list[tuple[str, tuple | None, tuple]] = [
        ("--schedule", space.schedule, caps.schedules), ("--vocab", space.vocab, caps.vocabs),
        ("--zero", space.zero, tuple(zeros)), ("--tp-mode", space.tp_mode, caps.tp_modes),
        ("--cp", space.cp, (1,) if not caps.cp else tuple(range(1, MAX_CP + 1))),
        ("--vpp", space.vpp, tuple(range(1, caps.max_vpp + 1))),
        ("--recompute", space.recompute, ("none", "full") + (("selective",) if caps.selective_recompute else ())),
        ("--sequence-parallel", space.sequence_parallel, caps.sequence_parallel),
        ("--tp-overlap", space.tp_overlap, (True, False) if caps.tp_overlap else (False,)),
        ("--ep-overlap", space.ep_overlap, (True, False) if caps.ep_overlap else (False,)),
    ]
    for flag, pins, options in runs:
        if pins is not None and not any(v in options for v in pins):
            shown = lambda vs: ",".join(str(v).lower() for v in vs)  # noqa: E731
            raise SpecError(f"{flag} {shown(pins)}: --trainer {name} runs {shown(options)}; drop {flag} or plan for "
                            "another trainer (autotune plan without --trainer shows which trainers run what)")
    if space.zero is not None and space.pp is not None and all(p > 1 for p in space.pp) and not set(
            space.zero) & set(caps.zero_pipelined):
        staged = ",".join(map(str, caps.zero_pipelined))
        raise SpecError(f"--zero {','.join(map(str, space.zero))} with --pp {','.join(map(str, space.pp))}: "
                        f"--trainer {name} runs ZeRO {staged} with a pipeline; pin --zero {staged} or drop --zero")


def _check_layers(space: SearchSpace, layers: tuple[int, ...], model: ModelSpec) -> None:
    """A pinned partition: one pp, one entry per stage, summing to the model, compatible with vocab and vpp."""
    text = ",".join(map(str, layers))
    if space.pp is not None and len(space.pp) != 1:
        raise SpecError(f"--layers-per-stage pins the partition, so --pp must be one value, got "
                        f"{','.join(map(str, space.pp))}")
    if space.pp != (len(layers),):
        raise SpecError(f"--layers-per-stage {text} has {len(layers)} stages but --pp is {space.pp[0]}")
    if sum(layers) != model.num_layers:
        raise SpecError(f"--layers-per-stage {text} sums to {sum(layers)}, but {model.name} has "
                        f"{model.num_layers} layers")
    if 0 in layers[1:-1]:
        raise SpecError(f"--layers-per-stage {text}: only the first and last stage may have no layers")
    if space.vocab == ("ends",) and not is_even_split(layers):
        raise SpecError(f"--layers-per-stage {text} is uneven, and --vocab ends means an even split; "
                        "use --vocab balanced")
    vpps = [v for v in space.vpp or range(1, MAX_VPP + 1)
            if (v == 1) == (space.schedule != ("interleaved",)) or space.schedule is None]
    if not any(v == 1 or (0 not in layers and all(n % v == 0 for n in layers)) for v in vpps):
        raise SpecError(f"--layers-per-stage {text}: the interleaved schedule needs every stage's layer count "
                        f"to be a positive multiple of vpp ({', '.join(map(str, vpps))} allowed)")
