"""Statistics of the probes: Wilson intervals, quantiles and the KL summary of a set of positions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, interpolating linearly between ranks (numpy's default)."""
    if not sorted_values:
        return 0.0
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class KLStats:
    """llama.cpp ``--kl-divergence``-style summary of positions: KL(baseline || candidate) in nats."""

    kl_mean: float
    kl_median: float
    kl_p90: float
    kl_p99: float
    kl_max: float
    same_top1: float  # share of positions whose argmax is the same
    rms_dp: float  # RMS of the change of the correct token's probability
    tokens: int

    @classmethod
    def of(cls, kl: Sequence[float], same: Sequence[bool], dp: Sequence[float]) -> KLStats:
        if not kl:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0)
        ordered = sorted(kl)
        return cls(
            kl_mean=math.fsum(ordered) / len(ordered),
            kl_median=quantile(ordered, 0.5),
            kl_p90=quantile(ordered, 0.9),
            kl_p99=quantile(ordered, 0.99),
            kl_max=ordered[-1],
            same_top1=sum(same) / len(same) if same else 1.0,
            rms_dp=math.sqrt(math.fsum(d * d for d in dp) / len(dp)) if dp else 0.0,
            tokens=len(ordered),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KLStats:
        return cls(
            kl_mean=float(data["kl_mean"]),
            kl_median=float(data["kl_median"]),
            kl_p90=float(data["kl_p90"]),
            kl_p99=float(data["kl_p99"]),
            kl_max=float(data["kl_max"]),
            same_top1=float(data["same_top1"]),
            rms_dp=float(data["rms_dp"]),
            tokens=int(data["tokens"]),
        )


@dataclass(frozen=True)
class PositionStat:
    """One compared position: the index of the token it predicts, KL, same argmax, change of p(correct)."""

    position: int
    kl: float
    same_top1: bool
    dp: float | None  # None where neither side knows the correct token's probability


def summarize(stats: Sequence[PositionStat]) -> KLStats:
    return KLStats.of([s.kl for s in stats], [s.same_top1 for s in stats], [s.dp for s in stats if s.dp is not None])
