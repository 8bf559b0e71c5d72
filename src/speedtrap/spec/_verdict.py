"""When a configuration fails: a threshold on a metric, or a recall drop judged with Wilson intervals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from speedtrap.spec._bound import DEFAULT_BOUND, Bound

RULES = ("threshold", "recall_drop")
Rule = Literal["threshold", "recall_drop"]


@dataclass(frozen=True)
class Verdict:
    """The manifest's ``[verdict]``: ``rule`` over ``metric`` against ``bound`` failing ``direction``.

    The default is ``DEFAULT_BOUND`` (``worst.kl_p99 <= 0.1``), the same as ``check --against``'s.
    ``near`` is a relative band around the bound in which a configuration is measured again;
    ``repeats`` how many times at most; ``margin`` (recall_drop) an extra drop needed. ``sequential``
    asks a recall probe's questions in rounds against the baseline and stops each length once the
    verdict is decided: ``alpha`` is the chance of calling a length lost that keeps its facts, ``beta``
    the chance of calling one kept that loses half of them (``speedtrap.probe._sequential``); it also lets
    isolate's divergence trials stop after their prefill round once no decode can change the verdict (exact:
    ``speedtrap.probe._divergence_stop``).
    """

    rule: str = "threshold"
    metric: str = DEFAULT_BOUND.metric
    bound: float = DEFAULT_BOUND.value
    direction: str = DEFAULT_BOUND.direction
    near: float = 0.25
    repeats: int = 2
    margin: float = 0.0  # recall_drop: extra drop (absolute) needed on top of non-overlapping intervals
    origin: str = ""  # how the bound was chosen when not given (e.g. derived from a noise floor)
    alpha: float = 0.05  # sequential: the false-alarm rate (a configuration that keeps its facts called lost)
    beta: float = 0.2  # sequential: the miss rate (one that loses half its facts or more called kept)
    sequential: bool = True  # ask the probe in rounds and stop once the verdict is decided (recall, divergence)

    @classmethod
    def of_bound(cls, bound: Bound, near: float = 0.25, repeats: int = 2, origin: str = "") -> Verdict:
        """A threshold verdict on a ``Bound``."""
        return cls("threshold", bound.metric, bound.value, bound.direction, near, repeats, 0.0, origin)

    @property
    def threshold(self) -> Bound:
        """The threshold rule's bound as a ``Bound``."""
        return Bound.of(self.metric, self.bound, "above" if self.direction == "above" else "below", self.origin)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "metric": self.metric,
            "bound": self.bound,
            "direction": self.direction,
            "near": self.near,
            "repeats": self.repeats,
            "margin": self.margin,
        }
        if self.origin:
            out["origin"] = self.origin
        if (self.alpha, self.beta, self.sequential) != (0.05, 0.2, True):  # the defaults read as before
            out.update(alpha=self.alpha, beta=self.beta, sequential=self.sequential)
        return out
