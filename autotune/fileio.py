"""Writing output files atomically: all of them complete, or none of them touched.

Each file is first written in full to a temporary file beside its target and fsynced; only when every file of
the set is on disk are they moved into place with `os.replace` (atomic on POSIX), and the directory is fsynced.
On any error before the moves, the temporary files are removed and the directories this call created are removed
again, so a reader never sees a half-written file and a failed command leaves the output directory as it was.
(Only a failure between two `os.replace` calls, which rename within one directory, could leave some files
replaced; each of those is still complete.) A write is a `no_interrupt` section: Ctrl-C during it takes effect
when it is over (autotune/interrupts.py), so no exit path leaves a temporary file behind.

What is replaced must be a regular file: a target that exists as anything else (a device such as /dev/null, a
FIFO, a socket) is refused, as is a file name that would leave its directory. File names made from input (a
model or hardware name) go through `slug` first.

Reading is bounded the same way for every input file (model, hardware, plan, profile, runs CSV): `read_bounded`
reads at most the documented maximum of bytes from a regular file, `decode_text` turns bytes into text or says
"not UTF-8 text", and `parse_json` checks the nesting depth before json.loads (whose recursion would otherwise
end in RecursionError) and refuses NaN, Infinity and numbers beyond a float, which JSON does not have.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.interrupts import no_interrupt

_SLUG_LENGTH = 100


def _read_umask() -> int:
    """The process umask (reading it means setting it; it is put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def slug(text: str, *, fallback: str = "unnamed") -> str:
    """A file-name part made from any text (a model or hardware name, which may be a path): each run of
    characters other than ASCII letters, digits, `.`, `_`, `+` and `-` becomes one `-`, leading and trailing dots
    and dashes go, and at most 100 characters stay; so it never names a directory, a hidden file or a path."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip(".-")[:_SLUG_LENGTH].strip(".-") or fallback


# ------------------------------------------------------------------------------------------------- reading
def read_bounded(path: Path, where: str, max_bytes: int, *, fix: str, noun: str = "") -> bytes:
    """The bytes of `path`, a regular file of at most `max_bytes` (a FIFO or device could block or never end);
    every problem is one line starting with `where` (e.g. "model file x.json"), naming the `noun` read if given
    ("the runs file") and ending with `fix`."""
    cannot = f"cannot read {noun} " if noun else "cannot read "
    try:
        special = os.path.exists(path) and not os.path.isfile(path)
        if not special:
            with open(path, "rb") as handle:
                raw = handle.read(max_bytes + 1)
    except (OSError, ValueError) as exc:  # missing, unreadable, a name too long for the file system, a NUL byte
        raise SpecError(f"{where}: {cannot}({getattr(exc, 'strerror', None) or exc})") from None
    if special:
        raise SpecError(f"{where}: {cannot}(not a regular file); {fix}")
    if len(raw) > max_bytes:
        what = f"{noun} is " if noun else ""
        raise SpecError(f"{where}: {what}larger than the maximum of {max_bytes:,} bytes; {fix}")
    return raw


def decode_text(raw: bytes | str, where: str) -> str:
    """UTF-8 bytes as text, or one line saying they are not."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{where}: not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x}); save the file as "
                        "UTF-8") from None


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of a JSON text nest (brackets inside strings do not count)."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(itertools.accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


