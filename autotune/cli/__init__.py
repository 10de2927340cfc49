"""The command line of docs/CLI.md: one module per command (plan, estimate, scale, emit, profile, calibrate,
check, and the catalogs), each a plain function over library calls, on the shared options of cli/options.py;
cli/app.py creates the typer app, registers the commands and owns `main`, the one place errors become output.

`autotune = "autotune.cli:main"` (pyproject.toml) and `from autotune.cli import app` resolve here.
"""

from autotune import interrupts

if interrupts.is_entry_point():  # first of all: Ctrl-C during the imports below gets the clean line too
    interrupts.install()

# Every import below follows the Ctrl-C handling on purpose. Importing `app` from cli/app.py rebinds the name
# `autotune.cli.app` to the typer app (the module stays in sys.modules as "autotune.cli.app").
from autotune.cli.app import app, main  # noqa: E402

__all__ = ["app", "main"]
