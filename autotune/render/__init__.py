"""Everything the CLI shows: rich renderables for people, plain dicts for ``--json``, one module per command
(estimate, plan, scale, catalogs, trainers) over common.py (console, JSON writer, one-line plan names) and
timeline.py (the plain-text pipeline pictures).

Functions here take finished results (specs, an `Estimate`, a `PlanResult`) and only format them; no cost is
computed here beyond unit conversion and shares of a total. JSON floats are rounded so that output is
byte-identical across runs and platforms. Callers import from the submodules; this package exports nothing.
"""
