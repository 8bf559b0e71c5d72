"""The metric registry: every figure a judge or a figure reads, with its phase, unit and polarity.

Polarity says which way is worse: ``"above"`` (the figure fails when it rises: a KL) or
``"below"`` (it fails when it falls: an accuracy, a share of equal argmaxes). Judges read it
instead of guessing from a name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from speedtrap._errors import UsageError

Polarity = Literal["above", "below"]  # fails when the figure is above (or below) its bound
POLARITIES: tuple[Polarity, ...] = ("above", "below")
PHASES = ("prefill", "decode", "worst")  # divergence's phases; "worst" is the worse of the two


@dataclass(frozen=True)
class Metric:
    """One figure: ``decode.kl_p99`` is the statistic ``kl_p99`` of the phase ``decode``."""

    stat: str
    unit: str
    polarity: Polarity
    summary: str
    probe: str = "divergence"  # the probe that reports it
    phase: str | None = None  # None: a figure without phases (recall's), or the statistic alone

    @property
    def name(self) -> str:
        return f"{self.phase}.{self.stat}" if self.phase else self.stat

    def worse(self, a: float, b: float) -> float:
        """The worse of two values (the ``worst`` phase's rule)."""
        return max(a, b) if self.polarity == "above" else min(a, b)


# The statistics, by probe. A divergence statistic exists per phase (``prefill.``, ``decode.``,
# ``worst.``); recall's have none.
_STATS: tuple[Metric, ...] = (
    Metric("kl_mean", "nats", "above", "mean KL(baseline || candidate) over positions"),
    Metric("kl_median", "nats", "above", "median KL over positions"),
    Metric("kl_p90", "nats", "above", "90th percentile of KL over positions"),
    Metric("kl_p99", "nats", "above", "99th percentile of KL over positions"),
    Metric("kl_max", "nats", "above", "largest KL of a position"),
    Metric("same_top1", "fraction", "below", "share of positions whose argmax is the baseline's"),
    Metric("rms_dp", "probability", "above", "RMS change of the correct token's probability"),
    Metric("tokens", "positions", "below", "positions compared"),
    Metric("accuracy", "fraction", "below", "share of planted facts recalled", probe="recall"),
    Metric("low", "fraction", "below", "Wilson 95% interval's lower end of recall", probe="recall"),
    Metric("high", "fraction", "below", "Wilson 95% interval's upper end of recall", probe="recall"),
    Metric("correct", "answers", "below", "answers that recalled the fact", probe="recall"),
    Metric("n", "answers", "below", "questions asked", probe="recall"),
    Metric("drop", "fraction", "above", "recall lost against the baseline", probe="recall"),
)
STATS: dict[str, Metric] = {m.stat: m for m in _STATS}
# The divergence figures reduced to a ``worst.`` phase (the worse of prefill and decode).
WORST_STATS = ("kl_p99", "kl_mean", "same_top1")


def metric(name: str) -> Metric:
    """The registered metric ``name`` (``worst.kl_p99``, ``decode.same_top1``, ``accuracy``, ``recall.drop``)."""
    phase, _, stat = name.rpartition(".")
    known = STATS.get(stat)
    if (
        known is None
        or (phase and known.probe == "divergence" and phase not in (*PHASES, "overall"))
        or (phase and known.probe == "recall" and phase != "recall")
    ):
        raise UsageError(
            f"unknown metric {name!r}",
            f"use one of: {', '.join(metric_names())} (or set the direction for a command probe's own figure)",
        )
    return Metric(known.stat, known.unit, known.polarity, known.summary, known.probe, phase or None)


def is_known(name: str) -> bool:
    try:
        metric(name)
    except UsageError:
        return False
    return True


def polarity(name: str, default: Polarity | None = None) -> Polarity:
    """Which way ``name`` is worse; a figure outside the registry (a command probe's own) takes ``default``."""
    if default is not None and not is_known(name):
        return default
    return metric(name).polarity


def metric_names() -> list[str]:
    """Every registered name a verdict or a ``--bound`` can read."""
    out = []
    for m in _STATS:
        if m.probe == "divergence":
            out += [f"{phase}.{m.stat}" for phase in PHASES if phase != "worst" or m.stat in WORST_STATS]
        else:
            out.append(m.stat)
    return out
