"""Recall by prompt length (the depths pooled), and what the cells say about it against the baseline.

A length *keeps* its facts when the run's Wilson interval there overlaps the baseline's and its
accuracy is at least :data:`KEEP_RATIO` of the baseline's, and *loses* them when the run's interval
lies wholly below the baseline's (a drop a sample this size can tell from noise). The seed's
symptom, "short prompts keep their facts, long prompts lose them", is said only when the measured
cells show it: at least one length of each kind, every kept length shorter than every lost one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speedtrap._stats import wilson
from speedtrap.report._model import RecallRun

SYMPTOM = "short prompts keep their facts, long prompts lose them"
KEEP_RATIO = 0.85


@dataclass(frozen=True)
class LengthRecall:
    """One length of one run: correct answers out of n over every depth, with a Wilson 95% interval."""

    length: int
    n: int
    correct: int
    low: float
    high: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    def text(self) -> str:
        return f"{self.correct}/{self.n}"


def by_length(run: RecallRun) -> list[LengthRecall]:
    """The run's cells pooled over depths, shortest length first."""
    pooled: dict[int, tuple[int, int]] = {}
    for cell in run.cells:
        correct, n = pooled.get(cell.length, (0, 0))
        pooled[cell.length] = (correct + cell.correct, n + cell.n)
    out = []
    for length in sorted(pooled):
        correct, n = pooled[length]
        if n:
            out.append(LengthRecall(length, n, correct, *wilson(correct, n)))
    return out


@dataclass(frozen=True)
class LengthPattern:
    """A run against the baseline, length by length: which lengths keep their facts and which lose them."""

    label: str
    kept: tuple[int, ...]
    lost: tuple[int, ...]
    rows: tuple[tuple[LengthRecall, LengthRecall], ...]  # (baseline, run) per common length

    @property
    def symptom(self) -> bool:
        """Short prompts keep their facts and long prompts lose them."""
        return bool(self.kept) and bool(self.lost) and max(self.kept) < min(self.lost)

    def sentence(self) -> str:
        cells = "; ".join(
            f"{run.text()} at {run.length:,} tokens (baseline {base.text()}"
            + (", intervals apart" if run.length in self.lost else "")
            + ")"
            for base, run in self.rows
        )
        if self.symptom:
            return f"{self.label}: {SYMPTOM}: {cells}"
        if self.lost and not self.kept:
            return f"{self.label} loses facts at every length measured: {cells}"
        if self.lost:
            return f"{self.label} loses facts at some lengths, not in order of length: {cells}"
        return f"{self.label} shows no drop from the baseline that the samples can tell from noise: {cells}"


def length_pattern(baseline: RecallRun, run: RecallRun) -> LengthPattern:
    base = {r.length: r for r in by_length(baseline)}
    rows = tuple((base[r.length], r) for r in by_length(run) if r.length in base)
    lost = tuple(r.length for b, r in rows if r.high < b.low)
    kept = tuple(
        r.length for b, r in rows if r.high >= b.low and r.low <= b.high and r.accuracy >= KEEP_RATIO * b.accuracy
    )
    return LengthPattern(run.label, kept, lost, rows)


def length_patterns(runs: Sequence[RecallRun]) -> list[LengthPattern]:
    """Every patched run against the baseline (the run without patches); none without a baseline or
    when the grid has a single length."""
    baseline = next((r for r in runs if not r.patches), None)
    if baseline is None or len(by_length(baseline)) < 2:
        return []
    return [length_pattern(baseline, r) for r in runs if r.patches]
