"""The probes' plain result types: a recall sample and cell, a divergence bucket and phase.

Importing this module loads no probe machinery (neither torch nor httpx): readers of results (the
report) hold these types without loading a backend. The reports that own them
(:class:`~speedtrap.probe.RecallReport`, :class:`~speedtrap.probe.DivergenceReport`) are in the
probes' own modules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from speedtrap._stats import wilson
from speedtrap.probe._stats import KLStats, PositionStat, summarize


@dataclass(frozen=True)
class RecallSample:
    conversation: str  # "L512-s0"
    length: int
    depth: float
    key: str  # the question asked: "the blue door"
    expected: str
    answer: str
    correct: bool
    prompt_tokens: int

    @property
    def id(self) -> str:
        return f"{self.conversation}@{self.depth:g}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecallSample:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class RecallCell:
    """One grid cell (or the whole grid: ``length`` 0 and ``depth`` -1)."""

    length: int
    depth: float
    n: int
    correct: int
    accuracy: float
    low: float  # Wilson 95% interval
    high: float
    prompt_tokens: int | None = None  # mean prompt tokens of its samples (None: not recorded)

    @classmethod
    def of(cls, length: int, depth: float, samples: Sequence[RecallSample]) -> RecallCell:
        n, correct = len(samples), sum(s.correct for s in samples)
        low, high = wilson(correct, n)
        tokens = round(sum(s.prompt_tokens for s in samples) / n) if n else 0
        return cls(length, depth, n, correct, correct / n if n else 0.0, low, high, tokens)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RecallCell:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class LengthStop:
    """Where a sequential recall probe stopped one length, and why (``speedtrap.probe._sequential``)."""

    length: int
    decision: str  # "lost", "kept" or "undecided" (ran to the grid's maximum)
    asked: int  # questions asked of the candidate at this length
    maximum: int  # the grid's questions at this length
    correct: int  # the candidate's right answers among them
    reference_correct: int  # the reference's right answers to the same questions
    alpha: float
    beta: float

    def sentence(self) -> str:
        """ "stopped after 6 of 10 questions: 1/6 against 6/6 at 1,280 tokens, lost (alpha 0.05)"."""
        pair = f"{self.correct}/{self.asked} against {self.reference_correct}/{self.asked} at {self.length:,} tokens"
        if self.decision == "undecided":
            return f"undecided after all {self.maximum} questions: {pair}"
        rate = f"alpha {self.alpha:g}" if self.decision == "lost" else f"beta {self.beta:g}"
        return f"stopped after {self.asked} of {self.maximum} questions: {pair}, {self.decision} ({rate})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LengthStop:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class BucketStats:
    start: int  # positions [start, end) of the predicted tokens
    end: int
    stats: KLStats

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "stats": self.stats.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BucketStats:
        return cls(int(data["start"]), int(data["end"]), KLStats.from_json(data["stats"]))


@dataclass(frozen=True)
class PhaseDivergence:
    overall: KLStats
    by_bucket: list[BucketStats]

    @classmethod
    def of(cls, stats: Sequence[PositionStat], bucket_size: int) -> PhaseDivergence:
        buckets: dict[int, list[PositionStat]] = {}
        for s in stats:
            buckets.setdefault(s.position // bucket_size, []).append(s)
        size = bucket_size
        by_bucket = [BucketStats(b * size, (b + 1) * size, summarize(buckets[b])) for b in sorted(buckets)]
        return cls(summarize(stats), by_bucket)

    def to_json(self) -> dict[str, Any]:
        return {"overall": self.overall.to_json(), "by_bucket": [b.to_json() for b in self.by_bucket]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PhaseDivergence:
        return cls(KLStats.from_json(data["overall"]), [BucketStats.from_json(b) for b in data["by_bucket"]])


def flatten_figures(obj: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON document as ``a.b.c`` -> value (lists are skipped: per-cell detail)."""
    out: dict[str, float] = {}
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            out.update(flatten_figures(value, f"{prefix}{key}."))
    elif isinstance(obj, (bool, int, float)):
        out[prefix[:-1]] = float(obj)
    return out
