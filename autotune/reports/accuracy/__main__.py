"""How close the cost model comes to published step times, over every public set of published measurements.

The command line of both sets (the package docstring says what they are):
``python -m autotune.reports.accuracy [--set megatron2021|public|all] [--json]`` (``make accuracy``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from autotune.errors import SpecError
from autotune.reports.accuracy.common import DEFAULT_DATA, PUBLIC_DATA, SETS
from autotune.reports.accuracy.megatron2021 import accuracy_report, format_report
from autotune.reports.accuracy.public import format_public, public_report
from autotune.reports import run_main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.reports.accuracy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=(*SETS, "all"), default="all", dest="which",
                        help="which published set to report (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="the Megatron 2021 Table 1 CSV (default: %(default)s)")
    parser.add_argument("--public-data", type=Path, default=PUBLIC_DATA,
                        help="the published-runs CSV (default: %(default)s)")
    parser.add_argument("--gpu", default="a100-80gb",
                        help="catalog GPU or hardware file for the Megatron 2021 set (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = parser.parse_args(argv)
    sets = SETS if args.which == "all" else (args.which,)
    try:
        reports = {}
        if "megatron2021" in sets:
            reports["megatron2021"] = accuracy_report(args.data, args.gpu)
        if "public" in sets:
            reports["public"] = public_report(args.public_data)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps({k: r.to_dict() for k, r in reports.items()}, indent=2, sort_keys=True))
    else:
        texts = [format_report(r) if k == "megatron2021" else format_public(r) for k, r in reports.items()]
        print("\n\n".join(texts))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
