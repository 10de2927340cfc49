"""The training job: checked on construction, with messages that name the CLI flag."""

from __future__ import annotations

import pytest

from autotune.errors import SpecError
from autotune.specs.job import JobSpec


def test_defaults_and_tokens_per_step():
    job = JobSpec(global_batch=512, seq_len=2048)
    assert (job.dtype, job.flash_attention, job.fused_kernels) == ("bf16", True, True)
    assert job.tokens_per_step == 512 * 2048


@pytest.mark.parametrize(("kw", "message"), [
    ({"global_batch": 0, "seq_len": 2048}, "--global-batch must be > 0"),
    ({"global_batch": 8, "seq_len": -1}, "--seq-len must be > 0"),
    ({"global_batch": 8, "seq_len": 2048, "dtype": "fp32"}, "--dtype must be one of bf16, fp16, fp8"),
])
def test_bad_jobs_name_the_flag(kw, message):
    with pytest.raises(SpecError, match=message):
        JobSpec(**kw)


@pytest.mark.parametrize("imbalance,capacity,pad,load", [
    (1.25, 0.0, False, 1.25),  # dropless: the routing imbalance
    (1.25, 1.1, False, 1.1),  # the busiest expert drops what passes its capacity
    (1.25, 2.0, False, 1.25),  # a capacity above the imbalance drops nothing
    (1.0, 1.5, True, 1.5),  # padded: every expert runs its capacity, balanced or not
    (1.25, 0.8, False, 0.8),  # below the mean: every expert drops
])
def test_the_busiest_experts_load_under_a_capacity_factor(imbalance, capacity, pad, load):
    """Megatron's capacity factor C: an expert takes at most C x the mean tokens (moe_utils apply_token_drop),
    padded to exactly that with --moe-pad-expert-input-to-capacity (hand-derived loads)."""
    job = JobSpec(global_batch=8, seq_len=1024, moe_imbalance=imbalance, moe_capacity_factor=capacity,
                  moe_pad_to_capacity=pad)
    assert job.moe_load == load


@pytest.mark.parametrize("kwargs,message", [
    ({"moe_pad_to_capacity": True}, "give --moe-capacity-factor too"),
    ({"moe_capacity_factor": -1.0}, "must be > 0 and <= 64"),
    ({"moe_capacity_factor": float("nan")}, "must be > 0 and <= 64"),
    ({"moe_capacity_factor": 1.2, "moe_dispatcher": "deepep"}, "costed for the alltoall dispatcher"),
])
def test_bad_capacity_settings_name_the_flag(kwargs, message):
    with pytest.raises(SpecError, match=message):
        JobSpec(global_batch=8, seq_len=1024, **kwargs)


def test_the_loss_kernel_is_the_trainers_own_unless_given():
    """Megatron: the native fusion autotune's configs write, or the config's; the PyTorch trainers: unfused, also
    for a Megatron job re-costed for them (the fused kernels are Megatron's)."""
    from dataclasses import replace

    assert JobSpec(global_batch=8, seq_len=128).runs_cross_entropy == "native"
    assert JobSpec(global_batch=8, seq_len=128, trainer="torchtitan").runs_cross_entropy == "unfused"
    te = JobSpec(global_batch=8, seq_len=128, cross_entropy="te")
    assert te.runs_cross_entropy == "te"
    assert replace(te, trainer="deepspeed").runs_cross_entropy == "unfused"
    with pytest.raises(SpecError, match="cross_entropy must be one of unfused, native, te"):
        JobSpec(global_batch=8, seq_len=128, cross_entropy="fast")  # type: ignore[arg-type]
