"""specs/experts.py: when Megatron overlaps the expert all-to-all (--overlap-moe-expert-parallel-comm), each rule
of megatron-core 0.16's TransformerConfig.__post_init__ naming its field and the way out, and the search keeping
to them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.catalog import load_hardware, load_model
from autotune.errors import InvalidPlanError
from autotune.search.space import SearchSpace, enumerate_candidates
from autotune.specs.experts import check_ep_overlap
from autotune.specs.job import JobSpec
from autotune.specs.plan import Plan, check_plan
from autotune.specs.trainers import TRAINER_CAPS, as_run, unsupported

QWEN = load_model("qwen3-30b-a3b")  # 48 layers, 128 experts, no MTP
DEEPSEEK = load_model("deepseek-v3")  # one MTP layer
GOOD = Plan(tp=1, pp=2, dp=8, ep=8, mbs=1, num_microbatches=16, schedule="interleaved", vpp=2,
            layers_per_stage=(24, 24), ep_overlap=True)
JOB = JobSpec(global_batch=128, seq_len=4096)


def test_a_plan_megatron_overlaps_passes():
    check_plan(GOOD, QWEN, JOB, 16, 8)
    check_plan(replace(GOOD, pp=1, dp=16, schedule="1f1b", vpp=1, num_microbatches=8, layers_per_stage=(48,)),
               QWEN, JOB, 16, 8)


@pytest.mark.parametrize(("change", "model", "trainer", "message"), [
    ({}, QWEN, "torchtitan", "--overlap-moe-expert-parallel-comm; torchtitan has no overlap of the expert"),
    ({"ep": 1}, QWEN, "megatron", "needs an MoE model with ep > 1; set ep_overlap false"),
    ({"recompute": "full"}, QWEN, "megatron", "runs without full recomputation"),
    ({"schedule": "1f1b", "vpp": 1}, QWEN, "megatron", "with pp > 1 runs in Megatron's interleaved schedule"),
    ({"pp": 1, "dp": 16, "schedule": "1f1b", "vpp": 1, "layers_per_stage": (61,)}, DEEPSEEK, "megatron",
     "at most one MTP layer, and then pp > 1"),
])
def test_each_rule_names_its_field(change, model, trainer, message):
    with pytest.raises(InvalidPlanError, match=message.replace("(", "\\(").replace(")", "\\)")):
        check_ep_overlap(replace(GOOD, **change), model, trainer)


def test_the_search_offers_the_overlap_only_where_megatron_runs_it():
    hw = load_hardware("h100-sxm")
    cands = list(enumerate_candidates(QWEN, JOB, 16, hw.gpus_per_node, SearchSpace(tp=(1,), cp=(1,))))
    overlapped = [c for c in cands if c.ep_overlap]
    assert overlapped and all(c.ep > 1 and c.full_max == 0 and (c.pp == 1 or c.schedule == "interleaved")
                              for c in overlapped)
    # pinned off, or another trainer's kernels: never
    assert not any(c.ep_overlap for c in enumerate_candidates(QWEN, JOB, 16, 8, SearchSpace(ep_overlap=(False,))))
    titan = replace(JOB, trainer="torchtitan")
    assert not any(c.ep_overlap for c in enumerate_candidates(QWEN, titan, 16, 8, SearchSpace(tp=(1,))))


def test_other_trainers_say_they_run_it_unoverlapped():
    caps = TRAINER_CAPS["torchtitan"]
    assert "ep_overlap: torchtitan has no overlap of the expert all-to-all" in unsupported(caps, GOOD, QWEN, JOB)
    assert as_run(caps, GOOD, QWEN)[0].ep_overlap is False
    assert as_run(TRAINER_CAPS["megatron"], GOOD, QWEN)[0].ep_overlap is True
