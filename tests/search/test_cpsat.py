"""search/cpsat.py: CP-SAT imported without pandas, solving as before, and its pandas helpers still on the
real pandas afterwards (each case in a fresh interpreter: the import is once per process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SOLVE = """
m = cp_model()
x = m.CpModel(); v = x.NewIntVar(0, 9, "v"); x.Add(v >= 4); x.Minimize(v)
s = m.CpSolver(); assert s.Solve(x) == m.OPTIMAL and s.Value(v) == 4
"""


def _run(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_cp_model_loads_without_pandas_and_solves() -> None:
    _run("import sys\nfrom autotune.search.cpsat import cp_model\n" + SOLVE
         + "assert 'pandas' not in sys.modules and 'pyarrow' not in sys.modules\n"
         + "assert cp_model() is m\n")


def test_its_pandas_helpers_get_the_real_pandas_afterwards() -> None:
    pytest.importorskip("pandas")
    _run("from autotune.search.cpsat import cp_model\n" + SOLVE
         + "import pandas\nassert m.pd.Series is pandas.Series\n"
         + "xs = m.CpModel().new_int_var_series('x', pandas.Index(range(3)), 0, 5)\nassert len(xs) == 3\n")


def test_a_process_that_has_pandas_imports_it_plainly() -> None:
    pytest.importorskip("pandas")
    _run("import pandas\nfrom autotune.search.cpsat import cp_model\n" + SOLVE + "assert m.pd is pandas\n")


def test_a_stand_in_that_does_not_suffice_falls_back_to_pandas() -> None:
    """A future ortools that needs more of pandas at import than placeholders: the plain import, real pandas."""
    pytest.importorskip("pandas")
    _run("from autotune.search import cpsat\n"
         "def refuse(self, name):\n    raise AttributeError(name)\n"
         "cpsat._LazyPandas.__getattr__ = refuse\n"
         "cp_model = cpsat.cp_model\n" + SOLVE
         + "import sys\nassert not isinstance(sys.modules['pandas'], cpsat._LazyPandas) and m.pd.__version__\n")
