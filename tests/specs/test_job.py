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
