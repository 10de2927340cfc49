"""Ctrl-C, the same for every command: one `error: interrupted` line on stderr, no temporary file left, exit 130.

Why not a `signal.signal` handler or KeyboardInterrupt: OR-Tools' CP-SAT installs its own SIGINT handler for
the length of each solve and sets SIG_DFL when the solve ends (so the next Ctrl-C kills the process without a
word), and a Python handler runs only between bytecodes, never inside a long solve; an interrupt during the
start-up imports, or between creating a temporary file and registering it for removal, gives a traceback or
a left-over file. So `install` blocks SIGINT in the main thread before anything else starts a thread (every
later thread, the solver's included, inherits the mask) and a daemon thread takes the signal with sigwait:
no handler anyone installs is ever called, and the answer comes at once, even in the middle of a solve.

That thread then takes the write lock (`no_interrupt`, held by autotune.fileio from the first temporary file
to the last rename, so a write in progress completes, all of it, and no temporary file survives), stops the
processes this one started and theirs (SIGTERM: they inherited the blocked SIGINT), removes the temporary
directories still open (as the interpreter's exit would), shows the terminal cursor a progress display may
have hidden, prints the line and ends the process with status 130.

The command ends through `finish`, which checks for a Ctrl-C that came before and then ends the process at once
(the interpreter's teardown, during which a blocked Ctrl-C would be lost, is skipped). Only the autotune command
installs this (the console script or `python -m autotune`); a program that imports autotune keeps its own
Ctrl-C.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable

EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
MESSAGE = "error: interrupted"

_write_lock = threading.RLock()
_interrupted = threading.Event()
_installed = False


class no_interrupt:  # noqa: N801  (used as a function: `with no_interrupt():`)
    """A section an interrupt waits for (file writes): Ctrl-C during it takes effect when it ends, before the
    command goes on. (A class rather than contextlib: this module is imported before anything else.)"""

    def __enter__(self) -> None:
        _write_lock.acquire()

    def __exit__(self, *exc: object) -> None:
        _write_lock.release()
        if _interrupted.is_set():
            _exit_interrupted()


def is_entry_point() -> bool:
    """Whether this process is the autotune command itself (console script or `python -m autotune`)."""
    argv0 = sys.argv[0] if sys.argv else ""
    return os.path.basename(argv0) == "autotune" or argv0.endswith(os.path.join("autotune", "__main__.py"))


def install() -> None:
    """Take over SIGINT for this process (idempotent; only from the main thread, and only where sigwait
    exists, i.e. POSIX: elsewhere Python's KeyboardInterrupt remains, which the CLI's main also handles)."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "sigwait"):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    threading.Thread(target=_wait_for_sigint, name="autotune-sigint", daemon=True).start()
    atexit.register(_at_exit)
    _installed = True


def finish(code: object) -> None:
    """End the command with exit status `code` (SystemExit's: None, an int or a message) once its output is
    flushed; a Ctrl-C that came before wins (130). The process ends here, without the interpreter's slow
    teardown, during which a blocked Ctrl-C would be lost."""
    if not _installed:
        raise SystemExit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said there
            pass
    with _write_lock:
        if _interrupted.is_set() or signal.SIGINT in signal.sigpending():
            _exit_interrupted()
        os._exit(code or 0)


def _wait_for_sigint() -> None:
    signal.sigwait({signal.SIGINT})
    _interrupted.set()
    _exit_interrupted()


def _at_exit() -> None:
    """A Ctrl-C that came as the command was ending still ends it with the line and 130 (the waiting thread,
    a daemon, may not get to run again once the interpreter shuts down)."""
    if _interrupted.is_set() or signal.SIGINT in signal.sigpending():
        _exit_interrupted()


def _exit_interrupted() -> None:
    """Whoever gets here first (the waiting thread, the end of a write, the exit hook) ends the process."""
    with _write_lock:  # a write in progress finishes first; none starts after this
        err = _silence_stderr()
        _stop_children()
        _remove_temporary_directories()
        _write_line(err)
        os._exit(EXIT_CODE)


def _silence_stderr() -> int:
    """A descriptor for the line, with stderr itself pointed at the null device: the main thread runs on while
    this one cleans up, and whatever it prints from now on (a traceback from a file the cleanup removed under
    it) must not follow the one line."""
    try:
        saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        return saved
    except OSError:
        return 2


def _remove_temporary_directories() -> None:
    """Run the finalizers the interpreter runs at exit, which remove every tempfile.TemporaryDirectory still
    open (e.g. the one `profile --comm` hands to torchrun): os._exit would skip them."""
    try:
        weakref.finalize._exitfunc()  # type: ignore[attr-defined]  # what atexit calls at a normal exit
    except Exception:  # noqa: BLE001  (best effort: the line and the exit status come first)
        pass


def _write_line(err: int = 2) -> None:
    """The one line on stderr (`err`: its descriptor; red on a terminal, with the cursor a progress display hid
    shown again)."""
    tty = _isatty(err)
    line = f"{MESSAGE}\n"
    if tty:  # clear the progress line, show the cursor again, and red as the CLI's other errors
        line = "\r\x1b[K\x1b[?25h" + (line if "NO_COLOR" in os.environ else f"\x1b[31m{MESSAGE}\x1b[0m\n")
    try:
        if _isatty(1) and not tty:
            os.write(1, b"\x1b[?25h")
        os.write(err, line.encode())
    except OSError:
        pass


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _stop_children() -> None:
    """SIGTERM to every process this one started, and theirs (Linux /proc; elsewhere nothing): they inherited
    SIGINT blocked, and a launcher such as torchrun starts its workers in sessions of their own."""
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass


def _descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])  # field 4, after "pid (comm) state"
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


class deadline:  # noqa: N801  (used as a function: `with deadline(seconds, error):`)
    """Bound a pure-Python section (estimate's pipeline simulation, calibrate's fit) by wall-clock seconds: when
    they pass, `error()` is raised wherever the main thread is (SIGALRM), and the CLI prints it as one line.
    The search has its own deadline, which CP-SAT honours inside a solve (search/partition.py); a section run
    outside the main thread, or where setitimer does not exist, is not bounded."""

    def __init__(self, seconds: float, error: Callable[[], BaseException]) -> None:
        self.seconds, self.error, self.old, self.expired, self.armed = seconds, error, None, False, False

    def _expire(self, signum: int, frame: object) -> None:
        # an exception raised inside a gc callback or a __del__ is swallowed: re-arm, so the next tick raises again
        self.expired = True
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        raise self.error()

    def __enter__(self) -> None:
        armed = (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
                 and math.isfinite(self.seconds))
        if armed:
            self.old, self.armed = signal.signal(signal.SIGALRM, self._expire), True
            signal.setitimer(signal.ITIMER_REAL, max(self.seconds, 1e-3))

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self.armed:  # (the old handler is None where it was not set from Python: a pytest-xdist worker's)
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL if self.old is None else self.old)
            self.old, self.armed = None, False
        if self.expired and exc_type is None:  # the section finished although its time was up
            raise self.error()
