"""What a report shows, as typed data: every section round-trips through JSON (``to_json`` / ``from_json``).

Where the report shows less than a stage records (an interaction, a trial, a scale unit), the model
holds the report's own smaller view, read leniently, so a report renders from JSON files alone,
whatever version of a stage wrote them; where both are the same shape (a culprit set, a layer's
growth) it holds the one class both use, from :mod:`speedtrap._shapes`. The JSON form is the
published ``report.json`` (schema: ``schemas/report.schema.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speedtrap._shapes import CulpritSet

SCHEMA_VERSION = 1
KIND = "speedtrap-report"


def _f(value: Any) -> float | None:
    """A float or None (JSON null, NaN and infinities become None: JSON has no NaN)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def _strs(values: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in (values or []))


# -- verdict ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InteractionNote:
    kind: str  # joint | cancel | masked
    patches: tuple[str, ...]
    explanation: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "patches": list(self.patches), "explanation": self.explanation}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> InteractionNote:
        return cls(str(d["kind"]), _strs(d["patches"]), str(d.get("explanation", "")))


@dataclass(frozen=True)
class ReportVerdict:
    """The answer first: who is to blame and the chain of evidence that says so."""

    status: str  # culprit | no_regression | baseline_fails | inconclusive | unknown
    headline: str
    culprits: tuple[CulpritSet, ...] = ()
    interactions: tuple[InteractionNote, ...] = ()
    evidence: tuple[str, ...] = ()  # one sentence per stage, in pipeline order

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "headline": self.headline,
            "culprits": [c.to_json() for c in self.culprits],
            "interactions": [i.to_json() for i in self.interactions],
            "evidence": list(self.evidence),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReportVerdict:
        return cls(
            str(d["status"]),
            str(d["headline"]),
            tuple(CulpritSet.from_json(c) for c in d.get("culprits", [])),
            tuple(InteractionNote.from_json(i) for i in d.get("interactions", [])),
            _strs(d.get("evidence")),
        )


