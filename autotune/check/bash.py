"""Just enough bash to read a launch script: the arguments a script passes to the program it launches.

Launch scripts build their arguments with variables (`NNODES="${NNODES:-2}"`), arrays (`ARGS=( ... )`,
`ARGS+=(...)`, `"${ARGS[@]}"`), line continuations, comments and simple `if` guards. `launch_words` runs those
statements in order, with an empty environment (so every `${VAR:-default}` takes its default: the config as
written), and returns the words that follow the launched program, e.g. `pretrain_gpt.py`. Nothing is executed:
command substitutions `$(...)` expand to "" and any other command is skipped. Conditions it cannot evaluate are
taken as false and reported in the notes, so a misread is visible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from autotune.errors import SpecError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.S)
_OPS = ("&&", "||", ";;", ";", "&", "|", "(", ")", "\n")
_DECLARE = ("export", "local", "readonly", "declare", "typeset")


# ------------------------------------------------------------------------------------------------ tokens
@dataclass(frozen=True, slots=True)
class Word:
    """One shell word before expansion: (kind, text) parts, kind 'lit' (single-quoted or escaped), 'dq' (inside
    double quotes: expanded, not split) or 'uq' (unquoted: expanded and split on blanks)."""

    parts: tuple[tuple[str, str], ...]

    @property
    def raw(self) -> str:
        return "".join(text for _, text in self.parts)

    @property
    def quoted(self) -> bool:
        return any(kind != "uq" for kind, _ in self.parts)


def _skip_subst(text: str, i: int) -> int:
    """Index just past the `$(...)`, `$((...))` or `${...}` starting at text[i] == '$' (nesting and quotes kept)."""
    close = {"(": ")", "{": "}"}[text[i + 1]]
    depth, j, quote = 0, i + 1, ""
    while j < len(text):
        c = text[j]
        if quote:
            if c == "\\" and quote == '"':
                j += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "\\":
            j += 1
        elif c == text[i + 1]:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise SpecError(f"unbalanced {text[i:i + 2]} in the script: close it with {close}")


def tokenize(text: str) -> list[Word | str]:
    """Words and operators (newline included); comments and line continuations removed."""
    out: list[Word | str] = []
    parts: list[tuple[str, str]] = []
    started, i, n = False, 0, len(text)

    def flush() -> None:
        nonlocal parts, started
        if started:
            out.append(Word(tuple(parts)))
        parts, started = [], False

    def add(kind: str, s: str) -> None:
        nonlocal started
        started = True
        if parts and parts[-1][0] == kind:
            parts[-1] = (kind, parts[-1][1] + s)
        else:
            parts.append((kind, s))

    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            if text[i + 1] != "\n":  # backslash-newline is a line continuation
                add("lit", text[i + 1])
            i += 2
        elif c == "#" and not started:
            while i < n and text[i] != "\n":
                i += 1
        elif c in " \t\r":
            flush()
            i += 1
        elif c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise SpecError("unterminated ' quote in the script")
            add("lit", text[i + 1:j])
            started, i = True, j + 1
        elif c == '"':
            j, buf = i + 1, ""
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n and text[j + 1] in '$`"\\\n':
                    buf += "" if text[j + 1] == "\n" else "\\" + text[j + 1]
                    j += 2
                elif text[j] == "$" and j + 1 < n and text[j + 1] in "({":
                    k = _skip_subst(text, j)
                    buf, j = buf + text[j:k], k
                else:
                    buf, j = buf + text[j], j + 1
            if j >= n:
                raise SpecError('unterminated " quote in the script')
            add("dq", buf)
            started, i = True, j + 1
        elif c == "$" and i + 1 < n and text[i + 1] in "({":
            k = _skip_subst(text, i)
            add("uq", text[i:k])
            i = k
        elif c == "=" and text[i + 1:i + 2] == "(" and started:  # NAME=( starts an array
            add("uq", "=")
            flush()
            out.append("(")
            i += 2
        else:
            op = next((o for o in _OPS if text.startswith(o, i)), None)
            if op is not None:
                flush()
                out.append(op)
                i += len(op)
            else:
                add("uq", c)
                i += 1
    flush()
    return out


# ------------------------------------------------------------------------------------------------ expansion
@dataclass
class Shell:
    """Variables and arrays of the script as it runs; `notes` collects what could not be followed."""

    scalars: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    launcher: list[str] = field(default_factory=list)
    """The words before the launched program (script.launch_words): torchrun's or deepspeed's, with their flags."""

    def value(self, name: str) -> str | None:
        if name in self.arrays:
            return self.arrays[name][0] if self.arrays[name] else ""
        return self.scalars.get(name)

    def expand_text(self, s: str) -> list[str]:
        """Expand $-forms in s; the result is a list of fields (several only for "${ARR[@]}")."""
        fields, i = [""], 0
        while i < len(s):
            c = s[i]
            if c == "\\" and i + 1 < len(s):
                fields[-1] += s[i + 1]
                i += 2
            elif c == "$" and i + 1 < len(s):
                nxt = s[i + 1]
                if nxt in "({":
                    k = _skip_subst(s, i)
                    got = self._brace(s[i + 2:k - 1]) if nxt == "{" else self._paren(s[i + 1:k])
                    i = k
                elif nxt in "@*":
                    got, i = [], i + 2  # the script's own arguments: none
                elif nxt.isdigit() or nxt in "#?$!-":
                    got, i = [""], i + 2
                elif _NAME.match(s, i + 1):
                    m = _NAME.match(s, i + 1)
                    assert m is not None
                    got, i = [self.value(m.group()) or ""], m.end()
                else:
                    got, i = ["$"], i + 1
                if not got and s in ("$@", "$*") or (not got and re.fullmatch(r"\$\{[^}]*\[[@*]\]\}", s)):
                    return []  # "${EMPTY[@]}" and "$@" alone vanish
                fields[-1] += got[0] if got else ""
                fields += got[1:]
            else:
                fields[-1] += c
                i += 1
        return fields

    def _brace(self, body: str) -> list[str]:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]", body)
        if m:
            items = self.arrays.get(m.group(1), [] if m.group(1) not in self.scalars else [self.scalars[m.group(1)]])
            return list(items) if m.group(2) == "@" else [" ".join(items)]
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?", body)
        if m:
            return [str(len(self.arrays.get(m.group(1), [])) if m.group(2) else len(self.value(m.group(1)) or ""))]
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?(?:(:?)([-=?+])(.*))?", body, re.S)
        if not m:
            self.notes.append(f"${{{body}}}: not an expansion autotune follows; read as empty")
            return [""]
        name, index, colon, op, word = m.groups()
        value = self.value(name) if index is None else (self.arrays.get(name, [])[int(index):int(index) + 1] or
                                                        [None])[0]
        unset = value is None or (colon == ":" and value == "")
        if op is None:
            return [value or ""]
        if op == "+":
            return ["" if unset else self._word(word)]
        if not unset:
            return [value or ""]
        default = self._word(word)
        if op == "=":
            self.scalars[name] = default
        elif op == "?":
            self.notes.append(f"${name} is required and has no default; read as empty")
            return [""]
        return [default]

    def _word(self, word: str) -> str:
        """The word of ${name:-word} after bash's expansion and quote removal (`${X:-"v"}` is v): a '...' part
        literal, a "..." or bare part expanded, a ${...} or $(...) inside either taken whole (it may hold quotes
        of its own). Not kept: which parts were quoted, so an unquoted ${X:-"a b"} splits where bash would not."""
        out, text, i = [], "", 0
        quote = ""
        while i < len(word):
            c = word[i]
            if c == "$" and i + 1 < len(word) and word[i + 1] in "({":
                k = _skip_subst(word, i)
                text, i = text + word[i:k], k
            elif c == "\\" and i + 1 < len(word) and quote != "'":
                text, i = text + word[i:i + 2], i + 2
            elif c == "'" and quote != '"':
                k = word.find("'", i + 1)
                if k < 0:
                    raise SpecError(f"unbalanced ' in ${{...:-{word}}}: close it")
                out.append(" ".join(self.expand_text(text)) + word[i + 1:k])
                text, i = "", k + 1
            elif c == '"':
                out.append(" ".join(self.expand_text(text)))
                text, quote, i = "", "" if quote else '"', i + 1
            else:
                text, i = text + c, i + 1
        return "".join(out) + " ".join(self.expand_text(text))

    def _paren(self, text: str) -> list[str]:
        if text.startswith("((") and text.endswith("))"):
            value = self.arith(text[2:-2])
            return [str(value) if value is not None else ""]
        return [""]  # command substitution: nothing is run

    def arith(self, expr: str) -> int | None:
        """An integer expression over variables, numbers and + - * / % comparisons; None if it is anything else."""
        names = {m.group() for m in _NAME.finditer(expr)}
        if not re.fullmatch(r"[\sA-Za-z0-9_+\-*/%()<>=!&|$]*", expr) or any(op in expr for op in ("**", "<<", ">>")):
            return None  # powers and shifts could build numbers of any size: not followed
        py = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
        py = py.replace("&&", " and ").replace("||", " or ").replace("/", "//")
        py = re.sub(r"!(?!=)", " not ", py)
        env = {}
        for name in names:
            raw = self.value(name)  # unset (the scheduler's variables, say): unknown here, not bash's 0
            if raw is None or not re.fullmatch(r"-?\d+", raw.strip()):
                return None
            env[name] = int(raw)
        try:
            return int(eval(py, {"__builtins__": {}}, env))  # noqa: S307 (only names, digits, operators)
        except Exception:  # noqa: BLE001 (any failure: not an expression we follow)
            return None

    def expand(self, word: Word, split: bool = True) -> list[str]:
        """A word's fields: quoted parts are not split, unquoted ones are split on blanks (not in an assignment,
        split False, where bash splits nothing: X=$Y keeps Y's blanks)."""
        out: list[str] = []
        cur: str | None = None
        for kind, text in word.parts:
            if kind == "lit":
                pieces = [text]
            else:
                pieces = self.expand_text(text)
                if kind == "uq" and split:
                    pieces = [w for p in pieces for w in p.split()]
            for k, piece in enumerate(pieces):
                if k == 0 and cur is not None:
                    cur += piece
                else:
                    if cur is not None:
                        out.append(cur)
                    cur = piece
        if cur is not None and (cur != "" or word.quoted):
            out.append(cur)
        return out
