"""The planner picks vocabulary parallelism or an uneven split when, and only when, the cost model says it
wins (paper 4): the free search's placement is the best of the searches restricted to each placement.

Llama-3-8B's body with a 16k, 200k and 256k vocabulary, pp 8 on 8 H100s. On one node (NVLink) vocabulary
parallelism's per-micro-batch collectives are cheap and it wins at 256k; with the pipeline spread over 8
nodes (one GPU each) they cross the network: at 16k the even split with the vocabulary layers on the ends
wins, at 200k the uneven split does (at 128k vocabulary parallelism still wins by 1%, with Megatron's fused
cross-entropy).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import load_hardware
from autotune.search.planner import search
from autotune.search.space import SearchSpace
from autotune.specs.job import JobSpec
from ._instances import tiny_model

JOB = JobSpec(global_batch=32, seq_len=4096)
SPACE = SearchSpace(pp=(8,), tp=(1,), dp=(1,), cp=(1,))


def llama_body(vocab: int):
    return tiny_model(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=vocab)


@pytest.mark.parametrize(("vocab", "gpus_per_node", "expected"), [
    (256_000, 8, "parallel"),
    (16_000, 1, "ends"),
    (200_000, 1, "balanced"),
])
def test_placement_is_chosen_only_when_it_wins(vocab, gpus_per_node, expected):
    model, hw = llama_body(vocab), replace(load_hardware("h100-sxm"), gpus_per_node=gpus_per_node)
    free = search(model, hw, JOB, 8, SPACE)
    on_ends = search(model, hw, JOB, 8, replace(SPACE, vocab=("ends", "balanced")))
    parallel = search(model, hw, JOB, 8, replace(SPACE, vocab=("parallel",)))
    assert free.status == on_ends.status == parallel.status == "OPTIMAL"
    assert free.best.plan.vocab == expected
    best_restricted = min(on_ends.best.step_time_s, parallel.best.step_time_s)
    assert free.best.step_time_s == pytest.approx(best_restricted, rel=1e-12)
    if expected == "parallel":
        assert parallel.best.step_time_s < on_ends.best.step_time_s
    else:
        assert on_ends.best.step_time_s < parallel.best.step_time_s
        assert (free.best.plan.layers_per_stage == (4,) * 8) == (expected == "ends")
