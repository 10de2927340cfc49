"""Run a launch script's statements (check/bash.py's tokens) far enough to find the arguments it launches with.

Followed: assignments (`export`/`local`/... too), arrays and `+=`, `if`/`elif`/`else`/`fi` on `[[ ]]`, `[ ]`,
`test` and `(( ))` conditions, `exit` in a taken branch. Skipped, with a note: loops and functions. Every
other command is only looked at: the first whose words hold the launched program gives the result.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from autotune.check.bash import _ASSIGN, _DECLARE, Shell, Word, tokenize
from autotune.errors import SpecError

_SEPARATORS = (";", "\n", "&&", "||", "&", "|", ";;")


@dataclass(frozen=True, slots=True)
class Command:
    """One simple command: words, `NAME=( ... )` array literals (name, append, words) and `(( ))` text."""

    words: tuple[Word, ...] = ()
    arrays: tuple[tuple[str, bool, tuple[Word, ...]], ...] = ()
    arith: str | None = None


def commands(tokens: list[Word | str]) -> list[Command]:
    """Split tokens into simple commands (arrays may span lines; `(( ... ))` becomes one arithmetic command)."""
    out: list[Command] = []
    words: list[Word] = []
    arrays: list[tuple[str, bool, tuple[Word, ...]]] = []
    i = 0

    def flush() -> None:
        nonlocal words, arrays
        if words or arrays:
            out.append(Command(tuple(words), tuple(arrays)))
        words, arrays = [], []

    while i < len(tokens):
        t = tokens[i]
        if isinstance(t, Word):
            m = _ASSIGN.fullmatch(t.raw)
            if m and m.group(3) == "" and i + 1 < len(tokens) and tokens[i + 1] == "(":
                j, items = i + 2, []
                while j < len(tokens) and tokens[j] != ")":
                    if isinstance(tokens[j], Word):
                        items.append(tokens[j])
                    j += 1
                arrays.append((m.group(1), m.group(2) == "+", tuple(items)))  # type: ignore[arg-type]
                i = j + 1
                continue
            words.append(t)
        elif t == "(" and i + 1 < len(tokens) and tokens[i + 1] == "(" and not arrays:
            j, text = i + 2, []
            while j + 1 < len(tokens) and not (tokens[j] == ")" and tokens[j + 1] == ")"):
                text.append(tokens[j].raw if isinstance(tokens[j], Word) else str(tokens[j]))
                j += 1
            lead = tuple(words)
            words = []
            out.append(Command(lead, (), " ".join(text)))
            i = j + 2
            continue
        elif t in _SEPARATORS:
            flush()
        i += 1
    flush()
    return out


def _test(shell: Shell, args: list[str]) -> bool | None:
    """`[[ ... ]]` / `[ ... ]` / `test ...` with one comparison or one -n/-z; None when it is anything else."""
    if args and args[0] == "!":
        inner = _test(shell, args[1:])
        return None if inner is None else not inner
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2 and args[0] in ("-n", "-z"):
        return (args[1] != "") == (args[0] == "-n")
    if len(args) == 3:
        a, op, b = args
        if op in ("=", "=="):
            return a == b
        if op == "!=":
            return a != b
        ints = {"-eq": "==", "-ne": "!=", "-lt": "<", "-le": "<=", "-gt": ">", "-ge": ">="}
        if op in ints and re.fullmatch(r"-?\d+", a) and re.fullmatch(r"-?\d+", b):
            return bool(eval(f"{int(a)} {ints[op]} {int(b)}", {"__builtins__": {}}))  # noqa: S307 (two ints)
    return None


def _condition(shell: Shell, cmd: Command) -> bool | None:
    if cmd.arith is not None:
        value = shell.arith(cmd.arith)
        return None if value is None else value != 0
    words = [w for word in cmd.words[1:] for w in shell.expand(word)]
    if words[:1] == ["[["] and words[-1:] == ["]]"] or words[:1] == ["["] and words[-1:] == ["]"]:
        return _test(shell, words[1:-1])
    if words[:1] == ["test"]:
        return _test(shell, words[1:])
    return None


def _assign(shell: Shell, cmd: Command) -> list[Word]:
    """Apply the command's assignments; return the words left (the command itself, if any)."""
    for name, append, items in cmd.arrays:
        values = [v for w in items for v in shell.expand(w)]
        shell.arrays[name] = (shell.arrays.get(name, []) if append else []) + values
        shell.scalars.pop(name, None)
    words = list(cmd.words)
    declare = bool(words) and words[0].raw in _DECLARE
    if declare:
        words = [w for w in words[1:] if not w.raw.startswith("-")]
    while words:
        m = _ASSIGN.fullmatch(words[0].raw)
        if not m:
            break
        value = Word(((words[0].parts[0][0], words[0].parts[0][1][len(m.group(1)) + len(m.group(2)) + 1:]),
                      *words[0].parts[1:]))
        text = " ".join(shell.expand(value, split=False)) if value.parts[0][1] or len(value.parts) > 1 else ""
        shell.scalars[m.group(1)] = (shell.scalars.get(m.group(1), "") if m.group(2) else "") + text
        words = words[1:]
    return [] if declare else words


