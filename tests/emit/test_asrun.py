"""What an emitted config runs (emit/asrun.py), which its header states and `check` reads back: the kernels, the
token dispatcher, the gradient bucket and the model as the trainer builds them."""

from __future__ import annotations

from dataclasses import replace

from autotune.catalog import load_hardware, load_model
from autotune.costmodel.estimate import CostModel
from autotune.emit import EmitInput, bucket_warning, emit
from autotune.emit.asrun import as_planned, run_figures, what_runs
from autotune.search.trainers import reestimator
from autotune.specs.job import JobSpec
from autotune.specs.plan import DEFAULT_BUCKET, Plan
from autotune.specs.trainer_jobs import as_run_job
from autotune.specs.trainers import TRAINER_CAPS

from .scenarios import GOLDEN

EVEN = GOLDEN["even"]  # llama3-8b, tp 2 x pp 2 x dp 4, the default bucket


def _with_reestimate(inp: EmitInput) -> EmitInput:
    hw = replace(load_hardware(inp.gpu), gpus_per_node=inp.gpus_per_node)
    return replace(inp, reestimate=reestimator(CostModel(inp.model, hw, inp.job)))


def test_a_job_that_names_the_trainers_own_kernel_runs_as_planned():
    """A torchtitan plan document records the kernel it was costed with (cuDNN); the config runs torchtitan's own,
    the same kernel: the header states the plan's figures, not a re-estimate of something else."""
    inp = replace(EVEN, job=replace(EVEN.job, trainer="torchtitan", grad_reduce="fp32", attention_backend="cudnn"),
                  plan=replace(EVEN.plan, recompute="full"))
    run = what_runs(inp, "torchtitan")
    assert run.job.attention_backend is None and as_planned(inp, run)


def test_deepep_runs_as_all_to_alls_outside_megatron():
    job = JobSpec(global_batch=64, seq_len=4096, moe_dispatcher="deepep")
    assert as_run_job(job, "torchtitan").moe_dispatcher == "alltoall"
    assert as_run_job(job, "megatron").moe_dispatcher == "deepep"


def test_a_bucket_the_config_cannot_set_runs_as_the_default():
    """torchtitan and Colossal-AI set no gradient bucket: the config runs the default one, so the header is
    re-estimated for it (what `check` reads back) and a warning says why; Megatron sets the planned one."""
    inp = _with_reestimate(replace(EVEN, plan=replace(EVEN.plan, bucket_size=10_000_000)))
    assert what_runs(inp, "torchtitan").plan.bucket_size == DEFAULT_BUCKET
    assert what_runs(inp, "megatron").plan.bucket_size == 10_000_000
    warning = bucket_warning(TRAINER_CAPS["torchtitan"], inp)
    assert warning is not None and "torchtitan's config sets no gradient bucket" in warning
    assert warning in emit("torchtitan", inp).warnings
    assert bucket_warning(TRAINER_CAPS["megatron"], inp) is None and bucket_warning(TRAINER_CAPS["torchtitan"], EVEN) \
        is None


def test_a_window_the_config_does_not_build_is_re_estimated():
    """GPT-OSS's 128-token windows: the Megatron config attends over the whole sequence, and the header's figures
    are those of that model (trainer_jobs.as_run_model), not of the windowed one the plan was costed for."""
    model, hw = load_model("gpt-oss-120b"), load_hardware("h100-sxm")
    job = JobSpec(global_batch=128, seq_len=4096, trainer="torchtitan", attention_backend="cudnn")
    plan = Plan(tp=1, pp=4, dp=16, ep=8, mbs=1, num_microbatches=8, zero=1, layers_per_stage=(9, 9, 9, 9))
    est = CostModel(model, hw, job).estimate(plan)
    inp = _with_reestimate(EmitInput(plan=plan, model=model, job=job, gpu="h100-sxm", gpus_per_node=8,
                                     step_time_s=est.step_time_s, peak_memory_gib=0.0, mfu=est.mfu))
    run = what_runs(inp, "megatron")
    assert run.model is not None and run.model.sliding_window_layers == 0 and not as_planned(inp, run)
    full = CostModel(run.model, hw, run.job).estimate(run.plan)
    assert run_figures(inp, run)[0] == full.step_time_s


def test_expert_tp_torchtitan_does_not_run_is_re_estimated_as_it_runs():
    """torchtitan 0.3.x splits experts by ep alone once ep > 1: a plan of ep 8, etp 2 is emitted with etp 1, and
    the header's figures were those of etp 2 (8.9 s where `check` of the file says 3.7 s; user-tester). What runs
    is etp 1 (0.2.x's TOML keeps etp = tp), and with ep 1 the experts follow the attention's tp."""
    model = load_model("qwen3-30b-a3b")
    plan = Plan(tp=2, pp=1, dp=32, cp=1, mbs=2, num_microbatches=8, ep=8, etp=2, zero=1, sequence_parallel=True,
                layers_per_stage=(48,))
    inp = replace(EVEN, model=model, plan=plan, job=JobSpec(global_batch=512, seq_len=4096), gpu="h100-sxm")
    assert what_runs(inp, "torchtitan").plan.etp == 1
    assert what_runs(inp, "torchtitan", "toml").plan.etp == 2
    assert what_runs(replace(inp, plan=replace(plan, ep=1, etp=1)), "torchtitan").plan.etp == 2
    assert what_runs(inp, "megatron").plan.etp == 2
    run = what_runs(inp, "torchtitan")
    hw = load_hardware("h100-sxm")
    step, peak, _ = run_figures(_with_reestimate(inp), run)
    assert step == CostModel(model, hw, run.job).estimate(run.plan).step_time_s
