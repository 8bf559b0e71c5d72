"""The run directory: where each stage's output lies, in a small envelope that says what it is.

::

    RUN/run.json                          the run: source, command, stage statuses (RunRecord)
    RUN/triage.json                       part "triage"      (TriageReport.to_json() + plan)
    RUN/probes/recall-<slug>.json         part "recall"      (RecallReport.to_json())
    RUN/probes/divergence-<slug>.json     part "divergence"  (DivergenceReport.to_json())
    RUN/isolate/                          isolate's own run directory (trials.sqlite, result.json, trials/)
    RUN/localize/layers-<slug>.json       part "layers"      (LayerDiffResult.to_json())
    RUN/localize/scale-<slug>.json        part "scale"       (ScaleCheckResult.to_json())
    RUN/report.html, report.md, report.json, figures/

Every file is written atomically as its stage finishes, so a killed run keeps what finished and a
rerun reuses it.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap.rundir._io import write_atomic
from speedtrap.rundir._source import Source

RUN_SCHEMA_VERSION = 1
RUN_FILE = "run.json"
TRIAGE_FILE = "triage.json"
PROBES_DIR = "probes"
ISOLATE_DIR = "isolate"
LOCALIZE_DIR = "localize"
STAGES = ("triage", "probes", "isolate", "evidence", "localize", "report")


def slug(text: str) -> str:
    out = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return out[:80] or "x"


def patches_slug(patches: tuple[str, ...] | list[str]) -> str:
    """A file-name part for a patch set; a user's ``path/file.py:function`` becomes ``function-<hash>``
    (paths are long and would make two sets share a truncated slug)."""
    return slug("-".join(_short(p) for p in patches)) if patches else "baseline"


def _short(name: str) -> str:
    if ":" not in name:
        return name
    return f"{name.rpartition(':')[2]}-{hashlib.sha1(name.encode()).hexdigest()[:6]}"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass(frozen=True)
class Part:
    """One stage output in its envelope: what it is, for which configuration, and how it was made."""

    stage: str  # triage | recall | divergence | layers | scale
    result: dict[str, Any]
    label: str = ""
    role: str = ""  # baseline | all | culprit | other (orders the probe runs)
    patches: tuple[str, ...] = ()
    command: str = ""
    seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the triage plan
    key: str = ""  # what the result depends on, hashed: a rerun reuses the part when its key matches

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "speedtrap-part",
            "part_version": RUN_SCHEMA_VERSION,
            "stage": self.stage,
            "label": self.label,
            "role": self.role,
            "patches": list(self.patches),
            "command": self.command,
            "seconds": self.seconds,
            "extra": self.extra,
            "key": self.key,
            "result": self.result,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Part:
        if d.get("kind") != "speedtrap-part" or not isinstance(d.get("result"), dict):
            raise ValueError("not a speedtrap part file (no kind/result)")
        seconds = d.get("seconds")
        return cls(
            str(d["stage"]),
            dict(d["result"]),
            str(d.get("label", "")),
            str(d.get("role", "")),
            tuple(str(p) for p in d.get("patches", [])),
            str(d.get("command", "")),
            None if seconds is None else float(seconds),
            dict(d.get("extra") or {}),
            str(d.get("key", "")),
        )


def save_part(path: Path, part: Part) -> Path:
    return write_atomic(path, json.dumps(part.to_json(), indent=1, default=str) + "\n")


def load_part(path: Path) -> Part:
    """Read one part file; raises ``OSError``/``ValueError``/``KeyError`` on an unreadable one."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return Part.from_json(data)


def recall_path(run_dir: Path, patches: tuple[str, ...]) -> Path:
    return run_dir / PROBES_DIR / f"recall-{patches_slug(patches)}.json"


def divergence_path(run_dir: Path, patches: tuple[str, ...]) -> Path:
    return run_dir / PROBES_DIR / f"divergence-{patches_slug(patches)}.json"


def layers_path(run_dir: Path, patches: tuple[str, ...]) -> Path:
    return run_dir / LOCALIZE_DIR / f"layers-{patches_slug(patches)}.json"


def scale_path(run_dir: Path, patches: tuple[str, ...]) -> Path:
    return run_dir / LOCALIZE_DIR / f"scale-{patches_slug(patches)}.json"


@dataclass
class StageRecord:
    status: str = "missing"  # done | partial | missing | failed | skipped
    seconds: float | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "seconds": self.seconds, "detail": self.detail}


@dataclass
class RunRecord:
    """``run.json``: the run's source, command and each stage's status, rewritten as stages finish."""

    source: Source
    command: str
    started: str | None = field(default_factory=now_iso)
    finished: str | None = None
    stages: dict[str, StageRecord] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    version: int = RUN_SCHEMA_VERSION

    def stage(self, name: str) -> StageRecord:
        return self.stages.setdefault(name, StageRecord())

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "speedtrap-run",
            "run_schema_version": self.version,
            "source": self.source.to_json(),
            "command": self.command,
            "started": self.started,
            "finished": self.finished,
            "stages": {k: v.to_json() for k, v in self.stages.items()},
            "settings": self.settings,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunRecord:
        stages = {
            str(k): StageRecord(str(v.get("status", "missing")), v.get("seconds"), str(v.get("detail", "")))
            for k, v in (d.get("stages") or {}).items()
        }
        return cls(
            Source.from_json(dict(d.get("source") or {})),
            str(d.get("command", "")),
            None if d.get("started") is None else str(d["started"]),
            d.get("finished"),
            stages,
            dict(d.get("settings") or {}),
            int(d.get("run_schema_version", 0)),
        )

    def save(self, run_dir: Path) -> None:
        write_atomic(run_dir / RUN_FILE, json.dumps(self.to_json(), indent=1, default=str) + "\n")


def load_run_record(run_dir: Path) -> RunRecord:
    data = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return RunRecord.from_json(data)