def launch_words(text: str, is_program: Callable[[str], bool], what: str,
                 shell: Shell | None = None) -> tuple[list[str], list[str]]:
    """The words after the first launched word for which `is_program` holds, and the notes; a SpecError naming
    `what` when the script never launches it. A launch inside `bash -c "..."` (as Slurm scripts write it) is
    followed into that string, with the variables set so far."""
    shell = shell if shell is not None else Shell()
    stack: list[tuple[bool, bool]] = []  # (active, a branch was taken) per open if/loop/function
    skipped = False  # a launch seen in a block not followed (a function's body, a loop, a case)
    for cmd in commands(tokenize(text)):
        active = all(a for a, _ in stack)
        head = cmd.words[0].raw if cmd.words else ""
        if head in ("then", "do"):
            cmd = Command(cmd.words[1:], cmd.arrays, cmd.arith)
            head = cmd.words[0].raw if cmd.words else ""
        if head in ("if", "elif"):
            cond = _condition(shell, cmd) if active or head == "elif" else False
            if cond is None:
                shell.notes.append(f"an `{head}` condition autotune cannot evaluate was taken as false")
                cond = False
            if head == "if":
                stack.append((cond, cond))
            elif stack:
                _, taken = stack[-1]
                stack[-1] = (cond and not taken, taken or cond)
            continue
        if head == "else" and stack:
            _, taken = stack[-1]
            stack[-1] = (not taken, True)
            rest = Command(cmd.words[1:], cmd.arrays)
            if not rest.words and not rest.arrays:
                continue
            cmd, head, active = rest, rest.words[0].raw if rest.words else "", all(a for a, _ in stack)
        if head in ("fi", "done", "esac", "}"):
            if stack:
                stack.pop()
            continue
        if head in ("for", "while", "until", "case", "function") or text_is_func(cmd):
            if active:
                shell.notes.append(f"the shell function `{head}` is not followed (its body is skipped)"
                                   if text_is_func(cmd) else f"a `{head}` block is not followed (its body is skipped)")
            skipped = skipped or any(is_program(word.raw.strip("'\"")) for word in cmd.words)  # `f() { cmd; }`
            stack.append((False, False))
            continue
        if not active:
            skipped = skipped or any(is_program(word.raw.strip("'\"")) for word in cmd.words)
            continue
        if head == ":":  # the no-op builtin: `: "${TP:=8}"` sets defaults; `: "${DATA_PATH:?set it}"` guards a path
            seen = len(shell.notes)
            for word in cmd.words[1:]:
                shell.expand(word)
            # a guard's "required" is nothing the plan depends on; other notes (a $(...) not run) stay
            shell.notes[seen:] = [n for n in shell.notes[seen:] if "is required and has no default" not in n]
            continue
        words = _assign(shell, cmd)
        if not words:
            continue
        expanded = [w for word in words for w in shell.expand(word)]
        if expanded[:1] == ["exit"]:
            raise SpecError(f"the script exits before it launches {what} (an `exit` autotune's reading reaches; "
                            "check the variables it tests)")
        for k, word in enumerate(expanded):
            if is_program(word):
                shell.launcher = expanded[:k]
                return expanded[k + 1:], shell.notes
            if k > 0 and expanded[k - 1] == "-c" and what in word:  # bash -c "... pretrain_gpt.py ..."
                return launch_words(word, is_program, what, shell)
    if skipped:
        raise SpecError(f"the script launches {what} only inside a shell function, loop, `case` or untaken branch, "
                        "which autotune does not follow; write the launch at the script's top level, or give a file "
                        "of its arguments")
    raise SpecError(f"no {what} call found in the script; give the launch script that runs {what}, or a file of "
                    f"its arguments")


def text_is_func(cmd: Command) -> bool:
    """`name() {` (its body on the lines after, or after the brace on the same line): the splitter drops the `(`
    `)` and leaves the name and `{` first."""
    return len(cmd.words) >= 2 and cmd.words[1].raw == "{"


#: Launcher flags that size the job: torchrun's (and torch.distributed.run/launch's) and deepspeed's ->
#: 0 for GPUs per node, 1 for nodes
_LAUNCH_FLAGS = {"--nproc_per_node": 0, "--nproc-per-node": 0, "--num_gpus": 0, "--num-gpus": 0, "--nnodes": 1,
                 "--num_nodes": 1, "--num-nodes": 1}


def launcher_world(words: list[str]) -> tuple[int | None, int | None]:
    """(GPUs per node, nodes) a launcher's words start, each None where not a plain count (absent, "gpu",
    an elastic "2:4")."""
    out: list[int | None] = [None, None]
    i = 0
    while i < len(words):
        flag, eq, inline = words[i].partition("=")
        if flag in _LAUNCH_FLAGS:
            nxt = words[i + 1] if i + 1 < len(words) else ""
            value = inline if eq else ("" if nxt.startswith("-") else nxt)  # an unset $NNODES expands to nothing
            if value.isdigit() and int(value) > 0:
                out[_LAUNCH_FLAGS[flag]] = int(value)
            i += 1 if eq or nxt.startswith("-") else 2
            continue
        i += 1
    return out[0], out[1]
