"""What a report shows, as typed data: every section round-trips through JSON (``to_json`` / ``from_json``).

The model holds the stages' own result types (a probe's recall cell and divergence phase, isolate's
trial, localize's scale unit), read from their JSON leniently, so a report renders from JSON files
alone, whatever version of a stage wrote them, and writes the fields it shows; where both are the
same shape (a culprit set, a layer's growth) it holds the one class both use, from
:mod:`speedtrap._shapes`. The JSON form is the
published ``report.json`` (schema: ``schemas/report.schema.json``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from speedtrap._shapes import CulpritSet
from speedtrap._stats import wilson
from speedtrap.probe import BucketStats, KLStats, PhaseDivergence, RecallCell
from speedtrap.report._sites import StaticSite

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
    factor_sites: tuple[StaticSite, ...] = ()  # where the patch's diff applies a factor, as triage read it

    def to_json(self) -> dict[str, Any]:
        return {
            **({} if self.diff_given else {"diff_given": False}),
            **({"factor_sites": [s.to_json() for s in self.factor_sites]} if self.factor_sites else {}),
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
            tuple(StaticSite.from_json(s) for s in d.get("factor_sites") or []),
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


# The probes' own result types (``speedtrap.probe.RecallCell``, ``KLStats``, ``PhaseDivergence``),
# read from a probe's JSON or a report's; the report writes the fields it shows (``CELL_SHOWN`` ...).
# A figure a document lacks, or holds as null, NaN or an infinity, is NaN in the model and null in JSON.

CELL_SHOWN = ("length", "depth", "n", "correct", "accuracy", "low", "high", "prompt_tokens")
OVERALL_SHOWN = ("n", "correct", "accuracy", "low", "high")
KL_FIELDS = ("kl_mean", "kl_median", "kl_p90", "kl_p99", "kl_max", "same_top1", "rms_dp")
KL_SHOWN = ("tokens", *KL_FIELDS)


def shown_cell(d: dict[str, Any], pooled: bool = False) -> RecallCell:
    """The probe's ``RecallCell`` from a cell's JSON (a probe's or a report's). An older document
    may lack ``correct`` (from the accuracy), the interval (0 to 1) or the prompt length (None).
    ``pooled``: the whole grid (length 0, depth -1), of which the report shows ``OVERALL_SHOWN``."""
    n = int(d["n"])
    accuracy = float(d["accuracy"])
    correct = int(d["correct"]) if d.get("correct") is not None else round(accuracy * n)
    tokens = _f(d.get("prompt_tokens"))
    return RecallCell.from_json(
        {
            "length": 0 if pooled else int(d["length"]),
            "depth": -1.0 if pooled else float(d["depth"]),
            "n": n,
            "correct": correct,
            "accuracy": accuracy,
            "low": float(d.get("low", 0.0)),
            "high": float(d.get("high", 1.0)),
            "prompt_tokens": None if tokens is None or pooled else round(tokens),
        }
    )


def pooled_cell(cells: tuple[RecallCell, ...]) -> RecallCell:
    """The whole grid as one cell (length 0, depth -1, as the probe pools it), from its cells."""
    n = sum(c.n for c in cells)
    correct = sum(c.correct for c in cells)
    low, high = wilson(correct, n)
    return RecallCell(0, -1.0, n, correct, correct / n if n else 0.0, low, high)


def cell_json(cell: RecallCell, keys: tuple[str, ...] = CELL_SHOWN) -> dict[str, Any]:
    d = {k: getattr(cell, k) for k in keys}
    if "prompt_tokens" in d and d["prompt_tokens"] is not None:
        d["prompt_tokens"] = float(d["prompt_tokens"])  # a mean (report.schema.json: a number)
    return d


def shown_kl(d: dict[str, Any]) -> KLStats:
    """The probe's ``KLStats`` from its JSON; a figure missing, null or not finite is NaN."""
    figures = {k: math.nan if (v := _f(d.get(k))) is None else v for k in KL_FIELDS}
    return KLStats.from_json({**figures, "tokens": int(d.get("tokens", 0) or 0)})


def kl_json(stats: KLStats) -> dict[str, Any]:
    return {"tokens": stats.tokens, **{k: _f(getattr(stats, k)) for k in KL_FIELDS}}


def shown_phase(d: dict[str, Any]) -> PhaseDivergence:
    """The probe's ``PhaseDivergence`` from a phase's JSON (the probe's ``by_bucket`` or the report's ``buckets``)."""
    buckets = d.get("by_bucket", d.get("buckets", []))
    return PhaseDivergence(
        shown_kl(d["overall"]),
        [BucketStats(int(b["start"]), int(b["end"]), shown_kl(b["stats"])) for b in buckets],
    )


def phase_json(name: str, phase: PhaseDivergence) -> dict[str, Any]:
    return {
        "phase": name,
        "overall": kl_json(phase.overall),
        "buckets": [{"start": b.start, "end": b.end, "stats": kl_json(b.stats)} for b in phase.by_bucket],
    }


@dataclass(frozen=True)
class RecallRun:
    """Planted-fact recall of one configuration over the length x depth grid."""

    label: str  # baseline | all patches | a culprit set
    patches: tuple[str, ...]
    overall: RecallCell  # the whole grid pooled (length 0, depth -1)
    cells: tuple[RecallCell, ...]
    command: str = ""
    stops: tuple[str, ...] = ()  # a sequential probe: where each length stopped and why

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "label": self.label,
            "patches": list(self.patches),
            "overall": cell_json(self.overall, OVERALL_SHOWN),
            "cells": [cell_json(c) for c in self.cells],
            "command": self.command,
        }
        if self.stops:
            out["stops"] = list(self.stops)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RecallRun:
        return cls(
            str(d["label"]),
            _strs(d.get("patches")),
            shown_cell(d["overall"], pooled=True),
            tuple(shown_cell(c) for c in d.get("cells", [])),
            str(d.get("command", "")),
            tuple(str(x) for x in d.get("stops", [])),
        )


PHASE_ORDER = {"prefill": 0, "decode": 1}


@dataclass(frozen=True)
class DivergenceRun:
    """Teacher-forced divergence of one configuration from the baseline, by position, per phase."""

    label: str
    patches: tuple[str, ...]
    phases: dict[str, PhaseDivergence]  # prefill | decode -> the probe's figures, in that order
    command: str = ""
    reading: str = ""  # where the figures place the fault (the probe's reading), "" when they say nothing

    def phase(self, name: str) -> PhaseDivergence | None:
        return self.phases.get(name)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "label": self.label,
            "patches": list(self.patches),
            "phases": [phase_json(k, v) for k, v in self.phases.items()],
            "command": self.command,
        }
        return {**doc, "reading": self.reading} if self.reading else doc  # a report without one: as before

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DivergenceRun:
        return cls(
            str(d["label"]),
            _strs(d.get("patches")),
            {str(p["phase"]): shown_phase(p) for p in d.get("phases", [])},
            str(d.get("command", "")),
            str(d.get("reading") or ""),
        )
