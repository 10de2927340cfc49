"""What a config overlaps, and what `check` says about it: Megatron-LM's gradient reduction, the distributed
optimizer's weight gather and the interleaved schedule's pipeline sends, DeepSpeed's overlap_comm (JobSpec's
overlap_grad_reduce, overlap_param_gather, overlap_p2p; specs/overlap.py costs them)."""

from __future__ import annotations

from typing import Any

from autotune.check.reading import Reading
from autotune.errors import SpecError
from autotune.specs.plan import Plan

GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"


def overlap_settings(args: dict[str, Any], zero: int, vpp: int) -> dict[str, Any]:
    """Reading's overlap fields from a Megatron script's parsed flags.
    - Without --overlap-grad-reduce, DDP and the distributed optimizer reduce in finish_grad_sync once the backward
      ends (megatron-core 0.16 distributed/param_and_grad_buffer.py); FSDP2 reduce-scatters per block regardless,
      and Megatron-FSDP forces overlap when it shards gradients (megatron_fsdp.py: optim_grads and
      optim_grads_params set and assert it).
    - Without --overlap-param-gather, the distributed optimizer gathers the updated weights in its step
      (optimizer/distrib_optimizer.py); it matters only there (ZeRO-1; Megatron-FSDP gathers its own).
    - --no-overlap-p2p-communication makes the interleaved schedule wait on every send; warmup-flush needs the
      overlap, which Megatron-LM forces off without interleaving (ModelParallelConfig refuses the pair).
    - --overlap-moe-expert-parallel-comm runs each micro-batch's expert all-to-all beside another's compute
      (costmodel/epoverlap.py); check_plan holds it to megatron-core's rules."""
    if args.get("--overlap-p2p-communication-warmup-flush") and (args.get("--no-overlap-p2p-communication")
                                                                   or vpp <= 1):
        raise SpecError("--overlap-p2p-communication-warmup-flush needs overlap_p2p_comm, which "
                        + ("--no-overlap-p2p-communication turns off" if vpp > 1 else "Megatron-LM turns off without "
                           "interleaving (vpp 1)") + ": megatron-core refuses it; drop the flag")
    group = args.get(GROUP_FLAG)
    if group is not None and (not isinstance(group, str) or not group.isdigit() or int(group) < 1):
        raise SpecError(f"{GROUP_FLAG} {group!r}: expected a whole number")
    fsdp = bool(args.get("--use-megatron-fsdp"))
    return {"overlap_grad_reduce": bool(args.get("--overlap-grad-reduce") or args.get("--use-torch-fsdp2")
                                        or (fsdp and zero >= 2)),
            "overlap_param_gather": bool(args.get("--overlap-param-gather")) or fsdp or zero != 1,
            "overlap_p2p": not args.get("--no-overlap-p2p-communication"),
            "warmup_flush": bool(args.get("--overlap-p2p-communication-warmup-flush")),
            "microbatch_group": int(group) if group is not None else None,
            "ep_overlap": bool(args.get("--overlap-moe-expert-parallel-comm"))}


def overlap_notes(r: Reading, plan: Plan) -> tuple[list[str], dict[str, bool]]:
    """What `check` says of the overlaps the config leaves off where they matter for `plan` (data parallelism for
    the reduction and the gather, interleaving for the sends), and the job's overlap switches with those that do not
    matter set on (so a document records only what changes the cost). A micro-batch group megatron-core refuses
    for this plan is an error (pipeline_parallel/schedules.py: at least pp, at most the micro-batches, and no
    remainder short of pp)."""
    synced, interleaved = plan.dp * plan.cp > 1, plan.vpp > 1
    flags = {"overlap_grad_reduce": r.overlap_grad_reduce or not synced,
             "overlap_param_gather": r.overlap_param_gather or not synced,
             "overlap_p2p": r.overlap_p2p or not interleaved}
    notes = []
    if r.trainer == "megatron":
        notes += [said for key, said in _MEGATRON_WITHOUT.items() if not flags[key]]
        if r.warmup_flush:
            notes.append("--overlap-p2p-communication-warmup-flush: costed without it (the warm-up and cool-down "
                         "sends waited on), a little slower than the run")
        if r.microbatch_group is not None and interleaved:
            notes += _group_notes(r.microbatch_group, plan)
    elif r.trainer == "deepspeed" and not flags["overlap_grad_reduce"] and plan.pp == 1 and plan.zero in (1, 2):
        notes.append(f"zero_optimization.overlap_comm false: ZeRO-{plan.zero} " + (
            "reduces after the backward" if plan.zero == 1 else "stalls its backward on each reduce-scatter")
            + " (the best plan turns it on)")
    return notes, flags


#: What a Megatron script that leaves an overlap off runs instead (the best plan `check` compares with turns it on).
_MEGATRON_WITHOUT = {
    "overlap_grad_reduce": "no --overlap-grad-reduce: the gradients are reduced once the backward ends, not behind it "
                           "(the best plan turns it on)",
    "overlap_param_gather": "no --overlap-param-gather: the distributed optimizer gathers the updated weights in its "
                            "step, not behind the next forward (the best plan turns it on)",
    "overlap_p2p": "--no-overlap-p2p-communication: the interleaved schedule waits on every pipeline send (the best "
                   "plan overlaps them)",
}


def _group_notes(group: int, plan: Plan) -> list[str]:
    m, pp = plan.num_microbatches, plan.pp
    if group < pp or group > m or 0 < m % group < pp:
        raise SpecError(f"{GROUP_FLAG} {group}: megatron-core needs at least pp ({pp}), at most the micro-batches "
                        f"({m}), and no remainder of micro-batches short of pp; drop it for the default (pp)")
    if group == pp:
        return []
    return [f"{GROUP_FLAG} {group}: costed as Megatron's default group of pp {pp}; a larger group warms up more "
            f"micro-batches (2(p-1) + (v-1) x group on rank 0), so the run holds more activations and waits on more "
            "sends than predicted"]
