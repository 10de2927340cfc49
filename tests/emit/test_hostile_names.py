"""Issue 17: no name can inject code into an emitted file, whatever it holds.

The names reach the emitters unchecked here (EmitInput is built directly, past specs/limits.check_name), so
this tests the second fence: every emitter writes through emit/quote.py. For every trainer and format and every
hostile name (model and GPU): each file parses in its language (`bash -n`, `ast.parse`, `tomllib`, `json`), has
as many lines as with a harmless name, and running the scripts (with stand-in torchrun, srun and scontrol) or
executing the Python config creates no marker file.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import types
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.emit import emit
from autotune.emit.quote import printable

from .megatron_validate import RUN_ENV
from .scenarios import GOLDEN

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

#: (trainer, torchtitan format) for every emitter and output format.
EMITTERS = [("megatron", "cli"), ("torchtitan", "cli"), ("torchtitan", "toml"), ("deepspeed", "cli"),
            ("colossalai", "cli")]


def hostile_names(marker: Path) -> dict[str, str]:
    """Names that try to run `touch MARKER` from each kind of place an emitted file could hold them."""
    touch = f"touch {marker}"
    return {
        "newline": f"evil\n{touch}\n",
        "newline-python": f"evil\nimport os; os.system('{touch}')\n",
        "subshell": f"$({touch})",
        "backticks": f"`{touch}`",
        "single-quote": f"x'; {touch}; echo '",
        "double-quote": f'x"; {touch}; echo "',
        "traversal": "../../../etc/evil/../config.json",
        "nul": f"a\x00b\n{touch}",
        "carriage-return": f"a\r{touch}\r",
        "unicode-line-breaks": f"a\u2028b\u0085c\x0c\x1b[31m\x7f\n{touch}",
        "lone-surrogate": "a\ud800b",
        "toml-break": f'a"\nflavor = "evil"\n[job]\nx = "{touch}',
        "json-break": 'a", "evil": "1',
        "long": "x" * 5000 + f"\n{touch}",
    }


def _emit(trainer: str, fmt: str, scenario: str, name: str) -> dict[str, str]:
    inp = GOLDEN[scenario]
    inp = replace(inp, model=replace(inp.model, name=name), gpu=name)
    return dict(emit(trainer, inp, torchtitan_format=fmt).files)


def _stand_ins(bin_dir: Path, log: Path) -> dict[str, str]:
    """torchrun (logs its arguments), scontrol (prints a host) and srun (skips its options, runs the rest)."""
    bin_dir.mkdir()
    scripts = {
        "torchrun": f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" >> "{log}"\n',
        "scontrol": "#!/usr/bin/env bash\necho node0\n",
        "srun": '#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift 2; done\nexec "$@"\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TT_CONFIG": "llama3_8b",
            "TRAIN_SCRIPT": "train.py", "SLURM_JOB_NODELIST": "node0", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
            **RUN_ENV}


def _check_parses(file: str, text: str, tmp_path: Path) -> None:
    if file.endswith(".sh"):
        path = tmp_path / file
        path.write_text(text)
        check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert check.returncode == 0 and not check.stderr, f"{file}: bash -n: {check.stderr}"
    elif file.endswith(".py"):
        ast.parse(text)
    elif file.endswith(".toml"):
        tomllib.loads(text)
    elif file.endswith(".json"):
        json.loads(text)
    else:
        assert file.endswith(".txt"), file


@pytest.mark.parametrize("trainer,fmt", EMITTERS)
def test_every_file_parses_and_keeps_its_shape(trainer, fmt, tmp_path):
    """All golden scenarios x all hostile names: each file parses and has the harmless name's line count."""
    for scenario in GOLDEN:
        plain = _emit(trainer, fmt, scenario, "plain-name")
        for label, name in hostile_names(tmp_path / "MARKER").items():
            files = _emit(trainer, fmt, scenario, name)
            assert files.keys() == plain.keys()
            for file, text in files.items():
                text.encode()  # writable as UTF-8 (no lone surrogates)
                assert text.count("\n") == plain[file].count("\n"), (scenario, label, file)
                _check_parses(file, text, tmp_path)


@pytest.mark.parametrize("trainer,fmt", EMITTERS)
def test_running_the_files_creates_no_marker(trainer, fmt, tmp_path):
    marker = tmp_path / "MARKER"
    env = _stand_ins(tmp_path / "bin", tmp_path / "torchrun.log")
    for scenario in ("even", "interleaved"):
        for label, name in hostile_names(marker).items():
            run_dir = tmp_path / f"{scenario}-{label}"
            run_dir.mkdir()
            files = _emit(trainer, fmt, scenario, name)
            for file, text in files.items():
                (run_dir / file).write_text(text)
            for file in files:
                if file.endswith(".sh"):
                    nodes = re.search(r"^#SBATCH --nodes (\d+)$", files[file], re.M)  # what Slurm would set
                    proc = subprocess.run(["bash", file], cwd=run_dir, capture_output=True, text=True, timeout=30,
                                          env={**env, "SLURM_SUBMIT_DIR": str(run_dir),
                                               "SLURM_NNODES": nodes.group(1) if nodes else "1"})
                    assert proc.returncode == 0, (scenario, label, file, proc.stderr)
                elif file.endswith(".py"):
                    _exec_colossalai_config(files[file])
            assert not marker.exists(), f"{trainer} {fmt} {scenario}: name {label!r} ran code"
    if any(file.endswith(".sh") for file in files):  # the stand-in ran: the scripts got as far as the launch
        assert (tmp_path / "torchrun.log").exists()


def _exec_colossalai_config(text: str) -> None:
    """Execute colossalai_config.py as Colossal-AI would (its one import stubbed: the package needs CUDA)."""
    amp = types.ModuleType("colossalai.legacy.amp")
    amp.AMP_TYPE = types.SimpleNamespace(TORCH="torch")  # type: ignore[attr-defined]
    saved = {k: sys.modules.get(k) for k in ("colossalai", "colossalai.legacy", "colossalai.legacy.amp")}
    sys.modules.update({"colossalai": types.ModuleType("colossalai"),
                        "colossalai.legacy": types.ModuleType("colossalai.legacy"), "colossalai.legacy.amp": amp})
    try:
        namespace: dict[str, object] = {}
        exec(compile(text, "colossalai_config.py", "exec"), namespace)  # noqa: S102
        assert "parallel" in namespace
    finally:
        for key, module in saved.items():
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module


def test_toml_and_json_values_hold_the_printable_name(tmp_path):
    """A name is one value in TOML and JSON: the printable form, nothing more (no injected key)."""
    name = hostile_names(tmp_path / "MARKER")["toml-break"]
    toml = tomllib.loads(_emit("torchtitan", "toml", "even", name)["torchtitan.toml"])
    assert toml["model"]["flavor"] == printable(name) and "x" not in toml["job"]
    name = hostile_names(tmp_path / "MARKER")["json-break"]
    plain = _emit("deepspeed", "cli", "even", "plain-name")
    for file, text in _emit("deepspeed", "cli", "even", name).items():
        if not file.endswith(".json"):
            continue
        doc, ref = json.loads(text), json.loads(plain[file])
        assert doc.keys() == ref.keys() and "evil" not in doc
        assert any(printable(name) in line for line in doc["_autotune"]["header"])
