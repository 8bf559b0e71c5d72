"""The report's view of isolation (the search's trial log) and localization (layers, scale exponents).

Trials, judgements and scale units are the stages' own types (``speedtrap.isolate.Trial``,
``Judgement``, ``speedtrap.localize.ScaleUnit``), read with their own ``from_json``; the report keeps
and writes the fields it shows (``TRIAL_SHOWN`` ...). Importing them loads only the stages' result
modules (their packages load the rest on first use)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from speedtrap._shapes import CulpritSet, LayerGrowth
from speedtrap.isolate import Judgement, Trial
from speedtrap.localize import ScaleUnit
from speedtrap.report._model import InteractionNote, _f, _strs

# -- isolation ----------------------------------------------------------------------------------


TRIAL_SHOWN = ("index", "config", "repeat", "status", "outcome", "figures", "probe_s", "launch_s", "reused", "error")
JUDGEMENT_SHOWN = ("config", "verdict", "note")
SCALE_SHOWN = ("module", "layer", "exponent", "times", "verdict", "sites")


def _shown(doc: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The fields of a stage's JSON the report shows (and writes), in its order."""
    return {k: doc[k] for k in keys if k in doc}


def shown_trial(doc: Mapping[str, Any]) -> Trial:
    """isolate's own ``Trial`` from its JSON, with the fields the report shows; a figure that is not a
    finite number is left out (JSON has no NaN), a missing time is 0."""
    d = _shown(doc, TRIAL_SHOWN)
    d["figures"] = {str(k): v for k, v in ((k, _f(v)) for k, v in (d.get("figures") or {}).items()) if v is not None}
    d.setdefault("repeat", 0)
    d.setdefault("status", "ok")
    d["probe_s"], d["launch_s"] = float(d.get("probe_s") or 0.0), float(d.get("launch_s") or 0.0)
    d["error"] = None if d.get("error") is None else str(d["error"])
    return Trial.from_json(d)


def shown_judgement(doc: Mapping[str, Any]) -> Judgement:
    """isolate's own ``Judgement`` from its JSON, with the fields the report shows."""
    return Judgement.from_json(_shown(doc, JUDGEMENT_SHOWN))


def shown_scale_unit(doc: Mapping[str, Any]) -> ScaleUnit:
    """localize's own ``ScaleUnit`` from its JSON, with the fields the report shows (a non-finite
    exponent is None)."""
    d = _shown(doc, SCALE_SHOWN)
    d["exponent"] = _f(d.get("exponent"))
    d.setdefault("verdict", "")
    return ScaleUnit.from_json(d)


