"""The typer app: the global options, the commands registered in the order `--help` lists them, and `main`.

`main` is the one place errors become output: every AutotuneError is one red line on stderr and its exit
code. Usage errors (bad option values, unknown options) exit 1 rather than click's 2, because CLI.md gives
2 to "no feasible plan". Each command is a plain function in its own module (autotune/cli/<command>.py)
that never imports this one; formatting lives in autotune/render/.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from autotune import __version__, interrupts
from autotune.cli import calibrate, catalogs, check, emit, estimate, plan, profile, scale
from autotune.cli.options import fail
from autotune.errors import AutotuneError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the fastest parallel plan for training a Transformer on a GPU cluster.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"autotune {__version__}")
        raise typer.Exit(0)


@app.callback()
def _global_options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                          help="Print the version and exit.")] = False) -> None:
    """Find the fastest parallel plan for training a Transformer on a GPU cluster."""


# typer >= 0.20 vendors click, older versions use click itself; both export BadParameter, whose base
# ClickException covers every usage error.
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

# `--help` lists the commands in this order.
app.command()(catalogs.models)
app.command()(catalogs.hardware)
app.command()(estimate.estimate)
app.command()(plan.plan)
app.command("emit")(emit.emit_command)
app.command("scale")(scale.scale_command)
app.command()(calibrate.calibrate)
app.command("profile")(profile.profile_command)
app.command("check")(check.check_command)


# ------------------------------------------------------------------------------------------------ entry point
def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry: run the app, turning every expected failure into `error: ...` and an exit code.
    Ctrl-C is `error: interrupted`, exit 130 (autotune/interrupts.py, for the command itself; a KeyboardInterrupt
    where that is not installed, e.g. main(argv) called in-process)."""
    if argv is not None:
        _run(argv)
    interrupts.install()
    try:
        _run(None)
    except SystemExit as exc:
        interrupts.finish(exc.code)


def _stdout_target() -> tuple[int, int] | None:
    """What file descriptor 1 is open on (device, inode), or None."""
    try:
        st = os.fstat(1)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _devnull() -> tuple[int, int]:
    st = os.stat(os.devnull)
    return st.st_dev, st.st_ino


_COMMANDS: list[Any] = []


def _command() -> Any:
    """The click command typer builds from `app`, built once per process (it costs about 50 ms, which in-process
    callers such as the fuzz test would pay on every call); every command is registered by then."""
    if not _COMMANDS:
        _COMMANDS.append(typer.main.get_command(app))
    return _COMMANDS[0]


def _run(argv: Sequence[str] | None) -> None:
    stdout, target = sys.stdout, _stdout_target()
    try:
        code = _command().main(args=None if argv is None else list(argv), prog_name="autotune",
                               standalone_mode=False)
    except SystemExit:
        # the reader closed the pipe (`| head`): click's handler swaps sys.stdout, rich's (every console, typer's
        # help too) points descriptor 1 at /dev/null; it read what it wanted, so exit 0 (was a silent 1, or 0
        # when the output fit the pipe)
        now = _stdout_target()
        if sys.stdout is not stdout or (now != target and now == _devnull()):
            raise SystemExit(0) from None
        raise
    except AutotuneError as exc:
        fail(str(exc), exc.exit_code)
    except _CLICK_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `autotune`: the help is the message
            typer.echo(exc.format_message())
            raise SystemExit(0) from None
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        fail(exc.format_message() + hint, 1)
    except KeyboardInterrupt:
        fail("interrupted", interrupts.EXIT_CODE)
    except typer.Abort as exc:  # click turns a KeyboardInterrupt into Abort
        if isinstance(exc.__cause__, KeyboardInterrupt):
            fail("interrupted", interrupts.EXIT_CODE)
        fail("aborted", 1)
    raise SystemExit(code if isinstance(code, int) else 0)
