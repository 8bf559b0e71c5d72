"""The regression gate: a build measured against a recording of a trusted one, judged by bounds.

Exit codes (``speedtrap check --against``): 0 every bound holds, 1 a regression (the result names
the figure, its value and the bound), 2 bad input or infrastructure (raised as one-line errors).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree as ET

from speedtrap._errors import UsageError
from speedtrap._redact import redact_url
from speedtrap.isolate import Outcome, RecallDropRule, ThresholdRule, report_figures
from speedtrap.spec import DEFAULT_BOUND
from speedtrap.spec import Bound as Bound

DEFAULT_BOUNDS = (str(DEFAULT_BOUND),)  # divergence: the worst phase's p99 KL, as isolate's default verdict


@dataclass(frozen=True)
class Check:
    """One judged figure: what it is, its value, the bound, and whether it passed."""

    name: str
    probe: str
    value: float
    bound: str
    passed: bool
    message: str
    limit: Bound | None = None  # the divergence bound judged (None for the recall rule)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "probe": self.probe, "value": self.value, "bound": self.bound,
                "passed": self.passed, "message": self.message}  # fmt: skip


@dataclass
class GateResult:
    recording: str
    target: str
    checks: list[Check]
    notes: list[str] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    reading: str | None = None  # where the divergence's figures place the fault (DivergenceReport.reading)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": "pass" if self.passed else "regression",
            "exit_code": self.exit_code,
            "recording": self.recording,
            "target": self.target,
            "checks": [c.to_json() for c in self.checks],
            "notes": self.notes,
            "measured": self.measured,
            "elapsed_s": self.elapsed_s,
            "reading": self.reading,
        }


def judge_divergence(report: Any, bounds: Sequence[Bound]) -> list[Check]:
    figures = report_figures("divergence", report)
    out = []
    for bound in bounds:
        if bound.metric not in figures:
            raise UsageError(
                f"--bound {bound}: the divergence probe reports no figure {bound.metric!r}",
                f"use one of: {', '.join(sorted(figures))}",
            )
        value = figures[bound.metric]
        rule = ThresholdRule.of_bound(bound)
        passed = rule.judge(rule.pool([figures]), None) is Outcome.PASS
        bad = ">" if bound.direction == "above" else "<"
        message = (
            f"{bound.metric} = {value:.6g} within {bound}"
            if passed
            else f"regression: {bound.metric} = {value:.6g} {bad} bound {bound.value:g}"
        )
        out.append(Check(bound.metric, "divergence", value, str(bound), passed, message, bound))
    return out


def judge_recall(comparison: Any, margin: float = 0.0) -> list[Check]:
    """Recall against the recorded answers: fails when the Wilson intervals separate (recall_drop rule)."""
    rule = RecallDropRule(margin)
    base, cand = comparison.baseline.overall, comparison.candidate.overall
    figures = {"accuracy": cand.accuracy, "low": cand.low, "high": cand.high, "n": float(cand.n),
               "correct": float(cand.correct)}  # fmt: skip
    baseline = {"accuracy": base.accuracy, "low": base.low, "high": base.high, "n": float(base.n),
                "correct": float(base.correct)}  # fmt: skip
    passed = rule.judge(rule.pool([figures]), baseline) is not Outcome.FAIL
    bound = f"recall_drop (Wilson 95% intervals overlap; margin {margin:g})"
    detail = (
        f"recall {cand.correct}/{cand.n} = {cand.accuracy:.3f} (95% {cand.low:.3f}-{cand.high:.3f}) against the "
        f"recorded {base.correct}/{base.n} = {base.accuracy:.3f} (95% {base.low:.3f}-{base.high:.3f}); "
        f"{len(comparison.changed)} answer(s) changed"
    )
    message = detail if passed else f"regression: {detail}"
    value = comparison.drop if not math.isnan(comparison.drop) else 0.0
    return [Check("recall.drop", "recall", value, bound, passed, message)]


def junit_xml(result: GateResult) -> str:
    """JUnit XML (one test case per check) that CI systems show as tests."""
    failures = len(result.failures())
    suite = ET.Element(
        "testsuite", name="speedtrap check", tests=str(len(result.checks)), failures=str(failures), errors="0",
        skipped="0", time=f"{result.elapsed_s:.3f}",
    )  # fmt: skip
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="recording", value=result.recording)
    ET.SubElement(props, "property", name="target", value=redact_url(result.target))
    for note in result.notes:
        ET.SubElement(props, "property", name="note", value=note)
    for check in result.checks:
        case = ET.SubElement(suite, "testcase", classname=f"speedtrap.check.{check.probe}", name=check.name, time="0")
        if not check.passed:
            failure = ET.SubElement(case, "failure", message=check.message, type="regression")
            failure.text = f"{check.name} = {check.value!r}; bound {check.bound}"
        else:
            out = ET.SubElement(case, "system-out")
            out.text = check.message
    root = ET.Element("testsuites", tests=str(len(result.checks)), failures=str(failures), errors="0")
    root.append(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
