"""Where the vocabulary layers sit on the pipeline ranks, and the ranks grouped into runs of alike ones (the
stages stages.build_stages assembles once per run rather than once per rank)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

from autotune.costmodel.pipeline import UNIT_TICKS, Ticks, peak_in_flight

#: Distinct (partition, schedule) pairs whose runs are kept: a partition search meets many partitions
STAGE_RUNS_CACHE = 4096


@dataclass(frozen=True, slots=True)
class VocabPlacement:
    """Which share of the vocabulary layers a pipeline rank runs, and in which of its model chunks."""

    embed: float
    """Share of the input embedding (1 on the rank that holds it, 1/p each under vocabulary parallelism)."""
    head: float
    """Share of the output layer: final norm, LM head and cross-entropy."""
    embed_chunk: int
    head_chunk: int
    shared: bool
    """Embedding and LM head on one GPU: a tied head needs no second copy of the table."""


@cache
def vocab_placement(schedule: str, vocab: str, pp: int, vpp: int, rank: int) -> VocabPlacement:
    """'ends'/'balanced': the embedding opens virtual stage 0 and the head closes the last one (rank p-1,
    or rank 0 under v-half, whose V ends where it starts); 'parallel': both split evenly over all ranks
    (Yeung et al. 2024), the embedding's share in the first chunk and the head's in the last."""
    last_chunk = 1 if schedule == "v-half" else vpp - 1
    if vocab == "parallel" and pp > 1:
        return VocabPlacement(1 / pp, 1 / pp, 0, last_chunk, False)
    head_rank = 0 if schedule == "v-half" else pp - 1
    embed, head = float(rank == 0), float(rank == head_rank)
    return VocabPlacement(embed, head, 0, last_chunk, bool(embed and head))


@cache
def rank_placements(schedule: str, vocab: str, pp: int, vpp: int) -> tuple[tuple[VocabPlacement, int], ...]:
    """Every rank's vocab_placement and a small integer naming each distinct one (a cheap key to share work
    between ranks placed alike)."""
    ids: dict[VocabPlacement, int] = {}
    return tuple((place, ids.setdefault(place, len(ids)))
                 for place in (vocab_placement(schedule, vocab, pp, vpp, rank) for rank in range(pp)))


Part = tuple[int, int, int]
"""(first rank, rank after the last, chunks in flight at the peak): ranks of a run alike in their peak too."""
Run = tuple[int, int, int, VocabPlacement, int, tuple[Part, ...]]
"""(first rank, rank after the last, layers, vocabulary placement, its id, its parts alike in peak)."""


def stage_runs(layers: tuple[int, ...], schedule: str, vocab: str, pp: int, vpp: int, m: int,
               ticks: Ticks) -> tuple[Run, ...]:
    """The ranks in maximal runs alike in layer count and vocabulary placement (the middle ranks of a plan mostly
    form one), each split into parts alike in peak chunks in flight: all a stage's cost depends on besides its
    index, but for the dense-first layers that may open rank 0, which is why rank 0 is always a run of its own.
    Parts, not runs, by peak: 1F1B's peak differs on every rank, and a rank's times and bytes do not depend on it."""
    return _runs(layers, schedule, vocab, pp, vpp, m, ticks if schedule == "v-half" else UNIT_TICKS)


@lru_cache(maxsize=STAGE_RUNS_CACHE)
def _runs(layers: tuple[int, ...], schedule: str, vocab: str, pp: int, vpp: int, m: int,
          ticks: Ticks) -> tuple[Run, ...]:
    placements = rank_placements(schedule, vocab, pp, vpp)
    peaks = peak_in_flight(schedule, pp, vpp, m, ticks)
    kinds = [(n, placements[i][1]) for i, n in enumerate(layers)]
    runs, start = [], 0
    for i in range(1, len(kinds) + 1):
        if i == len(kinds) or i == 1 or kinds[i] != kinds[start]:
            runs.append((start, i, layers[start], *placements[start], _parts(peaks, start, i)))
            start = i
    return tuple(runs)


def _parts(peaks: tuple[int, ...], start: int, stop: int) -> tuple[Part, ...]:
    """Ranks start..stop-1 in maximal parts alike in peak."""
    parts, first = [], start
    for i in range(start + 1, stop + 1):
        if i == stop or peaks[i] != peaks[first]:
            parts.append((first, i, peaks[first]))
            first = i
    return tuple(parts)
