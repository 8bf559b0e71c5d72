"""``ReportData``: everything one report shows, the root of ``report.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speedtrap.report._model import KIND, SCHEMA_VERSION, DivergenceRun, RecallRun, ReportVerdict, TriageSection, _f
from speedtrap.report._stages import IsolationSection, Localization


@dataclass(frozen=True)
class StageInfo:
    name: str  # triage | probes | isolate | localize
    status: str  # done | partial | missing | failed | skipped
    seconds: float | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "seconds": self.seconds, "detail": self.detail}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StageInfo:
        return cls(str(d["name"]), str(d["status"]), _f(d.get("seconds")), str(d.get("detail", "")))


@dataclass(frozen=True)
class RunInfo:
    """Which run the report is about: its directory, target and the command that made it."""

    run_dir: str
    target: str
    command: str
    started: str | None = None  # ISO 8601
    finished: str | None = None
    run_schema_version: int | None = None  # the run directory's own version (run.json)
    stages: tuple[StageInfo, ...] = ()
    title: str = ""  # the model and the stack (served model, engine and version); "" = the target's name

    @property
    def heading(self) -> str:
        """What the page is about: the model and stack where known, else the target."""
        return self.title or self.target or "speedtrap run"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "target": self.target,
            "command": self.command,
            "started": self.started,
            "finished": self.finished,
            "run_schema_version": self.run_schema_version,
            "stages": [s.to_json() for s in self.stages],
            **({"title": self.title} if self.title else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunInfo:
        version = d.get("run_schema_version")
        return cls(
            str(d.get("run_dir", "")),
            str(d.get("target", "")),
            str(d.get("command", "")),
            d.get("started"),
            d.get("finished"),
            None if version is None else int(version),
            tuple(StageInfo.from_json(s) for s in d.get("stages", [])),
            str(d.get("title", "")),
        )


@dataclass(frozen=True)
class MissingPart:
    """A part the report cannot show, why, and the command that would produce it."""

    part: str
    reason: str
    command: str

    def to_json(self) -> dict[str, Any]:
        return {"part": self.part, "reason": self.reason, "command": self.command}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MissingPart:
        return cls(str(d["part"]), str(d["reason"]), str(d.get("command", "")))


@dataclass(frozen=True)
class FigureRef:
    """One figure of the report: its file stem, title, section and the command that reproduces its data."""

    id: str
    title: str
    section: str
    command: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "section": self.section, "command": self.command}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FigureRef:
        return cls(str(d["id"]), str(d["title"]), str(d["section"]), str(d.get("command", "")))


@dataclass(frozen=True)
class ReportData:
    run: RunInfo
    verdict: ReportVerdict
    triage: TriageSection | None = None
    recall: tuple[RecallRun, ...] = ()
    divergence: tuple[DivergenceRun, ...] = ()
    isolation: IsolationSection | None = None
    localization: tuple[Localization, ...] = ()
    figures: tuple[FigureRef, ...] = ()
    missing: tuple[MissingPart, ...] = ()
    notes: tuple[str, ...] = ()
    generated_at: str = ""
    speedtrap_version: str = ""
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema_version": self.schema_version,
            "generated_at": self.generated_at,
            "speedtrap_version": self.speedtrap_version,
            "run": self.run.to_json(),
            "verdict": self.verdict.to_json(),
            "triage": self.triage.to_json() if self.triage else None,
            "recall": [r.to_json() for r in self.recall],
            "divergence": [d.to_json() for d in self.divergence],
            "isolation": self.isolation.to_json() if self.isolation else None,
            "localization": [loc.to_json() for loc in self.localization],
            "figures": [f.to_json() for f in self.figures],
            "missing": [m.to_json() for m in self.missing],
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReportData:
        triage, isolation = d.get("triage"), d.get("isolation")
        return cls(
            run=RunInfo.from_json(d["run"]),
            verdict=ReportVerdict.from_json(d["verdict"]),
            triage=TriageSection.from_json(triage) if triage else None,
            recall=tuple(RecallRun.from_json(r) for r in d.get("recall", [])),
            divergence=tuple(DivergenceRun.from_json(x) for x in d.get("divergence", [])),
            isolation=IsolationSection.from_json(isolation) if isolation else None,
            localization=tuple(Localization.from_json(x) for x in d.get("localization", [])),
            figures=tuple(FigureRef.from_json(f) for f in d.get("figures", [])),
            missing=tuple(MissingPart.from_json(m) for m in d.get("missing", [])),
            notes=tuple(str(n) for n in d.get("notes", [])),
            generated_at=str(d.get("generated_at", "")),
            speedtrap_version=str(d.get("speedtrap_version", "")),
            schema_version=int(d.get("schema_version", SCHEMA_VERSION)),
        )
