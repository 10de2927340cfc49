"""Writing output files atomically: all of them complete, or none of them touched.

Each file is first written in full to a temporary file beside its target and fsynced; only when every file of
the set is on disk are they moved into place with `os.replace` (atomic on POSIX), and the directory is fsynced.
On any error before the moves, the temporary files are removed and the directories this call created are removed
again, so a reader never sees a half-written file and a failed command leaves the output directory as it was.
(Only a failure between two `os.replace` calls, which rename within one directory, could leave some files
replaced; each of those is still complete.)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autotune.errors import SpecError


def _read_umask() -> int:
    """The process umask (reading it means setting it; it is put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_files(directory: Path, files: Sequence[tuple[str, str]], *, flag: str = "--out") -> list[Path]:
    """Write (relative name, text) pairs under `directory` (created if missing); return the paths written."""
    created = _make_dirs(directory, flag)
    staged: list[tuple[Path, Path]] = []
    try:
        for name, content in files:
            target = directory / name
            created += _make_dirs(target.parent, flag)
            if target.is_dir():
                raise SpecError(f"{flag} {directory}: {target} is a directory; remove it or choose another {flag}")
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
