"""What `check` flags, and its exit code: a stage that does not fit (exit 5, naming the stage and the memory term
that binds), a best plan faster by more than --max-gap percent (exit 4), and the reader's notes.

Also the search space of "the same constraints": what the trainer runs as planned (its capability row in
specs/trainers.py), on the same GPUs, batch, sequence and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.stages import StageCost
from autotune.search.space import SearchSpace, for_trainer
from autotune.specs.plan import Plan
from autotune.specs.trainers import caps_for
from autotune.units import gib

EXIT_LIMIT = 3  # as plan's: a limit stopped the search before it proved its best plan
EXIT_GAP = 4
EXIT_OOM = 5
_TERMS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer states",
          "activations": "activations", "vocab_activations": "vocabulary activations (logits)",
          "transient": "transient buffers"}


def trainer_space(trainer: str, plan: Plan) -> SearchSpace:
    """Plans the trainer runs exactly as autotune costs them (its capability row, specs/trainers.py); a Megatron
    config that runs the vocabulary-parallel fork is compared within that fork."""
    fork = "vocab-parallel" if trainer == "megatron" and plan.vocab == "parallel" else None
    return for_trainer(SearchSpace(), caps_for(trainer, fork))


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the verdict: level 'error' | 'warning' | 'notice', its message, the exit code it implies."""

    level: str
    message: str
    exit_code: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"level": self.level, "message": self.message, "exit_code": self.exit_code}


def binding_term(stage: StageCost) -> tuple[str, int]:
    """The largest memory term of a stage: the one to cut first."""
    terms = stage.memory.terms()
    key = max(terms, key=lambda k: (terms[k], k))
    return _TERMS[key], terms[key]


def memory_findings(est: Estimate) -> list[Finding]:
    """One error per binding term over the stages past the usable memory (a 64-stage pipeline that does not fit
    is one line, not 64): the stages, the largest of them, and the term to cut first."""
    usable = est.usable_memory_bytes
    by_term: dict[str, list[StageCost]] = {}
    for s in est.stages:
        if s.memory.total > usable:
            by_term.setdefault(binding_term(s)[0], []).append(s)
    out = []
    for term, stages in by_term.items():
        worst = max(stages, key=lambda s: s.memory.total)
        size = max(binding_term(s)[1] for s in stages)
        if len(stages) == 1:
            what = f"stage {worst.index} is predicted out of memory: {gib(worst.memory.total):.2f} GiB"
        else:
            what = (f"stages {_ranges([s.index for s in stages])} are predicted out of memory: up to "
                    f"{gib(worst.memory.total):.2f} GiB (stage {worst.index})")
        out.append(Finding("error", f"{what} of {gib(usable):.2f} GiB usable; binding term: {term} "
                                    f"{'up to ' if len(stages) > 1 else ''}{gib(size):.2f} GiB", EXIT_OOM))
    return out


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def gain_pct(current: Estimate, best: Estimate) -> float:
    """How much faster the best plan is, in percent of its own step time (as `plan --compare` reports it)."""
    return 100 * (current.step_time_s / best.step_time_s - 1)


def gap_finding(current: Estimate, best: Estimate | None, max_gap: float | None) -> Finding | None:
    if best is None:
        return None
    gain = gain_pct(current, best)
    if gain < 0.05:
        return None
    text = f"the best plan under the same constraints is {gain:.1f}% faster ({best.step_time_s:.3f} s vs " \
           f"{current.step_time_s:.3f} s per step)"
    if max_gap is not None and gain > max_gap:
        return Finding("error", f"{text}: more than --max-gap {max_gap:g}%", EXIT_GAP)
    return Finding("warning", text)


def exit_code(findings: list[Finding]) -> int:
    """5 (out of memory) before 4 (gap) before 3 (the best plan not proven: a limit stopped its search) before 0."""
    codes = {f.exit_code for f in findings}
    return next((c for c in (EXIT_OOM, EXIT_GAP, EXIT_LIMIT) if c in codes), 0)


def github_line(finding: Finding, path: str) -> str:
    """A GitHub Actions workflow command (`::warning file=...::message`), escaped as the runner requires."""
    def esc(text: str, prop: bool = False) -> str:
        text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return text.replace(":", "%3A").replace(",", "%2C") if prop else text

    return f"::{finding.level} file={esc(path, True)},title=autotune check::{esc(finding.message)}"
