"""autotune: find the fastest parallel plan for training a Transformer on a GPU cluster."""

__version__ = "0.1.0"

# The first autotune code the `autotune` command runs (the console script imports autotune.cli, which imports
# this package first): Ctrl-C gets the clean line from here on (autotune/interrupts.py). What is left before it is
# the interpreter's own start-up, which no package can reach.
from autotune import interrupts as _interrupts  # noqa: E402

if _interrupts.is_entry_point():
    _interrupts.install()
