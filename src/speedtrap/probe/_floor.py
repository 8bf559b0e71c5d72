"""The noise floor: how far two measurements of one configuration differ, and the bound it implies.

A verdict bound has to sit above the stack's own noise: on CPU two launches of one configuration
agree exactly, while a GPU server in bf16 with batching varies from request to request. The floor
is measured by ``speedtrap probe repeat`` (identical requests sent again, alone and inside a
concurrent batch); :meth:`NoiseFloor.bound` turns it into a verdict bound:

    bound = floor + max(margin, floor)      (floor: the same statistic, e.g. kl_p99, of the floor)

so a figure fails only when it is more than ``margin`` nats above the floor *and* more than twice
the floor. On a deterministic stack (floor 0) that is ``margin``, the fixed default of before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speedtrap._errors import UsageError
from speedtrap.probe._stats import KLStats
from speedtrap.spec import DEFAULT_MARGIN as DEFAULT_MARGIN
from speedtrap.spec import metric, metric_names

KL_FIGURES = tuple(m.stat for m in map(metric, metric_names()) if m.unit == "nats" and m.phase == "decode")


@dataclass(frozen=True)
class NoiseFloor:
    """The stack's own run-to-run divergence, measured on identical teacher-forced requests.

    ``overall`` pools the comparisons that count as noise; ``repeat`` is first vs second identical
    request (each sent alone), ``batch`` is alone vs inside a concurrent batch. ``excluded`` names a
    comparison left out of ``overall`` because it is a finding, not noise (see RepeatReport).
    """

    overall: KLStats
    repeat: KLStats
    batch: KLStats
    exact: bool  # full distributions (in-process); False: a server's top-k logprobs
    source: str  # the backend measured
    excluded: tuple[str, ...] = ()
    note: str = field(default="")

    def value(self, metric: str) -> float:
        """The floor of a verdict figure: ``worst.kl_p99`` / ``prefill.kl_p99`` / ``kl_p99`` -> overall.kl_p99."""
        stat = metric.rsplit(".", 1)[-1]
        if stat not in KL_FIGURES:
            raise UsageError(
                f"a noise floor has no figure for {metric!r}", f"use a KL figure ({', '.join(KL_FIGURES)}) or --bound"
            )
        return float(getattr(self.overall, stat))

    def bound(self, metric: str = "worst.kl_p99", margin: float = DEFAULT_MARGIN) -> float:
        floor = self.value(metric)
        return floor + max(margin, floor)

    def describe(self, metric: str = "worst.kl_p99", margin: float = DEFAULT_MARGIN) -> str:
        floor = self.value(metric)
        return (
            f"bound {self.bound(metric, margin):.4g} derived from the noise floor of {self.source} "
            f"({metric.rsplit('.', 1)[-1]} {floor:.4g} + max({margin:g}, {floor:.4g}))"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_json(),
            "repeat": self.repeat.to_json(),
            "batch": self.batch.to_json(),
            "exact": self.exact,
            "source": self.source,
            "excluded": list(self.excluded),
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NoiseFloor:
        return cls(
            overall=KLStats.from_json(data["overall"]),
            repeat=KLStats.from_json(data["repeat"]),
            batch=KLStats.from_json(data["batch"]),
            exact=bool(data["exact"]),
            source=str(data["source"]),
            excluded=tuple(str(x) for x in data.get("excluded", [])),
            note=str(data.get("note", "")),
        )
