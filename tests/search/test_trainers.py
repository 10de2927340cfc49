"""Trainer-faithful search (specs/trainers.py, search/space.py): a plan searched for a trainer uses only what that
trainer runs, and it is the fastest such plan.

The cross-check is independent of the restricted enumerator: the brute force (tests/search/bruteforce.py) walks
the *unrestricted* space and keeps the plans the capability table says the trainer runs (`unsupported` is
empty), so a filter the enumerator applies too eagerly (losing a plan the trainer runs) or too loosely (letting
one through it does not) shows up as a different optimum.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.estimate import CostModel
from autotune.emit import EmitInput, emit
from autotune.emit.deepspeed import DeepSpeedPlanError, emit_deepspeed
from autotune.emit.deepspeed import deepspeed_split as emitter_split
from autotune.errors import InfeasibleError, InvalidPlanError, SpecError
from autotune.search.pins import check_space
from autotune.search.planner import search
from autotune.search.space import SearchSpace, bucket_menu, for_trainer
from autotune.search.tables import to_plan
from autotune.search.trainers import best_per_trainer, reestimator
from autotune.specs.job import JobSpec
from autotune.specs.plan import DEFAULT_BUCKET, Plan, check_plan
from autotune.specs.trainer_jobs import runs_grad_reduce
from autotune.specs.trainers import (EMITTED_CAPS, FORK_CAPS, TRAINER_CAPS, as_run, caps_for, deepspeed_split,
                                     refusal, runners, runs_otherwise, unsupported)
from autotune.units import gib
from ._instances import Instance, fitting_bucket, instances
from .bruteforce import allowed_buckets, partitions

REL = 1e-6
ALL_CAPS = {**TRAINER_CAPS, **{caps.name: caps for caps in FORK_CAPS.values()}}
RANDOM = settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def brute_force_for(inst: Instance, space: SearchSpace, caps) -> Plan | None:
    """The fastest fitting plan of the unrestricted space that the trainer runs (plan by plan, by the table)."""
    cm = CostModel(inst.model, inst.hw, inst.job)
    best = None
    for c in inst.candidates(space):
        for layers in partitions(inst.model.num_layers, c.pp, c.vpp, even_only=c.even_only):
            for r in range(c.full_min, c.full_max + 1):
                for bucket in allowed_buckets(cm, c, bucket_menu(space, cm.job.trainer, c.dp)):
                    plan = to_plan(c, layers, bucket, r)
                    if unsupported(caps, plan, inst.model, inst.job):
                        continue
                    try:
                        check_plan(plan, inst.model, inst.job, inst.gpus, inst.hw.gpus_per_node)
                    except InvalidPlanError:
                        continue
                    est = cm.estimate(plan)
                    if est.fits and (best is None or est.step_time_s < best.step_time_s):
                        best = est
    return best


@RANDOM
@given(inst=instances(layers=st.integers(2, 6), gpus=st.sampled_from((4, 2, 1))),
       name=st.sampled_from(sorted(ALL_CAPS)))
def test_restricted_optimum_is_the_best_plan_the_trainer_runs(inst: Instance, name: str) -> None:
    caps = ALL_CAPS[name]
    space = SearchSpace()
    bucket = fitting_bucket(inst, space)
    space = replace(space, buckets=(bucket,))
    want = brute_force_for(inst, space, caps)
    restricted = replace(space, trainer=caps)
    if want is None:
        with pytest.raises(InfeasibleError):
            search(inst.model, inst.hw, inst.job, inst.gpus, restricted, top_k=0, time_limit_s=30)
        return
    got = search(inst.model, inst.hw, inst.job, inst.gpus, restricted, top_k=0, time_limit_s=30)
    assert got.status == "OPTIMAL"
    assert got.best.step_time_s == pytest.approx(want.step_time_s, rel=REL), (got.best.plan, want.plan)
    assert unsupported(caps, got.best.plan, inst.model, inst.job) == []


# ------------------------------------------------------------------------------------------------ catalog plans
JOB = JobSpec(global_batch=64, seq_len=4096)
MODEL = load_model("llama3-8b")
HW = load_hardware("h100-sxm")


def _own_job(name: str):
    """JOB as `plan --trainer name` builds it: that trainer's kernels and gradient buffers (its default)."""
    return replace(JOB, trainer=name, grad_reduce=runs_grad_reduce(name, JOB.dtype))


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    """llama3-8b on 16 H100 searched for each trainer (pp pinned to 2 and 4 so that pipelines are in play)."""
    out = {}
    for name in TRAINER_CAPS:
        job = _own_job(name)
        space = for_trainer(SearchSpace(pp=(2, 4)), caps_for(name))  # as `plan --trainer` builds it
        out[name] = search(MODEL, HW, job, 16, space, top_k=0).best.plan
    return out


