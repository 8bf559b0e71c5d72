"""The report's view of isolation (the search's trial log) and localization (layers, scale exponents)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speedtrap._shapes import CulpritSet, LayerGrowth
from speedtrap.report._model import InteractionNote, _f, _strs

# -- isolation ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRow:
    """One trial of the search: a configuration probed once (a server launch for server targets)."""

    index: int
    config: tuple[str, ...]
    repeat: int
    status: str  # ok | failed
    outcome: str | None  # pass | fail | near (None when the trial failed to run)
    figures: dict[str, float] = field(default_factory=dict)
    probe_s: float = 0.0
    launch_s: float = 0.0
    reused: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "config": list(self.config),
            "repeat": self.repeat,
            "status": self.status,
            "outcome": self.outcome,
            "figures": dict(self.figures),
            "probe_s": self.probe_s,
            "launch_s": self.launch_s,
            "reused": self.reused,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TrialRow:
        figures = {str(k): v for k, v in ((k, _f(v)) for k, v in (d.get("figures") or {}).items()) if v is not None}
        return cls(
            int(d["index"]),
            _strs(d.get("config")),
            int(d.get("repeat", 0)),
            str(d.get("status", "ok")),
            None if d.get("outcome") is None else str(d["outcome"]),
            figures,
            float(d.get("probe_s", 0.0) or 0.0),
            float(d.get("launch_s", 0.0) or 0.0),
            bool(d.get("reused", False)),
            None if d.get("error") is None else str(d["error"]),
        )


@dataclass(frozen=True)
class JudgementRow:
    config: tuple[str, ...]
    verdict: str  # pass | fail | inconclusive | error | skipped
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"config": list(self.config), "verdict": self.verdict, "note": self.note}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JudgementRow:
        return cls(_strs(d.get("config")), str(d["verdict"]), str(d.get("note", "")))


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
    trials: tuple[TrialRow, ...]
    judgements: tuple[JudgementRow, ...] = ()
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
            "trials": [t.to_json() for t in self.trials],
            "judgements": [j.to_json() for j in self.judgements],
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
            tuple(TrialRow.from_json(t) for t in d.get("trials", [])),
            tuple(JudgementRow.from_json(j) for j in d.get("judgements", [])),
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
class ScaleRow:
    """How many times one module applies the scalar: the fitted exponent and its verdict."""

    module: str
    layer: int | None
    exponent: float | None
    times: int | None
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "layer": self.layer,
            "exponent": self.exponent,
            "times": self.times,
            "verdict": self.verdict,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ScaleRow:
        return cls(
            str(d["module"]),
            None if d.get("layer") is None else int(d["layer"]),
            _f(d.get("exponent")),
            None if d.get("times") is None else int(d["times"]),
            str(d.get("verdict", "")),
        )


@dataclass(frozen=True)
class ScaleSection:
    param: str
    nominal: float
    values: tuple[float, ...]
    rows: tuple[ScaleRow, ...]
    exactly_once: bool
    command: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "param": self.param,
            "nominal": self.nominal,
            "values": list(self.values),
            "rows": [r.to_json() for r in self.rows],
            "exactly_once": self.exactly_once,
            "command": self.command,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ScaleSection:
        return cls(
            str(d["param"]),
            float(d.get("nominal", 0.0)),
            tuple(float(v) for v in d.get("values", [])),
            tuple(ScaleRow.from_json(r) for r in d.get("rows", [])),
            bool(d.get("exactly_once", False)),
            str(d.get("command", "")),
        )


@dataclass(frozen=True)
class Localization:
    """One culprit set explained: its layer diff against the baseline and its scale check."""

    patches: tuple[str, ...]
    layers: LayerSection | None = None
    scale: ScaleSection | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "patches": list(self.patches),
            "layers": self.layers.to_json() if self.layers else None,
            "scale": self.scale.to_json() if self.scale else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Localization:
        layers, scale = d.get("layers"), d.get("scale")
        return cls(
            _strs(d.get("patches")),
            LayerSection.from_json(layers) if layers else None,
            ScaleSection.from_json(scale) if scale else None,
        )
