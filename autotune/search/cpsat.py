"""OR-Tools' CP-SAT module, imported without loading pandas.

`ortools.sat.python.cp_model` imports pandas (and with it pyarrow) at module level, for helpers that build
variables and constraints indexed by pandas Series, which autotune never calls. Loading pandas is about 0.6 s,
most of a `plan`'s start-up. So while cp_model is imported, `pandas` is a stand-in whose attributes are
placeholder classes (cp_model reads pd.Index and pd.Series in annotations at import); afterwards the
stand-in hands every attribute to the real pandas, imported on first use, so cp_model's pandas helpers still
work for anyone who calls them. If pandas is loaded already, or the import needs more of pandas than the
stand-in offers (a future ortools), cp_model is imported plainly. The swap is for the first import, from the
main thread (the planner's first solve); the threads autotune starts import neither.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


class _LazyPandas(ModuleType):
    """Placeholders while cp_model imports; the real pandas from then on."""

    def __init__(self) -> None:
        super().__init__("pandas")
        self.importing = True

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if self.importing:
            return type(name, (), {})
        return getattr(importlib.import_module("pandas"), name)


def cp_model() -> ModuleType:
    """ortools.sat.python.cp_model (see the module docstring)."""
    if "ortools.sat.python.cp_model" in sys.modules or "pandas" in sys.modules:
        return importlib.import_module("ortools.sat.python.cp_model")
    stand_in = _LazyPandas()
    sys.modules["pandas"] = stand_in
    try:
        module = importlib.import_module("ortools.sat.python.cp_model")
    except (AttributeError, TypeError, ImportError):  # the stand-in did not suffice: import it the plain way
        sys.modules.pop("ortools.sat.python.cp_model", None)
        sys.modules.pop("pandas", None)
        return importlib.import_module("ortools.sat.python.cp_model")
    finally:
        stand_in.importing = False
        if sys.modules.get("pandas") is stand_in:
            del sys.modules["pandas"]  # a later `import pandas` loads the real one
    return module