@pytest.mark.parametrize("name", list(TRAINER_CAPS))
def test_plan_for_a_trainer_uses_only_its_capabilities(plans, name):
    plan, caps = plans[name], TRAINER_CAPS[name]
    assert unsupported(caps, plan, MODEL, replace(JOB, trainer=name)) == []
    assert plan.schedule in caps.schedules and plan.vocab in caps.vocabs
    assert plan.zero in caps.zero_stages(plan.pp) and (plan.cp == 1 or caps.cp)
    if caps.split == "deepspeed":
        assert plan.layers_per_stage == deepspeed_split(MODEL.num_layers, plan.pp)


@pytest.mark.parametrize("name", list(TRAINER_CAPS))
def test_emitting_a_plan_searched_for_the_trainer_downgrades_nothing(plans, name):
    """The emitter's own warnings agree with the table: none about the plan (notes on the model or the job's
    dtype aside: no plan can change those)."""
    plan = plans[name]
    est = CostModel(MODEL, HW, _own_job(name)).estimate(plan)
    inp = EmitInput(plan=plan, model=MODEL, job=_own_job(name), gpu="h100-sxm", gpus_per_node=8,
                    step_time_s=est.step_time_s, peak_memory_gib=gib(est.peak_memory_bytes), mfu=est.mfu)
    warnings = [w for w in emit(name, inp).warnings if not w.startswith(("model ", "dtype "))]
    assert warnings == []


def test_deepspeed_split_is_the_emitters():
    for layers in range(1, 40):
        for pp in range(1, min(layers, 9) + 1):
            assert deepspeed_split(layers, pp) == emitter_split(layers, pp)
    assert deepspeed_split(126, 4) == (32, 32, 31, 31)  # partition_balanced: the first L mod pp stages get one more


def test_deepspeed_refuses_pipeline_with_context_parallelism():
    plan = Plan(tp=1, pp=2, dp=2, cp=2, mbs=1, num_microbatches=16, layers_per_stage=(16, 16))
    assert "pp 2 with cp 2" in refusal(TRAINER_CAPS["deepspeed"], plan)
    assert refusal(TRAINER_CAPS["megatron"], plan) is None
    inp = EmitInput(plan=plan, model=MODEL, job=JOB, gpu="h100-sxm", gpus_per_node=8, step_time_s=1.0,
                    peak_memory_gib=1.0, mfu=0.5)
    with pytest.raises(DeepSpeedPlanError, match="cp 1 or (--)?pp 1"):
        emit_deepspeed(inp)
    assert search(MODEL, HW, JOB, 16, SearchSpace(pp=(2,), trainer=TRAINER_CAPS["deepspeed"]),
                  top_k=0).best.plan.cp == 1


# ------------------------------------------------------------------------------------------------ the table rules
ZB = Plan(tp=2, pp=4, dp=2, mbs=1, num_microbatches=32, schedule="zb-h1", zero=1, sequence_parallel=True,
          vocab="parallel", layers_per_stage=(8, 8, 8, 8))


def test_fork_only_features_need_the_fork():
    assert {"zb-h1", "v-half"}.isdisjoint(c for caps in TRAINER_CAPS.values() for c in caps.schedules)
    assert all("parallel" not in caps.vocabs for caps in TRAINER_CAPS.values())
    assert "parallel" in caps_for("megatron", "vocab-parallel").vocabs
    assert "zb-h1" in caps_for("megatron", "zero-bubble").schedules
    assert runners(ZB, MODEL, JOB) == []
    assert unsupported(caps_for("megatron", "vocab-parallel"), replace(ZB, schedule="1f1b"), MODEL, JOB) == []


