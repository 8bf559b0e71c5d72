"""One bound on a metric, with one rule for where its value comes from.

``Bound.resolve``: an explicit bound wins; else a noise floor derives it (``floor + max(margin,
floor)``, see ``speedtrap.probe.NoiseFloor``); else the default, ``worst.kl_p99 <= 0.1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from speedtrap._errors import UsageError
from speedtrap.spec._metric import Polarity, polarity

Op = Literal["<=", ">="]
_TEXT = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(<=|>=)\s*([-+0-9.eE]+|inf)\s*$")
DEFAULT_MARGIN = 0.1  # nats: the floor-derived bound's margin, and the fixed default's value


class Floor(Protocol):
    """A measured noise floor (``speedtrap.probe.NoiseFloor``): what derives a bound."""

    def bound(self, metric: str = ..., margin: float = ...) -> float: ...

    def describe(self, metric: str = ..., margin: float = ...) -> str: ...


@dataclass(frozen=True)
class Bound:
    """``metric <= value`` (fails above) or ``metric >= value`` (fails below); ``origin`` says where it came from."""

    metric: str
    op: Op
    value: float
    origin: str = ""

    @classmethod
    def parse(cls, text: str, key: str = "--bound") -> Bound:
        m = _TEXT.match(text)
        if not m:
            raise UsageError(
                f"{key} {text!r} is not METRIC<=VALUE or METRIC>=VALUE", f"pass e.g. {key} {DEFAULT_BOUND}"
            )
        try:
            value = float(m.group(3))
        except ValueError:
            raise UsageError(f"{key} {text!r}: {m.group(3)!r} is not a number", "pass a number") from None
        op: Op = "<=" if m.group(2) == "<=" else ">="
        return cls(m.group(1), op, value, f"the explicit {key}")

    @classmethod
    def of(cls, metric: str, value: float, direction: Polarity | None = None, origin: str = "") -> Bound:
        """The bound on ``metric`` failing the way the registry says (or ``direction``, for a figure it lacks)."""
        fails = direction or polarity(metric)
        return cls(metric, "<=" if fails == "above" else ">=", value, origin)

    @classmethod
    def from_floor(cls, floor: Floor, metric: str = "worst.kl_p99", margin: float = DEFAULT_MARGIN) -> Bound:
        if polarity(metric, "above") != "above":
            raise UsageError(f"a noise floor bounds a figure that fails above, not {metric!r}", "pass --bound")
        return cls(metric, "<=", floor.bound(metric, margin), floor.describe(metric, margin))

    @classmethod
    def resolve(
        cls,
        explicit: Bound | None = None,
        floor: Floor | None = None,
        metric: str | None = None,
        margin: float = DEFAULT_MARGIN,
    ) -> Bound:
        """The one rule: an explicit bound wins; else the floor's (on ``metric``); else the default."""
        if explicit is not None:
            return explicit
        if floor is not None:
            return cls.from_floor(floor, metric or DEFAULT_BOUND.metric, margin)
        if metric is not None and metric != DEFAULT_BOUND.metric:
            raise UsageError(f"no bound for {metric!r}", f"pass --bound {metric}<=VALUE or a noise floor")
        return DEFAULT_BOUND

    @property
    def direction(self) -> Polarity:
        """Which way the figure fails: ``above`` for ``<=``, ``below`` for ``>=``."""
        return "above" if self.op == "<=" else "below"

    def fails(self, value: float) -> bool:
        if value != value:  # NaN: a broken model
            return True
        return value > self.value if self.op == "<=" else value < self.value

    def with_origin(self, origin: str) -> Bound:
        return replace(self, origin=origin)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


DEFAULT_BOUND = Bound("worst.kl_p99", "<=", DEFAULT_MARGIN, "the default bound")
