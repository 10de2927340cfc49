"""One exception family. The CLI turns each into a one-line message and an exit code."""

from __future__ import annotations


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose. Its message is what the user sees."""

    exit_code = 1


class SpecError(AutotuneError):
    """A user input (model, hardware, job, plan, profile file) is malformed or inconsistent."""


class InvalidPlanError(SpecError):
    """A parallel plan breaks a rule (degrees, divisibility, partition)."""


class InfeasibleError(AutotuneError):
    """No plan in the search space fits in memory."""

    exit_code = 2


class SolverLimitError(AutotuneError):
    """The solver hit its time limit before proving optimality; carries the best plan so far."""

    exit_code = 3

    def __init__(self, message: str, result: object = None) -> None:
        super().__init__(message)
        self.result = result