def test_as_run_is_what_the_emitters_write():
    """zb-h1 runs as 1F1B over the same layers; vocabulary parallelism stays where the script has the fork's flag
    (Megatron's FORK_ARGS) and becomes the ends placement elsewhere; DeepSpeed recomputes whole layers."""
    plan, notes = as_run(EMITTED_CAPS["megatron"], ZB, MODEL)
    assert plan == replace(ZB, schedule="1f1b") and notes == ()
    plan, _ = as_run(TRAINER_CAPS["deepspeed"], replace(ZB, recompute="selective", tp_overlap=True), MODEL)
    assert (plan.schedule, plan.vocab, plan.recompute, plan.tp_overlap) == ("1f1b", "ends", "full", False)
    for caps in TRAINER_CAPS.values():  # a plan the trainer runs is run as it is
        runs, _ = as_run(caps, replace(ZB, schedule="1f1b", vocab="ends"), MODEL)
        assert runs == replace(ZB, schedule="1f1b", vocab="ends") or unsupported(caps, runs, MODEL, JOB) == []


@pytest.mark.parametrize("pins,flag", [
    ({"schedule": ("interleaved",)}, "--schedule interleaved"), ({"cp": (2,)}, "--cp 2"),
    ({"recompute": ("selective",)}, "--recompute selective"), ({"zero": (2,)}, None)])
def test_pins_a_trainer_never_runs_are_one_line_errors(pins, flag):
    space = SearchSpace(trainer=TRAINER_CAPS["deepspeed"], **pins)
    if flag is None:  # DeepSpeed runs ZeRO-2 without a pipeline: not a contradiction
        check_space(space, MODEL, JOB, 16, 8)
        return
    with pytest.raises(SpecError, match=f"^{flag}: --trainer deepspeed runs"):
        check_space(space, MODEL, JOB, 16, 8)


def test_unknown_trainer_and_misplaced_fork():
    with pytest.raises(SpecError, match="unknown trainer"):
        caps_for("nemo")
    with pytest.raises(SpecError, match="is a fork of megatron"):
        caps_for("deepspeed", "vocab-parallel")
    with pytest.raises(SpecError, match="unknown fork"):
        caps_for("megatron", "dualpipe")


# ------------------------------------------------------------------------------------------------ per trainer
def test_best_per_trainer_equals_each_restricted_search():
    space = SearchSpace(pp=(2, 4))
    winner = search(MODEL, HW, JOB, 16, space, top_k=0).best.plan
    fits = best_per_trainer(MODEL, HW, JOB, 16, space, winner)
    assert [f.trainer for f in fits] == list(TRAINER_CAPS)
    for f in fits:
        assert (f.status == "RUNS") == (not f.unsupported)
        if f.best is not None:
            job = replace(JOB, trainer=f.trainer)
            alone = search(MODEL, HW, job, 16, for_trainer(space, TRAINER_CAPS[f.trainer]), top_k=0).best
            assert f.best.plan == alone.plan


def test_reestimator_is_the_cost_model():
    cm = CostModel(MODEL, HW, JOB)
    plan = replace(ZB, schedule="1f1b", vocab="ends")
    est = cm.estimate(plan)
    assert reestimator(cm)(plan, JOB) == (est.step_time_s, gib(est.peak_memory_bytes), est.mfu)
    other = replace(JOB, trainer="deepspeed")  # another trainer's kernels: a cost model of that job
    est = CostModel(MODEL, HW, other).estimate(plan)
    assert reestimator(cm)(plan, other) == (est.step_time_s, gib(est.peak_memory_bytes), est.mfu)


def test_whole_layer_recompute_where_megatron_recomputes_part():
    """llama3-70b on 1024 H100 without a pipeline: Megatron's best recomputes 14 of 80 layers (block method);
    torchtitan and DeepSpeed checkpoint whole layers only, so their plans recompute all layers or none."""
    model, job = load_model("llama3-70b"), JobSpec(global_batch=1024, seq_len=8192)
    plans = {name: search(model, HW, replace(job, trainer=name), 1024, SearchSpace(pp=(1,), trainer=caps_for(name)),
                          top_k=0).best.plan for name in ("megatron", "torchtitan", "deepspeed")}
    assert plans["megatron"].recompute_layers is not None
    for name in ("torchtitan", "deepspeed"):
        assert plans[name].recompute_layers is None and plans[name].recompute in ("none", "full"), plans[name]


