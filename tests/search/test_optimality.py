"""The planner against exhaustive search (tests/search/bruteforce.py): on small spaces `search` returns exactly
the brute-force optimum under the cost model, says OPTIMAL, and raises InfeasibleError iff nothing fits.

The random spaces cover every recompute setting (none, selective, full on some or all layers) and offer
buckets both smaller and larger than the smallest stage (the planner then falls back to a fitting one; the
brute force mirrors that). The hand-picked cases below were bugs once: each is a regression test.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from autotune.catalog import load_hardware
from autotune.costmodel.estimate import CostModel
from autotune.errors import InfeasibleError
from autotune.search import partition
from autotune.search.partition import solve_partition
from autotune.search.planner import PlanResult, search
from autotune.search.space import Candidate, SearchSpace, enumerate_candidates, for_trainer
from autotune.search.tables import candidate_costs
from autotune.specs.job import JobSpec
from autotune.specs.trainers import TRAINER_CAPS
from autotune.specs.plan import is_even_split
from autotune.units import SOLVER_TIME_UNIT_S
from ._instances import Instance, fitting_bucket, instances, single_gpu_peak, tiny_model, with_memory
from .bruteforce import brute_force, candidate_optimum

#: The solver rounds every time coefficient to 1 ns; the step times it compares are >= tens of microseconds.
REL = 1e-6
RANDOM = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def assert_planner_matches(inst: Instance, space: SearchSpace, *, top_k: int = 3) -> PlanResult | None:
    """search() finds the brute-force optimum and proves it, or both find nothing."""
    bf = brute_force(inst.model, inst.hw, inst.job, inst.gpus, space).best
    if bf is None:
        with pytest.raises(InfeasibleError):
            search(inst.model, inst.hw, inst.job, inst.gpus, space, top_k=top_k, time_limit_s=30)
        return None
    try:
        res = search(inst.model, inst.hw, inst.job, inst.gpus, space, top_k=top_k, time_limit_s=30)
    except InfeasibleError as exc:
        pytest.fail(f"planner says infeasible ({exc}) but {bf.plan} fits at {bf.step_time_s:.9g} s")
    assert res.status == "OPTIMAL" and res.limit == ""
    assert res.best.fits
    assert res.best.step_time_s == pytest.approx(bf.step_time_s, rel=REL), (res.best.plan, bf.plan)
    return res


def note(res: PlanResult | None) -> None:
    """Hypothesis statistics (--hypothesis-show-statistics): how varied the drawn optima are."""
    if res is None:
        event("nothing fits")
    else:
        event(f"best pp {res.best.plan.pp}, {'even' if is_even_split(res.best.plan.layers_per_stage) else 'uneven'}")


@pytest.mark.slow
@RANDOM
@given(inst=instances())
def test_planner_matches_brute_force(inst: Instance) -> None:
    space = SearchSpace()
    s = fitting_bucket(inst, space)
    note(assert_planner_matches(inst, replace(space, buckets=_distinct(s // 2, s, 4 * s + 1)), top_k=0))


@pytest.mark.slow
@settings(RANDOM, max_examples=30)
@given(inst=instances())
def test_bucket_choice_matches_brute_force(inst: Instance) -> None:
    """Four buckets, one larger than some stage, and the default top-3 bookkeeping (TP overlap pinned off: the
    overlap knob is covered by test_planner_matches_brute_force)."""
    space = SearchSpace(tp_overlap=(False,))
    s = fitting_bucket(inst, space)
    note(assert_planner_matches(inst, replace(space, buckets=_distinct(s // 4, s // 2, s, 8 * s))))


@pytest.mark.slow
@settings(RANDOM, max_examples=50)
@given(inst=instances(layers=st.integers(4, 8), gpus=st.sampled_from((4, 8))), pp=st.sampled_from((2, 4)))
def test_pipelined_partition_matches_brute_force(inst: Instance, pp: int) -> None:
    """pp pinned to 2 or 4, where the partition (and the vocabulary layers on the ends) decides the optimum (TP
    overlap pinned off: covered by test_planner_matches_brute_force)."""
    space = SearchSpace(pp=(pp,), tp_overlap=(False,))
    s = fitting_bucket(inst, space)
    note(assert_planner_matches(inst, replace(space, buckets=_distinct(s // 2, s)), top_k=1))


def _distinct(*sizes: int) -> tuple[int, ...]:
    return tuple(sorted({max(1, b) for b in sizes}))


# ------------------------------------------------------------------------------------------- hand-picked
def _h100_8_layers(hidden: int, heads: int, ffn: int) -> Instance:
    model = tiny_model(layers=8, hidden=hidden, heads=heads, kv_heads=8, ffn=ffn * hidden, vocab=256000)
    return Instance(model, load_hardware("h100-sxm"), JobSpec(global_batch=16, seq_len=4096), 0)


@pytest.mark.parametrize(("hidden", "heads", "ffn", "tp"), [(8192, 64, 4, 8), (4096, 32, 8, 4)])
def test_large_vocabulary_unloads_the_last_stage(hidden: int, heads: int, ffn: int, tp: int) -> None:
    """256k vocabulary, 8 layers, pp 4: the LM head costs about 1-2 layers, so the optimum (checked against
    brute force) gives the last stage fewer layers than the busiest one."""
    inst = replace(_h100_8_layers(hidden, heads, ffn), gpus=4 * tp)
    res = assert_planner_matches(inst, SearchSpace(pp=(4,), tp=(tp,), cp=(1,), dp=(1,), buckets=(10_000_000,)))
    layers = res.best.plan.layers_per_stage
    assert not is_even_split(layers)
    assert layers[-1] < max(layers)
    assert res.best.plan.vocab == "balanced"


def _memory_bound(fraction: float) -> Instance:
    model = tiny_model(layers=8, hidden=1024, heads=8, vocab=32000, activation="gelu", tied=True)
    job = JobSpec(global_batch=16, seq_len=2048)
    hw = load_hardware("a100-80gb")
    return Instance(model, with_memory(hw, int(single_gpu_peak(model, hw, job) * fraction)), job, 2)


@pytest.mark.parametrize("fraction", [0.6, 0.7])
def test_memory_forces_partial_full_recompute(fraction: float) -> None:
    """pp 2 with too little memory for every activation: the optimum recomputes some layers in full."""
    space = SearchSpace(tp=(1,), cp=(1,), dp=(1,), pp=(2,), zero=(0,), recompute=("none", "full"),
                        buckets=(40_000_000,))
    res = assert_planner_matches(_memory_bound(fraction), space)
    assert res.best.plan.recompute == "full"


def test_nothing_fits_is_infeasible_for_both() -> None:
    space = SearchSpace(tp=(1,), cp=(1,), dp=(1,), pp=(2,), zero=(0,), buckets=(40_000_000,))
    assert assert_planner_matches(_memory_bound(0.3), space) is None


# ---------------------------------------------------------------------- regressions (bugs found by these tests)
def test_fallback_bucket_prunes_the_optimum() -> None:
    model = tiny_model(layers=2, hidden=64, heads=2, vocab=1000, activation="gelu")
    inst = Instance(model, load_hardware("h100-sxm"), JobSpec(global_batch=4, seq_len=128), 4)
    assert_planner_matches(inst, SearchSpace(buckets=(10_000_000,), recompute=("none",), zero=(0,), tp=(1,),
                                             cp=(1,), sequence_parallel=(False,)), top_k=0)


def test_forced_recompute_bound_prunes_the_optimum() -> None:
    model = tiny_model(layers=5, hidden=512, heads=8, kv_heads=2, ffn=2048, vocab=32000, tied=True)
    hw = with_memory(load_hardware("h100-sxm"), 235512729, gpus_per_node=2)
    inst = Instance(model, hw, JobSpec(global_batch=8, seq_len=512), 4)
    assert_planner_matches(inst, SearchSpace(tp=(2,), pp=(1,), cp=(1,), zero=(3,), mbs=(1,), recompute=("full",)))


def test_full_recompute_stalls_the_solver() -> None:
    model = tiny_model(layers=6, hidden=128, heads=8, ffn=256, vocab=256000)
    cm = CostModel(model, replace(load_hardware("h100-sxm"), gpus_per_node=2), JobSpec(global_batch=32, seq_len=128))
    c = Candidate(tp=2, pp=2, dp=2, cp=1, mbs=2, num_microbatches=8, schedule="1f1b", vpp=1, base="none",
                  full_min=0, full_max=6, zero=1, sp=True, vocab="balanced")
    res = solve_partition(candidate_costs(cm, c, (4000,)), 6)
    best = candidate_optimum(cm, c, SearchSpace(buckets=(4000,)), 8).best
    assert res.status == "OPTIMAL"
    assert res.objective * SOLVER_TIME_UNIT_S == pytest.approx(best.step_time_s, rel=REL)


@pytest.mark.parametrize("schedule", ["zb-h1", "v-half", "1f1b"])
@pytest.mark.parametrize("first_budget", [None, 1])
def test_new_schedules_match_brute_force(schedule, first_budget, monkeypatch) -> None:
    """ZB-H1 and V-Half (searched when pinned) against exhaustive enumeration of the exact simulated step time;
    with first_budget 1 every first CP-SAT attempt stops short of a proof, which exercises the fallbacks
    between the critical-path rounds (an improvement constraint of one round must not leak into the next).
    Batches of 2 and 3 leave fewer micro-batches than stages (every W of the later ranks after their last B)."""
    if first_budget is not None:
        monkeypatch.setattr(partition, "_ATTEMPTS", (("AUTOMATIC_SEARCH", first_budget),) + partition._ATTEMPTS[1:])
    hw = replace(load_hardware("h100-sxm"), gpus_per_node=4)
    for layers, vocab, batch in ((8, 32000, 8), (12, 256000, 16), (8, 256000, 16), (8, 32000, 2), (12, 256000, 3)):
        model = tiny_model(layers=layers, hidden=256, heads=8, ffn=512, vocab=vocab)
        job = JobSpec(global_batch=batch, seq_len=1024)
        space = SearchSpace(pp=(4,), schedule=(schedule,))
        got = search(model, hw, job, 4, space)
        want = brute_force(model, hw, job, 4, space).best
        assert got.status == "OPTIMAL"
        assert got.best.step_time_s == pytest.approx(want.step_time_s, rel=1e-6), (schedule, layers, vocab)


# ------------------------------------------------------------------------------------------- optimizer states
@pytest.mark.slow
@settings(RANDOM, max_examples=30)
@given(inst=instances(), grad_reduce=st.sampled_from(("fp32", "bf16")))
def test_bf16_optimizer_states_match_brute_force(inst: Instance, grad_reduce: str) -> None:
    """16-bit Adam states (JobSpec.optimizer_states) shrink the optimizer term and leave only ZeRO-1: the planner
    still finds the brute-force optimum (TP overlap pinned off: covered above)."""
    inst = replace(inst, job=replace(inst.job, optimizer_states="bf16", grad_reduce=grad_reduce))
    space = SearchSpace(tp_overlap=(False,))
    s = fitting_bucket(inst, space)
    res = assert_planner_matches(inst, replace(space, buckets=_distinct(s // 2, s)), top_k=1)
    assert res is None or res.best.plan.zero == 1
    note(res)


@pytest.mark.slow
@settings(RANDOM, max_examples=20)
@given(inst=instances())
def test_torchtitan_bf16_moments_match_brute_force(inst: Instance) -> None:
    """torchtitan's bf16 moments (fused_opt_states_bf16) are costed under every ZeRO stage it runs, FSDP included:
    the planner restricted to torchtitan still finds the brute-force optimum over them."""
    inst = replace(inst, job=replace(inst.job, trainer="torchtitan", optimizer_states="bf16-moments"))
    space = for_trainer(SearchSpace(tp_overlap=(False,)), TRAINER_CAPS["torchtitan"])
    assume(any(True for _ in inst.candidates(space)))  # torchtitan runs some layout of the instance
    s = fitting_bucket(inst, space)
    note(assert_planner_matches(inst, replace(space, buckets=_distinct(s // 2, s)), top_k=1))


def test_torchtitan_bf16_moments_keep_fsdp_in_the_space() -> None:
    """Megatron's 16-bit states leave only its distributed optimizer (zero 1); torchtitan's bf16 moments keep
    FSDP (zero 3) and replication (zero 0)."""
    model = tiny_model(layers=4, hidden=256, heads=8, ffn=512, vocab=32000)
    hw = replace(load_hardware("h100-sxm"), gpus_per_node=4)
    stages = {}
    for trainer in ("megatron", "torchtitan"):
        job = JobSpec(global_batch=8, seq_len=1024, trainer=trainer, optimizer_states="bf16-moments")
        space = for_trainer(SearchSpace(), TRAINER_CAPS[trainer])
        stages[trainer] = {c.zero for c in enumerate_candidates(model, job, 4, hw.gpus_per_node, space)}
    assert stages == {"megatron": {1}, "torchtitan": {0, 3, 1}}


@settings(RANDOM, max_examples=15)
@given(inst=instances(layers=st.integers(2, 4), gpus=st.sampled_from((2, 4))))
def test_bf16_optimizer_states_never_slow_the_best_plan(inst: Instance) -> None:
    """Less state memory never lowers throughput: over the same ZeRO-1 plans, the best step with bf16 moments is
    at most the best with fp32 ones, and whatever fits with fp32 fits with them (fp32 >= bf16-moments >= bf16)."""
    space = SearchSpace(zero=(1,), tp_overlap=(False,))
    best = [brute_force(inst.model, inst.hw, replace(inst.job, optimizer_states=states), inst.gpus, space).best
            for states in ("fp32", "bf16-moments", "bf16")]
    for more, less in zip(best, best[1:]):
        if more is not None:
            assert less is not None and less.step_time_s <= more.step_time_s * (1 + REL)


# ------------------------------------------------------------------------------------------- reduction after backward
@settings(RANDOM, max_examples=25)
@given(inst=instances(layers=st.integers(2, 8), gpus=st.sampled_from((2, 4, 8))), pp=st.sampled_from((1, 2, 4)))
def test_reduction_after_the_backward_matches_brute_force(inst: Instance, pp: int) -> None:
    """overlap_grad_reduce False: every stage all-reduces (or reduce-scatters and gathers) its whole buffer once
    its backward ends (estimate._unoverlapped); the partition model's whole-buffer syncs (Sync.whole) find the
    brute-force optimum over free partitions."""
    inst = replace(inst, job=replace(inst.job, overlap_grad_reduce=False))
    space = SearchSpace(pp=(pp,), tp_overlap=(False,))
    assume(any(True for _ in inst.candidates(space)))
    s = fitting_bucket(inst, space)
    note(assert_planner_matches(inst, replace(space, buckets=_distinct(s // 2, s)), top_k=1))


@settings(RANDOM, max_examples=20)
@given(inst=instances(layers=st.integers(2, 8), gpus=st.sampled_from((2, 4, 8))), pp=st.sampled_from((1, 2, 4)))
def test_weights_gathered_in_the_step_match_brute_force(inst: Instance, pp: int) -> None:
    """Megatron's distributed optimizer without --overlap-param-gather gathers each stage's whole buffer in the
    step while its reduction stays bucketed behind the backward (a whole Sync beside bucketed ones): the planner
    finds the brute-force optimum over free partitions and both bucket sizes."""
    inst = replace(inst, job=replace(inst.job, overlap_param_gather=False))
    space = SearchSpace(pp=(pp,), zero=(1,), tp_overlap=(False,))
    assume(any(True for _ in inst.candidates(space)))
    s = fitting_bucket(inst, space)
    note(assert_planner_matches(inst, replace(space, buckets=_distinct(s // 2, s)), top_k=1))


@settings(RANDOM, max_examples=20)
@given(inst=instances(layers=st.integers(2, 8), gpus=st.sampled_from((2, 4, 8)), fractions=(0.6, 1.0, 4.0)),
       trainer=st.sampled_from(("deepspeed", "colossalai")))
def test_trainer_reductions_match_brute_force(inst: Instance, trainer: str) -> None:
    """Under DeepSpeed and Colossal-AI some candidates reduce during the backward (no pipeline; for DeepSpeed with
    ZeRO) and others after it (overlap.overlaps_grad_reduce): the planner restricted to the trainer still finds
    the brute-force optimum over both."""
    grad_reduce = "bf16" if trainer == "deepspeed" else "fp32"  # what each one's config runs
    inst = replace(inst, job=replace(inst.job, trainer=trainer, grad_reduce=grad_reduce))
    space = for_trainer(SearchSpace(tp_overlap=(False,)), TRAINER_CAPS[trainer])
    assume(any(True for _ in inst.candidates(space)))
    s = fitting_bucket(inst, space)
    note(assert_planner_matches(inst, replace(space, buckets=_distinct(s // 2, s)), top_k=1))


def test_reduction_after_the_backward_unloads_the_first_stage() -> None:
    """Bound by the network (one GPU per node, a small batch): a stage's reduction after its backward hides behind
    the backwards of the stages before it, so stage 0, with none, gets fewer layers than the even split."""
    model = tiny_model(layers=12, hidden=1024, heads=8, vocab=32000)
    hw = replace(load_hardware("h100-sxm"), gpus_per_node=1)
    inst = Instance(model, hw, JobSpec(global_batch=8, seq_len=256, overlap_grad_reduce=False), 4)
    res = assert_planner_matches(inst, SearchSpace(pp=(2,), tp=(1,), zero=(0,), tp_overlap=(False,)), top_k=0)
    assert res is not None and res.best.plan.layers_per_stage == (5, 7)
