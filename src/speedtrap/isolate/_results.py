"""What isolate reports: trials, each configuration's verdict, culprit sets and interactions.

Every class round-trips through JSON (``to_json`` / ``from_json``); a program reads the JSON, a
person reads :meth:`IsolateResult.summary`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from speedtrap._shapes import CulpritSet as CulpritSet  # shared with the report

Config = tuple[str, ...]  # a configuration: the patch names switched on, sorted


class Outcome(enum.StrEnum):
    """One trial's (or a pooled set of trials') judgement under the verdict rule."""

    PASS = "pass"
    FAIL = "fail"
    NEAR = "near"  # too close to the threshold to call: repeat


class Conclusion(enum.StrEnum):
    """What the search concludes about a configuration (stored as a judgement's ``verdict`` field, under
    the same values as before the rename). Not the spec's ``Verdict``, the rule that judges figures."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"  # still near the threshold after every repeat: never a coin flip
    ERROR = "error"  # the trial could not run (server crashed every attempt): see its log
    SKIPPED = "skipped"  # impossible configuration (two conflicting patches)

    @property
    def bad(self) -> bool:
        """Not a clean pass: the search looks inside such a configuration."""
        return self in (Conclusion.FAIL, Conclusion.INCONCLUSIVE, Conclusion.ERROR)


def _config(value: Any) -> Config:
    return tuple(str(v) for v in value)


@dataclass(frozen=True)
class Trial:
    """One run of the probe on one configuration (one server launch for server targets)."""

    index: int
    config: Config
    repeat: int
    status: str  # "ok" | "failed"
    outcome: Outcome | None  # the rule's call on this trial alone (None when it failed)
    figures: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    log_path: str | None = None
    report_path: str | None = None
    attempts: int = 1
    started: float = 0.0
    finished: float = 0.0
    launch_s: float = 0.0
    probe_s: float = 0.0
    run_id: int = 0
    reused: bool = False  # finished in an earlier run (or before an interruption) and taken from the store
    stopped: str | None = None  # where a sequential divergence probe stopped and why (None: the whole grid)

    def label(self) -> str:
        """``trial N {config}``, as notes name a trial."""
        return f"trial {self.index} " + ("{" + ", ".join(self.config) + "}" if self.config else "(baseline)")

    def to_json(self) -> dict[str, Any]:
        return {
            **({"stopped": self.stopped} if self.stopped else {}),
            "index": self.index,
            "config": list(self.config),
            "repeat": self.repeat,
            "status": self.status,
            "outcome": self.outcome.value if self.outcome else None,
            "figures": dict(self.figures),
            "error": self.error,
            "log_path": self.log_path,
            "report_path": self.report_path,
            "attempts": self.attempts,
            "started": self.started,
            "finished": self.finished,
            "launch_s": self.launch_s,
            "probe_s": self.probe_s,
            "run_id": self.run_id,
            "reused": self.reused,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Trial:
        return cls(
            index=int(d["index"]),
            config=_config(d["config"]),
            repeat=int(d["repeat"]),
            status=str(d["status"]),
            outcome=Outcome(d["outcome"]) if d.get("outcome") else None,
            figures={str(k): float(v) for k, v in d.get("figures", {}).items()},
            error=d.get("error"),
            log_path=d.get("log_path"),
            report_path=d.get("report_path"),
            attempts=int(d.get("attempts", 1)),
            started=float(d.get("started", 0.0)),
            finished=float(d.get("finished", 0.0)),
            launch_s=float(d.get("launch_s", 0.0)),
            probe_s=float(d.get("probe_s", 0.0)),
            run_id=int(d.get("run_id", 0)),
            reused=bool(d.get("reused", False)),
            stopped=d.get("stopped"),
        )


@dataclass(frozen=True)
class Judgement:
    """A configuration's verdict, from one or more trials (repeats pool their figures)."""

    config: Config
    verdict: Conclusion
    figures: dict[str, float] = field(default_factory=dict)  # pooled over the repeats
    trials: tuple[int, ...] = ()  # Trial.index of each trial behind it
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "config": list(self.config),
            "verdict": self.verdict.value,
            "figures": dict(self.figures),
            "trials": list(self.trials),
            "note": self.note,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Judgement:
        return cls(
            config=_config(d["config"]),
            verdict=Conclusion(d["verdict"]),
            figures={str(k): float(v) for k, v in d.get("figures", {}).items()},
            trials=tuple(int(t) for t in d.get("trials", [])),
            note=str(d.get("note", "")),
        )


class InteractionKind(enum.StrEnum):
    JOINT = "joint"  # fail only together: the set fails, each patch of it alone passes
    CANCEL = "cancel"  # each fails without the other, together they pass: correct only together
    MASKED = "masked"  # fails alone, but other patches of the deployment make it pass


@dataclass(frozen=True)
class Interaction:
    kind: InteractionKind
    patches: Config  # every patch involved
    failing: tuple[Config, ...]  # the configurations that fail ...
    passing: tuple[Config, ...]  # ... and the ones that pass, which together show the interaction
    explanation: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "patches": list(self.patches),
            "failing": [list(c) for c in self.failing],
            "passing": [list(c) for c in self.passing],
            "explanation": self.explanation,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Interaction:
        return cls(
            InteractionKind(d["kind"]),
            _config(d["patches"]),
            tuple(_config(c) for c in d["failing"]),
            tuple(_config(c) for c in d["passing"]),
            str(d["explanation"]),
        )


@dataclass(frozen=True)
class PatchRelation:
    """``patch`` requires / conflicts with ``others``: declared in the manifest, or read off the commits."""

    kind: str  # "requires" | "conflicts"
    patch: str
    others: Config
    source: str  # "manifest" | "commits" (found by applying commits on the base, before any launch)
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "patch": self.patch, "others": list(self.others), "source": self.source,
                "why": self.why}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PatchRelation:
        return cls(str(d["kind"]), str(d["patch"]), _config(d["others"]), str(d["source"]), str(d.get("why", "")))