@dataclass(frozen=True)
class CommitRow:
    """A commit patch next to its verdict: commits, subject, diff, and what the search concluded."""

    patch: str
    commits: tuple[str, ...]
    subject: str
    diff: str
    verdict: str  # culprit | cleared | not searched: ... | no verdict (...)
    relations: tuple[str, ...] = ()  # "requires x (read off the commits)", ...

    def to_json(self) -> dict[str, Any]:
        return {
            "patch": self.patch,
            "commits": list(self.commits),
            "subject": self.subject,
            "diff": self.diff,
            "verdict": self.verdict,
            "relations": list(self.relations),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CommitRow:
        return cls(
            str(d["patch"]), _strs(d.get("commits")), str(d.get("subject", "")), str(d.get("diff", "")),
            str(d.get("verdict", "")), _strs(d.get("relations")),
        )  # fmt: skip


@dataclass(frozen=True)
class IsolationSection:
    status: str  # found | baseline_fails | full_passes | inconclusive | error | incomplete
    message: str
    searched: tuple[str, ...]
    rule: str  # the verdict rule in words: "fail when worst.kl_p99 > 1"
    metric: str  # the figure the rule reads (for the trial log's column)
    bound: float | None
    culprits: tuple[CulpritSet, ...]
    interactions: tuple[InteractionNote, ...]
    trials: tuple[Trial, ...]
    judgements: tuple[Judgement, ...] = ()
    launches: int = 0
    reused: int = 0
    notes: tuple[str, ...] = ()
    command: str = ""
    commits: tuple[CommitRow, ...] = ()  # commit patches (speedtrap init / [[patches]] commit = ...)

    def to_json(self) -> dict[str, Any]:
        return {
            "commits": [c.to_json() for c in self.commits],
            "status": self.status,
            "message": self.message,
            "searched": list(self.searched),
            "rule": self.rule,
            "metric": self.metric,
            "bound": self.bound,
            "culprits": [c.to_json() for c in self.culprits],
            "interactions": [i.to_json() for i in self.interactions],
            "trials": [_shown(t.to_json(), TRIAL_SHOWN) for t in self.trials],
            "judgements": [_shown(j.to_json(), JUDGEMENT_SHOWN) for j in self.judgements],
            "launches": self.launches,
            "reused": self.reused,
            "notes": list(self.notes),
            "command": self.command,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> IsolationSection:
        return cls(
            str(d["status"]),
            str(d.get("message", "")),
            _strs(d.get("searched")),
            str(d.get("rule", "")),
            str(d.get("metric", "")),
            _f(d.get("bound")),
            tuple(CulpritSet.from_json(c) for c in d.get("culprits", [])),
            tuple(InteractionNote.from_json(i) for i in d.get("interactions", [])),
            tuple(shown_trial(t) for t in d.get("trials", [])),
            tuple(shown_judgement(j) for j in d.get("judgements", [])),
            int(d.get("launches", 0)),
            int(d.get("reused", 0)),
            _strs(d.get("notes")),
            str(d.get("command", "")),
            tuple(CommitRow.from_json(c) for c in d.get("commits", [])),
        )


# -- localization -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerSection:
    """Where the patched run first departs from the baseline, and how the error grows layer by layer."""

    first_divergent: str | None
    first_divergent_layer: int | None
    first_rel_diff: float | None
    threshold: float
    tokens: int
    modules_compared: int
    modules_over_threshold: int
    growth: tuple[LayerGrowth, ...]
    command: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "first_divergent": self.first_divergent,
            "first_divergent_layer": self.first_divergent_layer,
            "first_rel_diff": self.first_rel_diff,
            "threshold": self.threshold,
            "tokens": self.tokens,
            "modules_compared": self.modules_compared,
            "modules_over_threshold": self.modules_over_threshold,
            "growth": [g.to_json() for g in self.growth],
            "command": self.command,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LayerSection:
        layer = d.get("first_divergent_layer")
        return cls(
            None if d.get("first_divergent") is None else str(d["first_divergent"]),
            None if layer is None else int(layer),
            _f(d.get("first_rel_diff")),
            float(d.get("threshold", 0.0)),
            int(d.get("tokens", 0)),
            int(d.get("modules_compared", 0)),
            int(d.get("modules_over_threshold", 0)),
            tuple(LayerGrowth.from_json(g) for g in d.get("growth", [])),
            str(d.get("command", "")),
        )


@dataclass(frozen=True)
class ScaleSection:
    param: str
    nominal: float
    values: tuple[float, ...]
    rows: tuple[ScaleUnit, ...]
    exactly_once: bool
    command: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "param": self.param,
            "nominal": self.nominal,
            "values": list(self.values),
            "rows": [_shown(r.to_json(), SCALE_SHOWN) for r in self.rows],
            "exactly_once": self.exactly_once,
            "command": self.command,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ScaleSection:
        return cls(
            str(d["param"]),
            float(d.get("nominal", 0.0)),
            tuple(float(v) for v in d.get("values", [])),
            tuple(shown_scale_unit(r) for r in d.get("rows", [])),
            bool(d.get("exactly_once", False)),
            str(d.get("command", "")),
        )


@dataclass(frozen=True)
class Localization:
    """One culprit set explained: its layer diff against the baseline and its scale check."""

    patches: tuple[str, ...]
    layers: LayerSection | None = None
    scale: ScaleSection | None = None
    measured_on: str = ""  # a live localize: which stack, role and mechanism measured it ("" in-process)
    base_scale: ScaleSection | None = None  # a live localize: the scale check of the base configuration

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "patches": list(self.patches),
            "layers": self.layers.to_json() if self.layers else None,
            "scale": self.scale.to_json() if self.scale else None,
        }
        if self.measured_on:  # written only when set: in-process reports keep their exact JSON
            out["measured_on"] = self.measured_on
        if self.base_scale is not None:
            out["base_scale"] = self.base_scale.to_json()
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Localization:
        layers, scale, base = d.get("layers"), d.get("scale"), d.get("base_scale")
        return cls(
            _strs(d.get("patches")),
            LayerSection.from_json(layers) if layers else None,
            ScaleSection.from_json(scale) if scale else None,
            str(d.get("measured_on", "")),
            ScaleSection.from_json(base) if base else None,
        )
