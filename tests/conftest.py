"""Shared fixtures: the CLI run in-process (typer's CliRunner) and as a user runs it (python -m autotune)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent

#: A fixed terminal width and no forced colour, so rich output does not depend on who runs the tests.
_ENV = {"COLUMNS": "120", "TERMINAL_WIDTH": "120"}


@pytest.fixture
def cli() -> Callable[..., object]:
    """Invoke the typer app in-process (success paths: errors are converted only by `main`)."""
    from autotune.cli import app

    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(app, list(args), input=input, env={**_ENV, "FORCE_COLOR": None},
                             catch_exceptions=False)

    return invoke


@pytest.fixture
def autotune_proc() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `python -m autotune ...` in a subprocess, through `main`, exactly as a user would."""
    env = {**os.environ, **_ENV}
    env.pop("FORCE_COLOR", None)

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=REPO, env=env, input=input,
                              capture_output=True, text=True, timeout=120)

    return run
