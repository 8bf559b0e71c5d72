"""Verdict rules: from a configuration's figures (pooled over repeats) to pass, fail or near.

- ``threshold``: a figure against a bound (``worst.kl_p99 > 0.1`` fails); within a relative band
  ``near`` around the bound the call is "near" and the configuration is measured again; the band
  narrows as 1/sqrt(trials) as repeats are pooled (the standard error of their mean).
- ``recall_drop``: recall below the baseline's with non-overlapping Wilson 95% intervals fails; a
  recall below the baseline's interval while the intervals still overlap is "near".
Repeats pool: a threshold rule averages the figure, a recall rule adds up correct answers and
questions (so the interval narrows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from speedtrap._errors import ProbeError
from speedtrap._stats import wilson
from speedtrap.isolate._results import Outcome
from speedtrap.manifest import VerdictSpec
from speedtrap.spec import Bound

Figures = Mapping[str, float]
_Z95 = 1.959963984540054


class Rule(Protocol):
    needs_baseline: ClassVar[bool]  # whether judge() compares with the baseline's figures

    def pool(self, trials: Sequence[Figures]) -> dict[str, float]: ...

    def judge(self, pooled: Figures, baseline: Figures | None) -> Outcome: ...

    def to_json(self) -> dict[str, Any]: ...


def _figure(figures: Figures, name: str) -> float:
    if name not in figures:
        raise ProbeError(
            f"the probe reported no figure {name!r} (it reported: {', '.join(sorted(figures)) or 'none'})",
            "set verdict.metric to one of the reported figures",
        )
    return float(figures[name])


@dataclass(frozen=True)
class ThresholdRule:
    needs_baseline: ClassVar[bool] = False
    metric: str
    bound: float
    direction: str = "above"  # "above": fails when the figure is above the bound
    near: float = 0.25
    origin: str = ""  # how the bound was chosen, when derived (e.g. from a noise floor)

    @classmethod
    def of_bound(cls, bound: Bound, near: float = 0.0) -> ThresholdRule:
        """The rule judging one ``Bound`` (no band unless ``near``)."""
        return cls(bound.metric, bound.value, bound.direction, near, bound.origin)

    def band(self, repeats: int = 1) -> tuple[float, float]:
        """The "near" band around the bound; it narrows as 1/sqrt(repeats), like the error of a mean."""
        half = abs(self.bound) * self.near / math.sqrt(max(1, repeats))
        return self.bound - half, self.bound + half

    def pool(self, trials: Sequence[Figures]) -> dict[str, float]:
        values = [_figure(t, self.metric) for t in trials]
        pooled = {k: float(v) for k, v in trials[-1].items()}
        pooled[self.metric] = sum(values) / len(values)
        pooled["repeats"] = float(len(values))
        return pooled

    def judge(self, pooled: Figures, baseline: Figures | None) -> Outcome:
        value = _figure(pooled, self.metric)
        if math.isnan(value):
            return Outcome.FAIL  # a probe that measured NaN saw a broken model
        low, high = self.band(int(pooled.get("repeats", 1)))
        if self.direction == "above":
            if value > high or (self.near == 0 and value > self.bound):
                return Outcome.FAIL
            return Outcome.PASS if value < low or self.near == 0 else Outcome.NEAR
        if value < low or (self.near == 0 and value < self.bound):
            return Outcome.FAIL
        return Outcome.PASS if value > high or self.near == 0 else Outcome.NEAR

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": "threshold",
            "metric": self.metric,
            "bound": self.bound,
            "direction": self.direction,
            "near": self.near,
            **({"origin": self.origin} if self.origin else {}),
        }


@dataclass(frozen=True)
class RecallDropRule:
    """Recall below the baseline's, with non-overlapping Wilson intervals (plus an optional margin)."""

    needs_baseline: ClassVar[bool] = True
    margin: float = 0.0

    def pool(self, trials: Sequence[Figures]) -> dict[str, float]:
        correct = sum(_figure(t, "correct") for t in trials)
        n = sum(_figure(t, "n") for t in trials)
        low, high = wilson(correct, n)
        return {
            "correct": correct,
            "n": n,
            "accuracy": correct / n if n else 0.0,
            "low": low,
            "high": high,
            "repeats": float(len(trials)),
        }

    def judge(self, pooled: Figures, baseline: Figures | None) -> Outcome:
        if baseline is None:
            return Outcome.PASS  # the baseline is the reference
        acc, high = pooled["accuracy"], pooled["high"]
        b_acc, b_low = baseline["accuracy"], baseline["low"]
        if high < b_low and b_acc - acc > self.margin:
            return Outcome.FAIL
        if acc >= b_low:  # within (or above) the baseline's interval: no sign of a drop
            return Outcome.PASS
        return Outcome.NEAR  # below the baseline's interval, but the intervals still overlap

    def to_json(self) -> dict[str, Any]:
        return {"rule": "recall_drop", "margin": self.margin}


def rule_from_spec(spec: VerdictSpec) -> Rule:
    if spec.rule == "recall_drop":
        return RecallDropRule(spec.margin)
    return ThresholdRule(spec.metric, spec.bound, spec.direction, spec.near, spec.origin)
