"""The planner against exhaustive search on small mixture-of-experts instances (issue 14): EP and ETP join the
search, the dense-first layers and the experts' memory enter every stage, and the planner still returns the
brute-force optimum and proves it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import load_hardware
from autotune.search.planner import search
from autotune.search.space import SearchSpace
from autotune.specs.job import JobSpec
from autotune.specs.model import ModelSpec
from ._instances import Instance, fitting_bucket, single_gpu_peak, with_memory
from .test_optimality import assert_planner_matches


def tiny_moe(*, layers: int = 4, experts: int = 8, top_k: int = 2, dense_first: int = 1,
             shared: int = 0) -> ModelSpec:
    return ModelSpec(name="tiny-moe", num_layers=layers, hidden_size=512, num_heads=8, num_kv_heads=8, head_dim=64,
                     ffn_hidden_size=2048, vocab_size=32000, activation="swiglu", norm="rmsnorm",
                     tied_embeddings=False, num_experts=experts, moe_top_k=top_k, moe_ffn_hidden_size=1024,
                     num_shared_experts=shared, shared_expert_ffn_hidden_size=1024 if shared else 0,
                     first_dense_layers=dense_first)


def _instance(model: ModelSpec, gpus: int, fraction: float, gpu: str = "h100-sxm") -> Instance:
    hw, job = load_hardware(gpu), JobSpec(global_batch=16, seq_len=2048)
    return Instance(model, with_memory(hw, int(fraction * single_gpu_peak(model, hw, job))), job, gpus)


@pytest.mark.parametrize(("model", "gpus", "fraction"), [
    (tiny_moe(), 8, 4.0),                        # memory never binds
    (tiny_moe(), 8, 0.3),                        # experts must be sharded (ep) or recomputed
    (tiny_moe(dense_first=0, shared=1), 4, 0.5),
    (tiny_moe(layers=6, experts=4, top_k=1, dense_first=2), 8, 0.45),
    (tiny_moe(), 16, 0.25),                      # two nodes: an EP group of 16 spans them
    # Llama 4 Maverick's pattern (every second layer MoE): stages are charged the surplus of their windows
    (replace(tiny_moe(layers=6, dense_first=0), moe_layer_freq=2), 8, 0.35),
])
def test_moe_planner_matches_brute_force(model: ModelSpec, gpus: int, fraction: float) -> None:
    inst = _instance(model, gpus, fraction)
    space = SearchSpace(tp_overlap=(False,))
    s = fitting_bucket(inst, space)
    assert_planner_matches(inst, replace(space, buckets=(s,)), top_k=0)


def test_expert_parallelism_is_searched() -> None:
    """Experts that do not fit replicated, with tp, pp and ZeRO pinned away: the plan shards them with ep > 1."""
    model = replace(tiny_moe(experts=16), moe_ffn_hidden_size=4096, vocab_size=1024)
    inst = _instance(model, 8, 0.3)
    space = SearchSpace(tp=(1,), pp=(1,), zero=(0,), tp_overlap=(False,))
    res = search(inst.model, inst.hw, inst.job, inst.gpus, space, top_k=0, time_limit_s=30)
    assert res.best.plan.ep > 1
    stage = res.best.plan.tp * res.best.plan.cp * res.best.plan.dp
    assert stage % (res.best.plan.ep * res.best.plan.etp) == 0


def test_pinned_ep_is_obeyed() -> None:
    inst = _instance(tiny_moe(), 8, 4.0)
    res = search(inst.model, inst.hw, inst.job, inst.gpus, SearchSpace(ep=(2,), tp_overlap=(False,)), top_k=0,
                 time_limit_s=30)
    assert res.best.plan.ep == 2


def test_deepep_leaves_only_the_groups_it_runs_over() -> None:
    """With DeepEP, the space keeps the ETP*EP groups DeepEP's kernels run over (specs.plan.deepep_group_issue):
    on 4-GPU nodes, groups of 2 and 4 inside a node (and no dispatch at all); on 8-GPU nodes also 8 and 16."""
    from autotune.catalog import load_model
    from autotune.search.space import enumerate_candidates

    model = load_model("qwen3-30b-a3b")

    def groups(dispatcher: str, per_node: int) -> set[int]:
        job = JobSpec(global_batch=64, seq_len=4096, moe_dispatcher=dispatcher)  # type: ignore[arg-type]
        return {c.ep * c.etp for c in enumerate_candidates(model, job, 16, per_node, SearchSpace())}

    assert groups("deepep", 4) == {1, 2, 4}
    assert groups("deepep", 8) == {1, 2, 4, 8, 16}
    assert {8, 16} <= groups("alltoall", 4)


def test_a_pinned_bucket_below_a_matrix_keeps_its_label_and_is_costed_as_the_matrix() -> None:
    """The plan states the bucket asked for (the trainer's config gets it); the estimate and the search cost it
    as the smallest weight matrix it cannot split, alike (reviewer: the search relabelled it)."""
    from autotune.costmodel.estimate import CostModel
    from autotune.costmodel.memory import whole_tensor_bucket
    inst = _instance(tiny_moe(), 8, 4.0)
    res = search(inst.model, inst.hw, inst.job, inst.gpus, SearchSpace(buckets=(1,), tp=(1,), tp_overlap=(False,)),
                 top_k=0, time_limit_s=30)
    plan = res.best.plan
    assert plan.bucket_size == 1 and whole_tensor_bucket(inst.model, plan.tp) > 1
    cm = CostModel(inst.model, inst.hw, inst.job)
    floor = replace(plan, bucket_size=whole_tensor_bucket(inst.model, plan.tp))
    assert res.best.step_time_s == cm.estimate(plan).step_time_s == cm.estimate(floor).step_time_s
