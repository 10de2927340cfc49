"""The house rules of ../shared/STYLE.md and issue 16, checked on the source: imports only point down the
layers, no module is over 400 lines, only render/ and cli/ import rich or typer, and no command module imports
the typer app back (cli/app.py registers the commands, never the other way round).

The layers, lowest first (a module may import its own layer and any below it):
  0 base      units, errors, interrupts, fileio (and the package itself: autotune/__init__.py)
  1 specs     what the user gives: model, hardware, job, plan, profile file
  2 model     catalog.py (named specs from files), costmodel/ (pure functions), emit/ (launch configs from specs)
  3 search    the planner, its validator and the sweep
  4 uses      check/ (reading launch configs), reports/ (studies), profiling/ (measuring with torch)
  5 render    what the CLI shows
  6 cli       the typer commands, and `python -m autotune`
Imports are read with `ast` (every import statement, also those inside functions), never by importing.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"
MAX_LINES = 400

LAYERS = {
    "autotune": 0, "units": 0, "errors": 0, "interrupts": 0, "fileio": 0,
    "specs": 1,
    "catalog": 2, "costmodel": 2, "emit": 2,
    "search": 3,
    "check": 4, "reports": 4, "profiling": 4,
    "render": 5,
    "cli": 6, "__main__": 6,
}
NAMES = {number: name for number, name in enumerate(("base", "specs", "model", "search", "uses", "render", "cli"))}
#: Only the top two floors talk to the terminal.
TERMINAL_LIBRARIES = ("rich", "typer", "click")


def _modules() -> dict[str, Path]:
    """'autotune.cli.plan' -> its file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _layer(module: str) -> int | None:
    """The layer of 'autotune.x.y' (by x), None for a module no layer names."""
    parts = module.split(".")
    return LAYERS.get(parts[1] if len(parts) > 1 else "autotune")


def _imports(module: str, path: Path, source: str | None = None) -> set[str]:
    """The autotune modules `module` imports; `from autotune.x import y` counts as autotune.x.y when that is a
    module, else as autotune.x. Relative imports are resolved against the module's package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    text = path.read_text(encoding="utf-8") if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {name for name in found if name == "autotune" or name.startswith("autotune.")}


def test_every_module_has_a_layer():
    unmapped = sorted(m for m in MODULES if _layer(m) is None)
    assert not unmapped, f"modules outside every layer (add them to LAYERS, or move them): {unmapped}"


def test_imports_only_point_down_the_layers():
    offenders = []
    for module, path in MODULES.items():
        own = _layer(module)
        for target in sorted(_imports(module, path)):
            theirs = _layer(target)
            if own is not None and theirs is not None and theirs > own:
                offenders.append(f"{module} ({NAMES[own]}) imports {target} ({NAMES[theirs]})")
    assert not offenders, "upward imports:\n" + "\n".join(offenders)


def test_no_module_is_over_400_lines():
    over = {str(path.relative_to(PACKAGE.parent)): n for path in MODULES.values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"


def test_only_render_and_cli_import_terminal_libraries():
    offenders = []
    for module, path in MODULES.items():
        if (_layer(module) or 0) >= LAYERS["render"]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{module} imports {n}" for n in names if n.split(".")[0] in TERMINAL_LIBRARIES]
    assert not offenders, offenders


def test_no_command_module_imports_the_app_back():
    """cli/app.py imports the command modules to register them; a command importing the app would close a
    circle (the old cli_profile.py / cli_check.py did)."""
    offenders = [m for m, path in MODULES.items() if m.startswith("autotune.cli.") and m != "autotune.cli.app"
                 and ({"autotune.cli.app", "autotune.cli"} & _imports(m, path))]
    assert not offenders, offenders


def test_the_checker_sees_an_upward_import():
    """The walk itself: a planted upward import (specs importing the CLI, also relatively and inside a function)
    is found and placed in its layer."""
    source = "from autotune.cli.options import Pins\n\ndef f():\n    from ..render import common\n"
    targets = _imports("autotune.specs.planted", PACKAGE / "specs" / "planted.py", source)
    assert targets == {"autotune.cli.options", "autotune.render.common"}
    assert [_layer(t) for t in sorted(targets)] == [LAYERS["cli"], LAYERS["render"]]