# -- triage -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TriageRow:
    name: str
    tier: int
    score: float
    kind: str
    gate: str
    scope: str
    phases: tuple[str, ...]
    reasons: tuple[str, ...]
    diff_given: bool = True  # False: nothing was read, the tier is triage's default

    def to_json(self) -> dict[str, Any]:
        return {
            **({} if self.diff_given else {"diff_given": False}),
            "name": self.name,
            "tier": self.tier,
            "score": self.score,
            "kind": self.kind,
            "gate": self.gate,
            "scope": self.scope,
            "phases": list(self.phases),
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TriageRow:
        return cls(
            str(d["name"]),
            int(d["tier"]),
            float(d.get("score", 0.0)),
            str(d.get("kind", "")),
            str(d.get("gate", "")),
            str(d.get("scope", "")),
            _strs(d.get("phases")),
            _strs(d.get("reasons")),
            bool(d.get("diff_given", True)),
        )


@dataclass(frozen=True)
class TriageSection:
    source: str
    rows: tuple[TriageRow, ...]  # in rank order
    plan_markdown: str = ""
    warnings: tuple[str, ...] = ()
    command: str = ""

    def tier(self, n: int) -> list[TriageRow]:
        return [r for r in self.rows if r.tier == n]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "rows": [r.to_json() for r in self.rows],
            "plan_markdown": self.plan_markdown,
            "warnings": list(self.warnings),
            "command": self.command,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TriageSection:
        return cls(
            str(d.get("source", "")),
            tuple(TriageRow.from_json(r) for r in d.get("rows", [])),
            str(d.get("plan_markdown", "")),
            _strs(d.get("warnings")),
            str(d.get("command", "")),
        )


# -- probes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecallCell:
    """One (context length, depth) cell: correct answers out of n, with a Wilson interval."""

    length: int  # target prompt length, tokens
    depth: float  # where the fact sits: 0 = start of the conversation, 1 = just before the question
    n: int
    correct: int
    accuracy: float
    low: float
    high: float
    prompt_tokens: float | None = None  # measured mean prompt length, tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "length": self.length,
            "depth": self.depth,
            "n": self.n,
            "correct": self.correct,
            "accuracy": self.accuracy,
            "low": self.low,
            "high": self.high,
            "prompt_tokens": self.prompt_tokens,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RecallCell:
        n = int(d["n"])
        accuracy = float(d["accuracy"])
        correct = int(d["correct"]) if d.get("correct") is not None else round(accuracy * n)
        return cls(
            int(d["length"]),
            float(d["depth"]),
            n,
            correct,
            accuracy,
            float(d.get("low", 0.0)),
            float(d.get("high", 1.0)),
            _f(d.get("prompt_tokens")),
        )


@dataclass(frozen=True)
class RecallSummary:
    n: int
    correct: int
    accuracy: float
    low: float
    high: float

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "correct": self.correct, "accuracy": self.accuracy, "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RecallSummary:
        n = int(d["n"])
        accuracy = float(d["accuracy"])
        correct = int(d["correct"]) if d.get("correct") is not None else round(accuracy * n)
        return cls(n, correct, accuracy, float(d.get("low", 0.0)), float(d.get("high", 1.0)))


@dataclass(frozen=True)
class RecallRun:
    """Planted-fact recall of one configuration over the length x depth grid."""

    label: str  # baseline | all patches | a culprit set
    patches: tuple[str, ...]
    overall: RecallSummary
    cells: tuple[RecallCell, ...]
    command: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "patches": list(self.patches),
            "overall": self.overall.to_json(),
            "cells": [c.to_json() for c in self.cells],
            "command": self.command,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RecallRun:
        return cls(
            str(d["label"]),
            _strs(d.get("patches")),
            RecallSummary.from_json(d["overall"]),
            tuple(RecallCell.from_json(c) for c in d.get("cells", [])),
            str(d.get("command", "")),
        )


KL_FIELDS = ("kl_mean", "kl_median", "kl_p90", "kl_p99", "kl_max", "same_top1", "rms_dp")


@dataclass(frozen=True)
class KLSummary:
    """KL(baseline || candidate) of next-token distributions and same-top-1 rate over some tokens."""

    tokens: int
    kl_mean: float | None = None
    kl_median: float | None = None
    kl_p90: float | None = None
    kl_p99: float | None = None
    kl_max: float | None = None
    same_top1: float | None = None
    rms_dp: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, **{k: getattr(self, k) for k in KL_FIELDS}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KLSummary:
        return cls(int(d.get("tokens", 0) or 0), **{k: _f(d.get(k)) for k in KL_FIELDS})


@dataclass(frozen=True)
class KLBucket:
    start: int  # first position of the bucket (token index)
    end: int  # one past the last
    stats: KLSummary

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "stats": self.stats.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KLBucket:
        return cls(int(d["start"]), int(d["end"]), KLSummary.from_json(d["stats"]))


@dataclass(frozen=True)
class PhaseDivergence:
    phase: str  # prefill | decode
    overall: KLSummary
    buckets: tuple[KLBucket, ...]

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "overall": self.overall.to_json(), "buckets": [b.to_json() for b in self.buckets]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PhaseDivergence:
        return cls(
            str(d["phase"]),
            KLSummary.from_json(d["overall"]),
            tuple(KLBucket.from_json(b) for b in d.get("buckets", [])),
        )


@dataclass(frozen=True)
class DivergenceRun:
    """Teacher-forced divergence of one configuration from the baseline, by position, per phase."""

    label: str
    patches: tuple[str, ...]
    phases: tuple[PhaseDivergence, ...]
    command: str = ""

    def phase(self, name: str) -> PhaseDivergence | None:
        return next((p for p in self.phases if p.phase == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "patches": list(self.patches),
            "phases": [p.to_json() for p in self.phases],
            "command": self.command,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DivergenceRun:
        return cls(
            str(d["label"]),
            _strs(d.get("patches")),
            tuple(PhaseDivergence.from_json(p) for p in d.get("phases", [])),
            str(d.get("command", "")),
        )