def parse_json(raw: bytes | str, where: str, *, max_depth: int,
               syntax: Callable[[json.JSONDecodeError], str] | None = None) -> Any:
    """JSON bytes or text to Python: encoding, nesting, syntax and out-of-range numbers are one-line errors
    (`syntax` words the syntax error, e.g. with the file's line first; default "<where>: invalid JSON at ...")."""
    text = decode_text(raw, where).removeprefix("\ufeff")  # a byte-order mark some editors write: not JSON's
    if not text.strip():  # json says "Expecting value at line 1 column 1", which does not say why
        raise SpecError(f"{where}: empty (no JSON in it); give the file its content, or another file")
    depth = json_depth(text)
    if depth > max_depth:
        raise SpecError(f"{where}: nested {depth} levels deep, more than the maximum of {max_depth}; give a flatter "
                        "document")

    def constant(name: str) -> float:
        raise SpecError(f"{where}: {name} is not a JSON number; write a finite number")

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise SpecError(f"{where}: the number {literal[:40]} is out of range; write a finite number")
        return value

    def whole(literal: str) -> int:
        if len(literal.lstrip("-")) > MAX_INT_DIGITS:  # Python's own limit would say less, later
            raise SpecError(f"{where}: the number {literal[:20]}... ({len(literal):,} digits) is larger than any "
                            "field takes; write the value meant")
        return int(literal)

    try:
        return json.loads(text, parse_constant=constant, parse_float=number, parse_int=whole)
    except json.JSONDecodeError as exc:
        if syntax is not None:
            raise SpecError(syntax(exc)) from None
        raise SpecError(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits
        detail = " ".join(str(exc).split()[:12])
        raise SpecError(f"{where}: unreadable JSON ({type(exc).__name__}: {detail})") from None


#: Digits of a JSON integer read at all, short of Python's own conversion limit (4300 digits); a shorter one too
#: large reaches its field's check, which names the field and its maximum (specs/limits.py)
MAX_INT_DIGITS = 4000


# ------------------------------------------------------------------------------------------------- writing
def check_target(path: Path, *, directory: bool, flag: str = "--out") -> None:
    """Refuse, before any work, an output path that exists as something a write may not replace: for a file
    anything but a regular file (or a directory, which `write_launch` writes into), for a directory anything
    but a directory; and one whose writes would be refused (the nearest existing folder not writable), which
    would otherwise surface after the search."""
    parent = path if directory and path.is_dir() else path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
        raise SpecError(f"{flag} {path}: {parent} is not writable (Permission denied); choose another {flag}")
    if not os.path.lexists(path):
        return
    if directory and not path.is_dir():
        raise SpecError(f"{flag} {path}: exists and is not a directory; give a directory")
    if not directory and not (path.is_file() or path.is_dir()):
        raise SpecError(f"{flag} {path}: exists and is not a regular file (a device, FIFO, socket or broken link); "
                        f"refusing to replace it: choose another {flag}")


def write_files(directory: Path, files: Sequence[tuple[str, str]], *, flag: str = "--out") -> list[Path]:
    """Write (relative name, text) pairs under `directory` (created if missing); return the paths written."""
    with no_interrupt():
        return _write_files(directory, files, flag)


def _write_files(directory: Path, files: Sequence[tuple[str, str]], flag: str) -> list[Path]:
    for name, _ in files:
        if Path(name).is_absolute() or ".." in Path(name).parts or not name:
            raise SpecError(f"{flag} {directory}: refusing to write {name!r}, which is not a path inside it")
    created = _make_dirs(directory, flag)
    staged: list[tuple[Path, Path]] = []
    try:
        for name, content in files:
            target = directory / name
            created += _make_dirs(target.parent, flag)
            if target.is_dir():
                raise SpecError(f"{flag}: {target} is a directory; remove it or choose another {flag}")
            check_target(target, directory=False, flag=flag)
            staged.append((_stage(target, content), target))
        for tmp, target in staged:
            os.replace(tmp, target)
        _fsync_dir(directory)
    except OSError as exc:
        _discard(staged, created)
        raise SpecError(f"{flag} {directory}: cannot write ({exc.strerror or exc}); nothing was written") from None
    except BaseException:
        _discard(staged, created)
        raise
    return [target for _, target in staged]


def write_file(path: Path, content: str, *, flag: str = "--out") -> Path:
    """Write one file atomically (its directory must exist)."""
    if not path.parent.is_dir():
        raise SpecError(f"{flag} {path}: directory {path.parent} does not exist")
    return write_files(path.parent, [(path.name, content)], flag=flag)[0]


def _make_dirs(directory: Path, flag: str) -> list[Path]:
    """Create `directory` and missing parents; return those created (innermost last)."""
    if directory.exists() and not directory.is_dir():
        raise SpecError(f"{flag} {directory}: exists and is not a directory; give a directory")
    missing = [p for p in [directory, *directory.parents] if not p.exists()][::-1]
    try:
        for path in missing:
            path.mkdir()
    except OSError as exc:
        _remove_dirs(missing)
        raise SpecError(f"{flag} {directory}: cannot create the directory ({exc.strerror})") from None
    return missing


def _stage(target: Path, content: str) -> Path:
    """The content, complete and fsynced, in a temporary file beside `target`."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_read_umask())  # mkstemp creates 0600; give the mode an ordinary file gets
        with os.fdopen(fd, "wb") as handle:
            handle.write(content.encode())
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(staged: list[tuple[Path, Path]], created: list[Path]) -> None:
    for tmp, _ in staged:
        tmp.unlink(missing_ok=True)
    _remove_dirs(created)


def _remove_dirs(created: list[Path]) -> None:
    for path in reversed(created):
        try:
            path.rmdir()
        except OSError:
            pass
