"""Megatron flags `check` reads but costs otherwise than they run: the note each gets, so a reader sees where the
prediction and the run part ways."""

from __future__ import annotations

from typing import Any

from autotune.errors import SpecError

#: flag -> the note a config giving it gets (the flag recognised, its effect costed as said)
COSTED_OTHERWISE = {
    "--rampup-batch-size": "--rampup-batch-size: the batch ramps up; checked at the full --global-batch-size",
    "--fp8-param-gather": "--fp8-param-gather: the distributed optimizer gathers FP8 weights; costed with 16-bit "
                          "ones",
    # Transformer Engine 2.8 initialize_ub: a config's methods change which userbuffers it registers (a ring-exchange
    # reduce-scatter holds 2tp-1 chunks, an FP8 pipeline buffer one byte an element), which the file alone says
    "--tp-comm-overlap-cfg": "--tp-comm-overlap-cfg: the userbuffers are costed as Transformer Engine's default "
                             "methods register them (12 of (seq x mbs / cp) x hidden); the file's own methods are "
                             "not read",
    # (user-tester: these three were read as neutral without a word)
    "--num-distributed-optimizer-instances": "--num-distributed-optimizer-instances: each instance shards the "
                                             "optimizer state over its part of the data-parallel ranks, as costed "
                                             "for memory with the distributed optimizer (under Megatron FSDP, as "
                                             "one instance); the step is costed as one instance over all of them",
    "--cp-comm-type": "--cp-comm-type: costed as the p2p ring exchange of K/V (all-gather, all-to-all and "
                      "hierarchical exchanges are not modelled)",
    "--fp8-recipe": "--fp8-recipe: every FP8 recipe is costed as delayed/current per-tensor scaling on the GPU's FP8 "
                    "peak (MXFP8 runs on Blackwell only; blockwise scaling's extra scale traffic is not modelled)",
    # (user-tester: these were "unknown flags", though Megatron-LM's arguments.py has them and they change the step)
    "--delay-wgrad-compute": "--delay-wgrad-compute: weight gradients deferred to overlap the expert/tensor "
                             "communication; costed where the backward computes them",
    "--enable-cuda-graph": "--enable-cuda-graph: CUDA graphs replay each layer without kernel launches; costed with "
                           "the launch gaps",
    "--use-tp-pp-dp-mapping": "--use-tp-pp-dp-mapping: ranks ordered tp-pp-dp; costed in Megatron's default order "
                              "(tp-cp-ep-dp-pp), which decides which groups share a node",
    # (user-tester: TransformerConfig fields, not "unknown flags"; each changes the step's time or memory)
    "--cuda-graph-impl": "--cuda-graph-impl: CUDA graphs replay the captured scope without kernel launches, "
                         "keeping their static buffers; costed with the launch gaps and without the buffers",
    "--cpu-offloading": "--cpu-offloading: layers' activations (or weights) go to host memory between forward and "
                        "backward; costed on the GPU, so the memory figure is the run's without offloading",
    "--fine-grained-activation-offloading": "--fine-grained-activation-offloading: the --offload-modules' "
                                            "activations go to host memory; costed on the GPU, without offloading",
}
#: Flags whose value only qualifies one above (read with it, no note of their own)
QUALIFIERS = ("--cuda-graph-scope", "--cuda-graph-warmup-steps", "--cpu-offloading-num-layers",
              "--cpu-offloading-activations", "--cpu-offloading-weights", "--offload-modules")


#: values of a COSTED_OTHERWISE flag that are what the cost model prices (no note)
PRICED_AS_GIVEN = {"--num-distributed-optimizer-instances": {"1"}, "--cp-comm-type": {"p2p"},
                   "--fp8-recipe": {"delayed", "tensorwise"}}


#: What megatron-core 0.16's TransformerConfig.__post_init__ refuses beside --cpu-offloading: flag -> the feature
_NOT_WITH_OFFLOADING = (("--pipeline-model-parallel-size", "pipeline parallelism"),
                        ("--recompute-granularity", "activation recomputation"),
                        ("--recompute-activations", "activation recomputation"), ("--cuda-graph-impl", "CUDA graphs"),
                        ("--fine-grained-activation-offloading", "fine-grained activation offloading"))


def costed_otherwise_notes(args: dict[str, Any], notes: list[str]) -> None:
    """Append the note of each COSTED_OTHERWISE flag the config gives (a switch that is off, or a value the cost
    model prices as it is, gives none), after refusing what megatron-core refuses beside CPU offloading."""
    if args.get("--cpu-offloading"):
        layers, offloaded = args.get("--num-layers"), args.get("--cpu-offloading-num-layers", "0")
        if isinstance(layers, str) and layers.isdigit() and not (
                isinstance(offloaded, str) and offloaded.isdigit() and int(offloaded) < int(layers)):
            raise SpecError(f"--cpu-offloading-num-layers {offloaded}: megatron-core offloads at most --num-layers "
                            f"{int(layers) - 1} layers (0 to num_layers - 1); lower it")
        for flag, feature in _NOT_WITH_OFFLOADING:
            value = args.get(flag)
            if value not in (None, False, "1", "none"):
                given = flag if value is True else f"{flag} {value}"
                raise SpecError(f"--cpu-offloading with {given}: megatron-core refuses CPU offloading with {feature} "
                                "(TransformerConfig); drop one")
    notes.extend(note for flag, note in COSTED_OTHERWISE.items()
                 if args.get(flag) not in (None, False, "none") and args.get(flag) not in PRICED_AS_GIVEN.get(flag, ()))
