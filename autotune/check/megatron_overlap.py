"""What a Megatron-LM script overlaps: its gradient reduction, the distributed optimizer's weight gather and the
interleaved schedule's pipeline sends (JobSpec's overlap_grad_reduce, overlap_param_gather, overlap_p2p)."""

from __future__ import annotations

from typing import Any

from autotune.errors import SpecError


def overlap_settings(args: dict[str, Any], zero: int, pp: int, vpp: int, notes: list[str]) -> dict[str, bool]:
    """Reading's overlap fields from the parsed flags, noting what is costed otherwise than it runs.
    - Without --overlap-grad-reduce, DDP and the distributed optimizer reduce in finish_grad_sync once the backward
      ends (megatron-core 0.16 distributed/param_and_grad_buffer.py); FSDP2 reduce-scatters per block regardless,
      and Megatron-FSDP forces overlap when it shards gradients (megatron_fsdp.py: optim_grads and
      optim_grads_params set and assert it).
    - Without --overlap-param-gather, the distributed optimizer gathers the updated weights in its step
      (optimizer/distrib_optimizer.py); it matters only there (ZeRO-1; Megatron-FSDP gathers its own).
    - --no-overlap-p2p-communication makes the interleaved schedule wait on every send."""
    group = args.get("--microbatch-group-size-per-virtual-pipeline-stage")
    if group is not None:
        _check_group(group, pp, vpp, notes)
    if args.get("--overlap-p2p-communication-warmup-flush"):
        if args.get("--no-overlap-p2p-communication"):
            raise SpecError("--overlap-p2p-communication-warmup-flush with --no-overlap-p2p-communication: "
                            "megatron-core refuses it (ModelParallelConfig needs overlap_p2p_comm); drop one")
        notes.append("--overlap-p2p-communication-warmup-flush: costed without it (the warm-up and cool-down sends "
                     "waited on), a little slower than the run")
    fsdp = bool(args.get("--use-megatron-fsdp"))
    out = {"overlap_grad_reduce": bool(args.get("--overlap-grad-reduce") or args.get("--use-torch-fsdp2")
                                       or (fsdp and zero >= 2)),
           "overlap_param_gather": bool(args.get("--overlap-param-gather")) or fsdp or zero != 1,
           "overlap_p2p": not args.get("--no-overlap-p2p-communication")}
    for key, said in _WITHOUT.items():
        if not out[key] and (key != "overlap_p2p" or vpp > 1):
            notes.append(said)
    return out


#: What a script that leaves an overlap off runs instead (a note; the best plan `check` compares with turns it on).
_WITHOUT = {
    "overlap_grad_reduce": "no --overlap-grad-reduce: the gradients are reduced once the backward ends, not behind it "
                           "(the best plan turns it on)",
    "overlap_param_gather": "no --overlap-param-gather: the distributed optimizer gathers the updated weights in its "
                            "step, not behind the next forward (the best plan turns it on)",
    "overlap_p2p": "--no-overlap-p2p-communication: the interleaved schedule waits on every pipeline send (the best "
                   "plan overlaps them)",
}


def _check_group(group: Any, pp: int, vpp: int, notes: list[str]) -> None:
    """--microbatch-group-size-per-virtual-pipeline-stage: megatron-core takes a whole number from pp up (its
    schedules raise otherwise); autotune orders and warms up the interleaved schedule with the default group, pp."""
    if not isinstance(group, str) or not group.isdigit() or int(group) < pp:
        raise SpecError(f"--microbatch-group-size-per-virtual-pipeline-stage {group!r}: megatron-core needs a whole "
                        f"number of at least pp ({pp}); drop it for the default (pp)")
    if vpp > 1 and int(group) != pp:
        notes.append(f"--microbatch-group-size-per-virtual-pipeline-stage {group}: costed as Megatron's default group "
                     f"of pp {pp}; a larger group warms up more micro-batches (2(p-1) + (v-1) x group on rank 0), so "
                     "the run holds more activations and waits on more sends than predicted")
