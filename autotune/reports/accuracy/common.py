"""What the accuracy sets share: the published data files, reading them, and the summary figures (MAPE, bias,
LOFO, the release spread floor) with their text lines."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.catalog import PROFILES_DIR
from autotune.errors import SpecError

PUBLISHED_DIR = PROFILES_DIR / "published"
#: a copy of ../shared/data/megatron-2021-table1.csv shipped with the package (published measurements)
DEFAULT_DATA = PUBLISHED_DIR / "megatron-2021-table1.csv"
#: a copy of ../shared/data/published-runs-public.csv (151 rows) behind '#' lines naming its sources
PUBLIC_DATA = PUBLISHED_DIR / "published-runs-public.csv"
SETS = ("megatron2021", "public")


def read_rows(path: Path) -> list[dict[str, str]]:
    """The CSV's data rows (lines starting with '#' are comments)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SpecError(f"--data {path}: cannot read ({exc.strerror})") from None
    return list(csv.DictReader(line for line in lines if line.strip() and not line.startswith("#")))


def error_pct(predicted: float, published: float) -> float:
    """(predicted - published) / published, in percent: negative means the model is too fast."""
    return 100 * (predicted - published) / published


@dataclass(frozen=True, slots=True)
class Summary:
    """One subset's (or one set's) figures."""

    name: str
    n: int
    mape_pct: float
    """Mean absolute percentage error."""
    mean_error_pct: float
    """Mean signed error, the bias: negative = the model is too fast."""
    worst_row: str
    worst_error_pct: float
    not_fitting: int
    """Rows whose plan the cost model predicts not to fit in memory."""
    lofo_mape_pct: float | None
    """MAPE of the leave-one-family-out predictions (None where the set has no fit hook)."""
    spread_floor_pct: float | None
    """Lowest MAPE any model giving one prediction per config_key can reach here (None: no key repeats)."""
    repeated_configs: int
    """config_keys measured in several releases."""


def summarize(name: str, rows: Sequence[tuple[str, float, bool]], lofo: Sequence[float] | None = None,
              configs: Sequence[tuple[str, float]] | None = None) -> Summary:
    """rows: (label, error %, fits); lofo: the LOFO errors %; configs: (config_key, published step s)."""
    errors = [e for _, e, _ in rows]
    worst = max(rows, key=lambda r: abs(r[1]))
    floor, repeated = spread_floor(configs) if configs is not None else (None, 0)
    return Summary(name=name, n=len(rows), mape_pct=_mean(abs(e) for e in errors), mean_error_pct=_mean(errors),
                   worst_row=worst[0], worst_error_pct=worst[1], not_fitting=sum(not f for _, _, f in rows),
                   lofo_mape_pct=None if lofo is None else _mean(abs(e) for e in lofo),
                   spread_floor_pct=floor, repeated_configs=repeated)


def spread_floor(configs: Sequence[tuple[str, float]]) -> tuple[float | None, int]:
    """The release spread floor: a model sees the same inputs for every release of one config_key, so on a key
    measured as t_1..t_k the best it can do is the single p minimizing sum |t_i - p| / t_i (one of the t_i);
    the floor is that least error summed over repeated keys, divided by all rows (comparable to the MAPE)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for key, t in configs:
        groups[key].append(t)
    repeated = [g for g in groups.values() if len(g) > 1]
    if not repeated:
        return None, 0
    least = sum(min(sum(abs(t - p) / t for t in g) for p in g) for g in repeated)
    return 100 * least / len(configs), len(repeated)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


def summary_head() -> str:
    return (f"{'subset':<38} {'n':>4} {'MAPE':>7} {'bias':>7} {'LOFO':>7} {'floor':>7}  {'worst row':<20} "
            f"{'not fit':>7}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def summary_line(s: Summary) -> str:
    worst = f"{s.worst_row} ({s.worst_error_pct:+.1f}%)"
    return (f"{s.name:<38} {s.n:>4} {_pct(s.mape_pct):>7} {s.mean_error_pct:>+6.1f}% {_pct(s.lofo_mape_pct):>7} "
            f"{_pct(s.spread_floor_pct):>7}  {worst:<20} {s.not_fitting:>7}")