def test_a_trainer_without_a_bucket_setting_keeps_the_default_bucket() -> None:
    """torchtitan's FSDP2 has no gradient-bucket setting: its plans keep the bucket `check` reads its configs
    with, so plan and check agree on the same config; the others search every bucket."""
    from autotune.search.space import BUCKETS
    from autotune.specs.plan import DEFAULT_BUCKET
    from autotune.specs.trainers import TRAINER_CAPS

    for name in ("torchtitan", "colossalai"):
        assert for_trainer(SearchSpace(), TRAINER_CAPS[name]).buckets == (DEFAULT_BUCKET,)
    for name, own in (("megatron", 2_000_000_000), ("deepspeed", 500_000_000)):  # at dp 2000
        space = for_trainer(SearchSpace(), TRAINER_CAPS[name])
        assert bucket_menu(space, name, 2000) == (*BUCKETS, own)
    assert bucket_menu(SearchSpace(), "megatron", 200) == BUCKETS  # 200M: inside the grid's range
    assert for_trainer(SearchSpace(), None) == SearchSpace()


def test_a_trainer_that_runs_another_bucket_or_reduction_does_not_run_the_plan():
    """Found in review: a plan whose bucket torchtitan's and Colossal-AI's configs cannot set, or whose gradient
    reduction DeepSpeed and Colossal-AI run after the backward with a pipeline, is not run 'as planned' by them
    (best_per_trainer then searches their own best plan)."""
    plan = Plan(tp=1, pp=2, dp=8, mbs=1, num_microbatches=8, zero=0, layers_per_stage=(16, 16),
                bucket_size=320_000_000)
    said = {name: runs_otherwise(caps, plan, JOB) for name, caps in TRAINER_CAPS.items()}
    assert not any("bucket" in w or "reduced" in w for w in said["megatron"])
    assert any(w.startswith("bucket 320,000,000: torchtitan") for w in said["torchtitan"])
    for name in ("deepspeed", "colossalai"):
        assert any(w.startswith(f"gradients reduced during the backward: {name} reduces them after it")
                   for w in said[name])
    assert as_run(TRAINER_CAPS["colossalai"], plan, MODEL)[0].bucket_size == DEFAULT_BUCKET
    alone = replace(plan, pp=1, dp=16, num_microbatches=4, layers_per_stage=(32,), bucket_size=DEFAULT_BUCKET)
    assert not any("reduced" in w for w in runs_otherwise(TRAINER_CAPS["colossalai"], alone, JOB))
    assert "torchtitan" not in runners(plan, MODEL, JOB) and "deepspeed" not in runners(plan, MODEL, JOB)


def test_a_trainer_that_gathers_weights_in_its_step_does_not_run_a_plan_that_hides_the_gather():
    """Found in a user test: DeepSpeed's ZeRO-1/2 gather the updated weights in the optimizer step, where Megatron
    gathers them behind the next forward, so DeepSpeed does not run Megatron's ZeRO-2 plan as planned."""
    plan = Plan(tp=1, pp=1, dp=16, mbs=1, num_microbatches=4, zero=2, layers_per_stage=(32,))
    said = runs_otherwise(TRAINER_CAPS["deepspeed"], plan, JOB)
    assert "weights gathered behind the next forward: deepspeed gathers them in its optimizer step with zero 2" in said
    assert runs_otherwise(TRAINER_CAPS["megatron"], plan, JOB) == []
    assert "deepspeed" not in runners(plan, MODEL, JOB)


def test_a_bucket_that_changes_no_cost_is_the_default() -> None:
    """Found re-reading this release's change: since sync_buckets offers one bucket wherever every collective a
    bucket would split runs on whole buffers (2733538), ZeRO-3 plans, which reduce per block, carry the trainer's
    default bucket (Megatron's max(40M, 1M x dp)) where they carried an arbitrary one (10M) before; their cost is
    the same."""
    from autotune.search.space import BUCKETS, enumerate_candidates
    from autotune.search.tables import sync_buckets

    model, job = load_model("llama3-70b"), JobSpec(global_batch=1024, seq_len=8192)
    best = search(model, HW, job, 1024, SearchSpace(zero=(3,)), top_k=0).best
    assert best.plan.zero == 3 and best.plan.bucket_size == max(DEFAULT_BUCKET, 1_000_000 * best.plan.dp)
    cm = CostModel(model, HW, job)
    zero1 = next(c for c in enumerate_candidates(model, job, 1024, HW.gpus_per_node, SearchSpace(zero=(1,)))
                 if c.dp > 1)
    assert sync_buckets(cm, zero1, BUCKETS) == BUCKETS  # a bucketed reduction still chooses among them