@dataclass(frozen=True)
class CommitPatch:
    """A commit patch as the report shows it: its commits, subject and diff."""

    patch: str
    commits: Config
    subject: str
    diff: str

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.patch, "commits": list(self.commits), "subject": self.subject, "diff": self.diff}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CommitPatch:
        return cls(str(d["patch"]), _config(d.get("commits", [])), str(d.get("subject", "")), str(d.get("diff", "")))


class Status(enum.StrEnum):
    FOUND = "found"  # culprit sets (and/or interactions) found and checked
    BASELINE_FAILS = "baseline_fails"  # the configuration with no patch already fails: nothing to blame
    FULL_PASSES = "full_passes"  # every patch on passes: no regression to isolate
    INCONCLUSIVE = "inconclusive"  # a verdict the search needed stayed near the threshold
    ERROR = "error"  # a trial the search needed could not run


@dataclass(frozen=True)
class IsolateResult:
    status: Status
    message: str
    culprits: tuple[CulpritSet, ...] = ()
    interactions: tuple[Interaction, ...] = ()
    inconclusive: tuple[Config, ...] = ()  # configurations left inconclusive or errored
    searched: Config = ()  # the patches searched, in search order
    ungated: Config = ()  # listed, always on, never toggled
    not_searched: dict[str, str] = field(default_factory=dict)  # patch -> why it was left out
    judgements: tuple[Judgement, ...] = ()  # in the order the search considered them
    trials: tuple[Trial, ...] = ()
    launches: int = 0  # trials this run executed (each one a launch for server targets)
    reused: int = 0  # trials taken from the store instead of run
    rule: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    relations: tuple[PatchRelation, ...] = ()  # relations read off commit patches (requires / conflicts)
    commits: tuple[CommitPatch, ...] = ()  # the commit patches: subject and diff of each

    @property
    def culprit_names(self) -> list[Config]:
        return [c.patches for c in self.culprits]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "message": self.message,
            "culprits": [c.to_json() for c in self.culprits],
            "interactions": [i.to_json() for i in self.interactions],
            "inconclusive": [list(c) for c in self.inconclusive],
            "searched": list(self.searched),
            "ungated": list(self.ungated),
            "not_searched": dict(self.not_searched),
            "judgements": [j.to_json() for j in self.judgements],
            "trials": [t.to_json() for t in self.trials],
            "launches": self.launches,
            "reused": self.reused,
            "rule": dict(self.rule),
            "target": dict(self.target),
            "notes": list(self.notes),
            "relations": [r.to_json() for r in self.relations],
            "commits": [c.to_json() for c in self.commits],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> IsolateResult:
        return cls(
            status=Status(d["status"]),
            message=str(d["message"]),
            culprits=tuple(CulpritSet.from_json(c) for c in d.get("culprits", [])),
            interactions=tuple(Interaction.from_json(i) for i in d.get("interactions", [])),
            inconclusive=tuple(_config(c) for c in d.get("inconclusive", [])),
            searched=_config(d.get("searched", [])),
            ungated=_config(d.get("ungated", [])),
            not_searched={str(k): str(v) for k, v in d.get("not_searched", {}).items()},
            judgements=tuple(Judgement.from_json(j) for j in d.get("judgements", [])),
            trials=tuple(Trial.from_json(t) for t in d.get("trials", [])),
            launches=int(d.get("launches", 0)),
            reused=int(d.get("reused", 0)),
            rule=dict(d.get("rule", {})),
            target=dict(d.get("target", {})),
            notes=tuple(str(n) for n in d.get("notes", [])),
            relations=tuple(PatchRelation.from_json(r) for r in d.get("relations", [])),
            commits=tuple(CommitPatch.from_json(c) for c in d.get("commits", [])),
        )

    def summary(self) -> str:
        """A few lines a person reads."""
        lines = [self.message]
        for c in self.culprits:
            mark = "" if c.confirmed else " (inconclusive)"
            lines.append(f"culprit: {' + '.join(c.patches)}{mark}" + (f" — {c.note}" if c.note else ""))
        for i in self.interactions:
            lines.append(f"interaction ({i.kind.value}): {' + '.join(i.patches)} — {i.explanation}")
        for cfg in self.inconclusive:
            lines.append(f"inconclusive: {{{', '.join(cfg)}}}")
        for r in self.relations:
            lines.append(f"relation: {r.patch} {r.kind} {' + '.join(r.others)} ({r.source}: {r.why})")
        lines.append(f"trials run: {self.launches}, reused from the store: {self.reused}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)
