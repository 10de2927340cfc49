"""torchtitan's gradient accumulation with a pipeline, read from a config: how many times a step runs its schedule
(costmodel/accumulation.py costs them)."""

from __future__ import annotations

from autotune.check.reading import Reading
from autotune.errors import SpecError
from autotune.specs.plan import Plan


def pipeline_flushes(r: Reading, plan: Plan) -> int:
    """Runs of the schedule a step: torchtitan with a pipeline runs it once per gradient-accumulation step,
    global batch / (local batch x dp) of them (0.3.0 trainer.py, which asserts that this divides); 1 for the
    other trainers (one schedule over every micro-batch) and without a pipeline (the steps are the micro-batches)."""
    if r.trainer != "torchtitan" or plan.pp == 1 or not r.num_microbatches:
        return 1
    local, total = plan.mbs * r.num_microbatches, plan.mbs * plan.num_microbatches
    if total % local:
        raise SpecError(f"training.global_batch_size {plan.dp * total} is not a multiple of "
                        f"training.local_batch_size {local} x data-parallel degree {plan.dp} (torchtitan asserts it "
                        "at start-up); change a batch size")
    return total // local


def flushes_note(plan: Plan, flushes: int) -> str:
    """What check says of a config that runs its schedule `flushes` times a step."""
    return (f"gradient accumulation with a pipeline: torchtitan runs the {plan.schedule} schedule {flushes} times a "
            f"step (global batch {plan.dp * plan.mbs * plan.num_microbatches} / (local batch "
            f"{plan.mbs * plan.num_microbatches // flushes} x dp {plan.dp})), each over "
            f"{plan.num_microbatches // flushes} micro-batches with its own warm-up and cool-down; costed so")
