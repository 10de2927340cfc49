"""What a search may spend: the deterministic work budget that decides when an unfinished search stops, and
the wall-clock safety net (--time-limit) that only says the machine stopped it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


#: The least CP-SAT deterministic time one solve is allowed (a unit is of the order of a second of CP-SAT on one
#: core; budgets of conflicts stop most solves far earlier). A solve may spend a sixth of the search's work,
#: so that one hard candidate cannot take it all, and never less than this.
SOLVE_WORK = 5.0


@dataclass(slots=True)
class Budget:
    """What a search may still spend. `work`, in CP-SAT deterministic time, is the only limit that decides
    what a search returns, so the answer is the same on every machine and under any load; `deadline` (a
    time.perf_counter() value, from --time-limit) is the safety net: once it passes, the search stops at the
    next check and `timed_out` says that the answer depends on the machine."""

    work: float = math.inf
    deadline: float = math.inf
    timed_out: bool = False
    stopped: bool = False
    """Some work was left undone for lack of budget (or time)."""
    spent: float = 0.0
    """Deterministic time used so far."""
    per_solve: float = SOLVE_WORK
    """The most one CP-SAT solve may spend."""

    @classmethod
    def from_limits(cls, work: float, time_limit_s: float = math.inf) -> Budget:
        return cls(work=work, deadline=time.perf_counter() + time_limit_s, per_solve=max(SOLVE_WORK, work / 6))

    def clock_struck(self) -> bool:
        """Whether the wall-clock safety net has struck (checked now)."""
        if not self.timed_out and time.perf_counter() >= self.deadline:
            self.timed_out = True
        return self.timed_out

    @property
    def exhausted(self) -> bool:
        """Whether the work is spent or the clock has struck. Asked only before doing more work, so True also
        marks work left undone (`stopped`)."""
        if self.work <= 0 or self.clock_struck():
            self.stopped = True
        return self.stopped

    def spend(self, work: float) -> None:
        """Count a solve's deterministic time, rounded to a nanosecond: CP-SAT reports the same work of the
        same solve with a last-bit difference now and then, which must not reach the answer."""
        self.spent = round(self.spent + work, 9)
        self.work = round(self.work - work, 9)
