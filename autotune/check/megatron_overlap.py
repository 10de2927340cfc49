"""What a Megatron-LM script overlaps: its gradient reduction, the distributed optimizer's weight gather and the
interleaved schedule's pipeline sends (JobSpec's overlap_grad_reduce, overlap_param_gather, overlap_p2p)."""

from __future__ import annotations

from typing import Any


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
    if group is not None and vpp > 1 and str(group) != str(pp):
        notes.append(f"--microbatch-group-size-per-virtual-pipeline-stage {group}: costed as Megatron's default "
                     f"group of pp {pp} (the interleaved order and its warm-up depend on it)")
    fsdp = bool(args.get("--use-megatron-fsdp"))
    return {"overlap_grad_reduce": bool(args.get("--overlap-grad-reduce") or args.get("--use-torch-fsdp2")
                                        or (fsdp and zero >= 2)),
            "overlap_param_gather": bool(args.get("--overlap-param-gather")) or fsdp or zero != 1,
            "overlap_p2p": not args.get("--no-overlap-p2p-communication")}
