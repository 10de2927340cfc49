"""Studies and reports beside the core: speed benchmarks, accuracy against published runs, paper reproductions
(vocabulary placement, tensor-parallel modes) and the calibration fit behind `autotune calibrate`.

They sit above search in the layers (they call the planner and the cost model) and below render/CLI.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


def run_main(main: Callable[[], int | None]) -> int:
    """A report's `python -m` entry: its exit status, and a quiet exit when stdout is a pipe its reader closed
    (`... | head`), as the autotune command itself does."""
    try:
        code = main() or 0
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush must not fail
        return 0
    return code
