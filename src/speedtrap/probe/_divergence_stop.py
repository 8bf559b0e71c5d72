"""An exact early stop for divergence verdicts: stop measuring once the rest of the grid cannot change it.

No statistics and no error rate: the probe stops only when the verdict over the *whole* grid is already
fixed by the positions measured, whatever the positions not measured turn out to be.

A phase's figure is read over its positions' values. With ``n`` values seen, ``c`` of them above the bound,
and ``M_max`` the most positions the grid can still give that phase (prefill: the sequences' lengths;
decode: ``decode_tokens`` per sequence, fewer where a greedy decode stops at the first differing token), the
final phase holds ``M`` values for some ``M`` in ``n..M_max``, the unseen ones anything at all (KL >= 0).

- **Quantile** ``q`` (``kl_median`` 0.5, ``kl_p90`` 0.9, ``kl_p99`` 0.99, ``kl_max`` 1; numpy-linear, see
  :func:`speedtrap.probe._stats.quantile`). With ``lo = floor(q (M - 1))`` the quantile lies between the sorted
  values ``s[lo]`` and ``s[lo + 1]``, so it is at least ``s[lo]``; ``s[lo]`` is above the bound exactly when at
  least ``M - lo`` values are. Unseen values only add to the count, so ``c >= M - floor(q (M - 1))`` makes the
  quantile above the bound for that ``M``. The need ``f(M) = M - floor(q (M - 1))`` is non-decreasing in ``M``:
  ``f(M + 1) - f(M) = 1 - (floor(q M) - floor(q (M - 1)))`` and the two floors differ by 0 or 1 since
  ``0 <= q <= 1``. So the condition holds for every ``M`` in ``n..M_max`` exactly when it holds at ``M_max``:
  decided "fails" iff ``c >= M_max - floor(q (M_max - 1))``. (A quantile that is above the bound only through the
  interpolation towards ``s[lo + 1]`` is not decided early: conservative, never wrong.)
- **Mean** (``kl_mean``): KL is never negative, so the final mean is at least ``sum_seen / M`` >= ``sum_seen /
  M_max``; decided "fails" when that is above the bound.
- **Share below** (``same_top1``, failing below the bound): with ``s`` of the ``n`` seen positions agreeing, the
  final share is at most ``(s + M - n) / M = 1 - (n - s) / M``, increasing in ``M``; decided "fails" when even
  ``(s + M_max - n) / M_max`` is below the bound.
- ``worst.X`` is the worse of the phases: decided "fails" once any phase is.

A **pass** is decided only when nothing remains: a 99th percentile under a bound cannot be decided early without
assumptions about the positions not measured (one more sequence of large KL would raise it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

QUANTILES = {"kl_median": 0.5, "kl_p90": 0.9, "kl_p99": 0.99, "kl_max": 1.0}
STOP_STATS = (*QUANTILES, "kl_mean", "same_top1")


def quantile_need(q: float, m_max: int) -> int:
    """How many of at most ``m_max`` values must be above a bound for the q-quantile to be above it, whatever
    the final count (``n..m_max``) and the values not seen."""
    return m_max - math.floor(q * (m_max - 1)) if m_max > 0 else 1


def phase_fails(stat: str, bound: float, kl: Sequence[float], same: Sequence[bool], m_max: int) -> bool:
    """Whether ``stat`` over a phase whose seen values are ``kl``/``same`` (at most ``m_max`` positions in all)
    is decided to fail ``bound`` (above it; ``same_top1``: below it) whatever the unseen positions give."""
    m_max = max(m_max, len(kl))
    if m_max == 0:
        return False
    if stat in QUANTILES:
        return sum(1 for v in kl if v > bound) >= quantile_need(QUANTILES[stat], m_max)
    if stat == "kl_mean":
        return math.fsum(kl) / m_max > bound
    if stat == "same_top1":
        return (sum(same) + m_max - len(same)) / m_max < bound
    return False


@dataclass(frozen=True)
class DivergenceGoal:
    """The verdict a divergence probe may stop on: ``metric`` (``PHASE.STAT`` or ``worst.STAT``) failing
    ``direction`` of ``bound``."""

    metric: str
    bound: float
    direction: str = "above"

    @classmethod
    def of(cls, metric: str, bound: float, direction: str) -> DivergenceGoal | None:
        """The goal, or None where the metric is not one the stop can decide (then the grid runs in full)."""
        phase, _, stat = metric.partition(".")
        if phase not in ("prefill", "decode", "worst") or stat not in STOP_STATS:
            return None
        if (stat == "same_top1") != (direction == "below"):
            return None
        return cls(metric, float(bound), direction)

    @property
    def stat(self) -> str:
        return self.metric.partition(".")[2]

    def phases(self) -> tuple[str, ...]:
        phase = self.metric.partition(".")[0]
        return ("prefill", "decode") if phase == "worst" else (phase,)

    def decided(self, seen: dict[str, tuple[list[float], list[bool]]], most: dict[str, int]) -> str | None:
        """The phase whose seen positions already decide "fails" (``seen``: phase -> KL values and same-top-1
        flags; ``most``: phase -> the most positions it can have), or None."""
        for phase in self.phases():
            kl, same = seen.get(phase, ([], []))
            if phase_fails(self.stat, self.bound, kl, same, most.get(phase, len(kl))):
                return phase
        return None

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "bound": self.bound, "direction": self.direction}


def stop_sentence(goal: DivergenceGoal, phase: str, kl: Sequence[float], same: Sequence[bool], most: int) -> str:
    """Why the rest of the grid cannot change the verdict, in figures."""
    stat = goal.stat
    if stat in QUANTILES:
        above = sum(1 for v in kl if v > goal.bound)
        return (
            f"{above} of at most {most} {phase} positions above {goal.bound:g} (the {stat} needs "
            f"{quantile_need(QUANTILES[stat], most)}): {goal.metric} is above the bound whatever the rest gives"
        )
    if stat == "kl_mean":
        return (
            f"the KL summed over {len(kl)} {phase} positions is {math.fsum(kl):.4g}, above {goal.bound:g} x {most} "
            f"positions at most: {goal.metric} is above the bound whatever the rest gives"
        )
    return (
        f"{len(same) - sum(same)} of at most {most} {phase} positions change the top-1 token: {goal.metric} is "
        f"below {goal.bound:g} whatever the rest gives"
    )
