"""One quoting function per output language: whatever text an emitter writes goes through one of these, so that
no value, even one that got past the name check of specs/limits.py, can end a comment or a string early.

* `printable`: text with every non-printable character (newlines, NUL, other controls, Unicode line
  separators, lone surrogates) written as its Python escape (`\\n`, `\\x00`, `\\u2028`): one inert line.
* `comment`: lines as `#` comments (bash, Python, TOML), each made `printable` first.
* `bash_word`: one shell word (shlex quoting of the printable text).
* `python_str`: a Python string literal.
* `toml_str`: a TOML basic string.
* `json_text`: a JSON document (sorted keys, 2-space indent, strings made printable).
"""

from __future__ import annotations

import json
import shlex
from typing import Any


def printable(text: str) -> str:
    """`text` on one line, every non-printable character replaced by its escape (backslashes kept)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def comment(lines: list[str], marker: str = "#") -> str:
    """Lines as comments, newline-terminated; nothing in a line can end its comment."""
    return "".join(f"{marker} {printable(line)}\n" for line in lines)


def bash_word(text: str) -> str:
    """One bash word that expands to (the printable form of) `text` and nothing else."""
    return shlex.quote(printable(text))


def python_str(text: str) -> str:
    """A Python string literal for `text`."""
    return repr(text)


def toml_str(text: str) -> str:
    """A TOML basic string for the printable form of `text` (JSON's escapes of quotes and backslashes are
    TOML's; non-ASCII characters stay literal, since TOML's \\u escapes cannot write surrogate pairs)."""
    return json.dumps(printable(text), ensure_ascii=False)


def json_text(doc: Any) -> str:
    """A JSON document: sorted keys, 2-space indent, trailing newline, every string printable."""
    return json.dumps(_printable_strings(doc), sort_keys=True, indent=2) + "\n"


def _printable_strings(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(k) if isinstance(k, str) else k: _printable_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable_strings(v) for v in value]
    return value
