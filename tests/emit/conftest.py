"""Shared by the emitter tests (tests/emit): the `check_golden` fixture.

Golden files live under tests/emit/golden/<trainer>/<scenario>/: one file per emitted file, plus
`_warnings.txt` holding the emitter's warnings, one per line. After an intended change, regenerate them with

    AUTOTUNE_REGEN_GOLDEN=1 python -m pytest tests/emit

and review `git diff tests/emit/golden` before committing. The helper itself is `scenarios.check_golden`
(importable as `from .scenarios import check_golden`); the scenario inputs are in scenarios.py.
"""

from __future__ import annotations

import pytest

from .scenarios import check_golden as _check_golden


@pytest.fixture
def check_golden():
    """check_golden(result, trainer, scenario): compare with (or, under AUTOTUNE_REGEN_GOLDEN=1, rewrite) the
    golden files of tests/emit/golden/<trainer>/<scenario>/."""
    return _check_golden
