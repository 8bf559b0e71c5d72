"""Read a run directory into :class:`ReportData`: every part that is there, a "Missing" line for each
part that is not (or cannot be read), never a traceback.

Also reads what older or other writers left: a bare ``speedtrap bisect`` run directory
(``trials.sqlite`` / ``result.json`` at its root), a run killed before ``run.json`` was written,
and an isolation killed before its result (its trials are read from the SQLite store).
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from speedtrap._errors import SpeedtrapError, StoreError, UsageError
from speedtrap.isolate import Trial
from speedtrap.report import _adapt, _commands
from speedtrap.report._data import MissingPart, ReportData, RunInfo, StageInfo
from speedtrap.report._model import DivergenceRun, RecallRun, TriageSection
from speedtrap.report._plan import with_figures
from speedtrap.report._stages import IsolationSection, Localization, shown_trial
from speedtrap.report._verdict import build_verdict
from speedtrap.rundir import (
    ISOLATE_DIR,
    LOCALIZE_DIR,
    PROBES_DIR,
    RUN_FILE,
    RUN_SCHEMA_VERSION,
    STAGES,
    TRIAGE_FILE,
    Part,
    RunRecord,
    Source,
    load_part,
    load_run_record,
    now_iso,
)

T = TypeVar("T")
_ROLE_ORDER = {"baseline": 0, "all": 1, "culprit": 2}
_READ_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError)


def _version() -> str:
    try:
        return importlib.metadata.version("speedtrap")
    except importlib.metadata.PackageNotFoundError:
        return "0"


class _Reader:
    def __init__(self, run_dir: Path, source: Source, record: RunRecord | None = None) -> None:
        self.run_dir = run_dir
        self.source = source
        self.settings: dict[str, Any] = record.settings if record is not None else {}
        self.stages = record.stages if record is not None else {}
        self.missing: list[MissingPart] = []
        self.notes: list[str] = []

    def why_absent(self, stage: str, default: str) -> str:
        """Why a part of ``stage`` is absent: the stage's recorded failure, or ``default``."""
        rec = self.stages.get(stage)
        if rec is not None and rec.status in ("failed", "skipped") and rec.detail:
            return f"the {stage} stage {rec.status}: {rec.detail}"
        return default

    def rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.run_dir))
        except ValueError:
            return str(path)

    def part(self, path: Path, what: str, command: str, build: Callable[[Part], T]) -> T | None:
        if not path.exists():
            self.missing.append(MissingPart(what, f"{self.rel(path)} is not there", command))
            return None
        try:
            return build(load_part(path))
        except _READ_ERRORS as exc:
            self.missing.append(MissingPart(what, f"{self.rel(path)} is unreadable ({_why(exc)})", command))
            return None

    def parts(self, folder: str, prefix: str) -> list[tuple[Path, Part | Exception]]:
        out: list[tuple[Path, Part | Exception]] = []
        for path in sorted((self.run_dir / folder).glob(f"{prefix}-*.json")):
            try:
                out.append((path, load_part(path)))
            except _READ_ERRORS as exc:
                out.append((path, exc))
        return out


def _why(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc.msg} at line {exc.lineno}, probably cut off by a killed run"
    if isinstance(exc, KeyError):
        return f"field {exc.args[0]!r} missing: written by another version?"
    return f"{type(exc).__name__}: {exc}"


def _triage(r: _Reader) -> TriageSection | None:
    command = _commands.triage(r.source)
    return r.part(
        r.run_dir / TRIAGE_FILE,
        "triage (tiers, reasons, plan)",
        command,
        lambda p: _adapt.triage_section(p.result, str(p.extra.get("plan_markdown", "")), p.command or command),
    )


def _probes(r: _Reader, all_patches: tuple[str, ...]) -> tuple[list[RecallRun], list[DivergenceRun]]:
    recall: list[tuple[tuple[int, str], RecallRun]] = []
    divergence: list[tuple[tuple[int, str], DivergenceRun]] = []
    for kind, sink in (("recall", recall), ("divergence", divergence)):
        for path, part in r.parts(PROBES_DIR, kind):
            builder = partial(_commands.recall if kind == "recall" else _commands.divergence, r.source)
            wanted_settings = r.settings.get(kind) or {}
            if isinstance(part, Exception):
                r.missing.append(
                    MissingPart(
                        f"{kind} probe ({path.stem})",
                        f"{r.rel(path)} is unreadable ({_why(part)})",
                        builder((), wanted_settings),
                    )
                )
                continue
            command = part.command or builder(part.patches, wanted_settings)
            label = part.label or (", ".join(part.patches) or "baseline")
            try:
                if kind == "recall":
                    run: Any = _adapt.recall_run(label, part.patches, part.result, command)
                else:
                    run = _adapt.divergence_run(label, part.patches, part.result, command)
            except _READ_ERRORS as exc:
                r.missing.append(MissingPart(f"{kind} probe: {label}", f"{r.rel(path)}: {_why(exc)}", command))
                continue
            sink.append(((_ROLE_ORDER.get(part.role, 3), label), run))
    recall.sort(key=lambda x: x[0])
    divergence.sort(key=lambda x: x[0])
    have = {(kind, key[0]) for kind, runs in (("recall", recall), ("divergence", divergence)) for key, _ in runs}
    have |= {("recall", 0) for _, run in recall if not run.patches}
    wanted = (
        ("recall", 0, "recall probe: baseline", _commands.recall(r.source, (), r.settings.get("recall"))),
        ("recall", 1, "recall probe: all patches", _commands.recall(r.source, all_patches, r.settings.get("recall"))),
        (
            "divergence",
            1,
            "divergence probe: all patches",
            _commands.divergence(r.source, all_patches, r.settings.get("divergence")),
        ),
    )
    for kind, role, what, command in wanted:
        if (kind, role) not in have:
            stage = "probes" if (kind, role) != ("divergence", 1) else "evidence"
            r.missing.append(MissingPart(what, r.why_absent(stage, "no probe file for it"), command))
    return [x for _, x in recall], [x for _, x in divergence]


def _trials_from_store(isolate_dir: Path) -> list[Trial]:
    """Trials a killed isolation left in its store, read through isolate's public reader."""
    from speedtrap.isolate import stored_trials

    return [shown_trial({**t.to_json(), "index": i, "reused": False}) for i, t in enumerate(stored_trials(isolate_dir))]


def _isolation(r: _Reader, isolate_dir: Path) -> IsolationSection | None:
    command = _commands.bisect(r.source, str(isolate_dir))
    result = isolate_dir / "result.json"
    if result.exists():
        try:
            doc = json.loads(result.read_text(encoding="utf-8"))
            return _adapt.isolation_section(doc, command)
        except _READ_ERRORS as exc:
            r.missing.append(MissingPart("isolation result", f"{r.rel(result)} is unreadable ({_why(exc)})", command))
    db = isolate_dir / "trials.sqlite"
    if not db.exists():
        if not result.exists():
            r.missing.append(
                MissingPart(
                    "isolation (culprit search)", r.why_absent("isolate", "not run (no trials stored)"), command
                )
            )
        return None
    try:
        trials = _trials_from_store(isolate_dir)
    except StoreError:
        r.missing.append(MissingPart("isolation trials", f"{r.rel(db)} is unreadable", command))
        return None
    if not result.exists():
        r.missing.append(
            MissingPart("isolation result", f"the search stopped after {len(trials)} stored trials", command)
        )
    return IsolationSection(
        "incomplete",
        f"The search did not finish: {len(trials)} trials stored so far.",
        (),
        "",
        "",
        None,
        (),
        (),
        tuple(trials),
    )


def _localization(r: _Reader, culprits: list[tuple[str, ...]]) -> list[Localization]:
    found: dict[tuple[str, ...], dict[str, Any]] = {}
    for kind in ("layers", "scale"):
        for path, part in r.parts(LOCALIZE_DIR, kind):
            builder = _commands.layers if kind == "layers" else _commands.scale
            if isinstance(part, Exception):
                r.missing.append(
                    MissingPart(
                        f"localization ({path.stem})",
                        f"{r.rel(path)} is unreadable ({_why(part)})",
                        builder(r.source, ()),
                    )
                )
                continue
            command = part.command or builder(r.source, part.patches)
            try:
                if kind == "layers":
                    section: Any = _adapt.layer_section(part.result, command)
                else:
                    section = _adapt.scale_section(part.result, command)
            except _READ_ERRORS as exc:
                r.missing.append(MissingPart(f"localization ({path.stem})", f"{r.rel(path)}: {_why(exc)}", command))
                continue
            found.setdefault(part.patches, {})[kind] = section
            extra = part.extra or {}
            if extra.get("measured_on"):  # a live localize: where it was measured, and the base's scale check
                found[part.patches]["measured_on"] = str(extra["measured_on"])
                base = extra.get("base_scale")
                if kind == "scale" and isinstance(base, dict):
                    try:
                        found[part.patches]["base_scale"] = _adapt.scale_section(base, command)
                    except _READ_ERRORS as exc:
                        r.missing.append(MissingPart("base scale check", f"{r.rel(path)}: {_why(exc)}", command))
    tokens = r.settings.get("localize_tokens")
    values = r.settings.get("scale_values")
    if r.source.in_process:
        for patches in culprits:
            have = found.get(patches, {})
            if "layers" not in have:
                r.missing.append(
                    MissingPart(
                        f"layer diff: {' + '.join(patches)}",
                        r.why_absent("localize", "not run"),
                        _commands.layers(r.source, patches, tokens),
                    )
                )
            if "scale" not in have and r.source.symbol:
                r.missing.append(
                    MissingPart(
                        f"scale check: {' + '.join(patches)}",
                        r.why_absent("localize", "not run"),
                        _commands.scale(r.source, patches, tokens, values),
                    )
                )
    order = {p: i for i, p in enumerate(culprits)}
    return [
        Localization(p, v.get("layers"), v.get("scale"), v.get("measured_on", ""), v.get("base_scale"))
        for p, v in sorted(found.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
    ]


def _title(source: Source, r: _Reader) -> str:
    """The model and the stack a manifest run is about: the served model's name (the manifest's), and
    the engine and version the probed server reported (``engines`` of a divergence part)."""
    model = ""
    try:
        from speedtrap.manifest import load_manifest

        target = load_manifest(Path(str(source.manifest))).target
        model = target.served_model or (Path(target.model).name if target.model else "")
    except (SpeedtrapError, OSError):
        pass
    engine = ""
    for _, part in r.parts(PROBES_DIR, "divergence-"):
        if not isinstance(part, Exception):
            engine = str((part.result.get("engines") or {}).get("candidate", ""))
            if engine and not engine.startswith("an OpenAI-compatible server"):
                break
            engine = ""
    if model and engine:
        return f"{model} on {engine}"
    return model or (f"{Path(str(source.manifest)).stem} on {engine}" if engine else "")


def load_report_data(run_dir: Path) -> ReportData:
    """Everything a run directory holds, as report data; absent parts are listed in ``missing``."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run directory {str(run_dir)!r} does not exist", "pass the --out folder of a demo or run")
    notes: list[str] = []
    record: RunRecord | None = None
    try:
        record = load_run_record(run_dir)
    except FileNotFoundError:
        notes.append(f"no {RUN_FILE}: written by an older speedtrap or killed before it started; reading what is here")
    except _READ_ERRORS as exc:
        notes.append(f"{RUN_FILE} is unreadable ({_why(exc)}); reading what is here")
    source = record.source if record is not None else Source(target="smol-moe")
    if record is not None and record.version > RUN_SCHEMA_VERSION:
        notes.append(
            f"{RUN_FILE} says run_schema_version {record.version}, newer than this speedtrap's {RUN_SCHEMA_VERSION}: "
            "parts it does not understand are listed as missing"
        )
    elif record is not None and record.version < RUN_SCHEMA_VERSION:
        notes.append(f"written by an older speedtrap (run_schema_version {record.version}); reading what it has")
    reader = _Reader(run_dir, source, record)
    bare_bisect = (run_dir / "trials.sqlite").exists() or (run_dir / "result.json").exists()
    isolate_dir = run_dir if bare_bisect else run_dir / ISOLATE_DIR
    if bare_bisect:
        notes.append("a bare `speedtrap bisect` run directory: only the isolation is shown")
    triage = None if bare_bisect else _triage(reader)
    searched = record.settings.get("patches") if record is not None else None
    if searched is not None:
        all_patches = tuple(str(p) for p in searched)
    else:
        all_patches = tuple(r.name for r in triage.rows) if triage is not None else ()
    recall, divergence = ([], []) if bare_bisect else _probes(reader, all_patches)
    isolation = _isolation(reader, isolate_dir)
    culprits = [c.patches for c in isolation.culprits] if isolation is not None else []
    localization = [] if bare_bisect else _localization(reader, culprits)
    verdict = build_verdict(triage, recall, divergence, isolation, localization)
    stages = _stage_infos(record, triage, recall or divergence, isolation, localization)
    title = _title(source, reader) if source.manifest else ""
    info = RunInfo(
        run_dir=str(run_dir),
        target=source.name,
        command=record.command if record is not None else "",
        started=record.started if record is not None else None,
        finished=record.finished if record is not None else None,
        run_schema_version=record.version if record is not None else None,
        stages=stages,
        title=title,
    )
    data = ReportData(
        run=info,
        verdict=verdict,
        triage=triage,
        recall=tuple(recall),
        divergence=tuple(divergence),
        isolation=isolation,
        localization=tuple(localization),
        missing=tuple(reader.missing),
        notes=tuple(notes + reader.notes),
        generated_at=now_iso(),
        speedtrap_version=_version(),
    )
    return with_figures(data)


def _stage_infos(
    record: RunRecord | None, triage: object, probes: object, isolation: IsolationSection | None, loc: object
) -> tuple[StageInfo, ...]:
    have = {
        "triage": triage is not None,
        "probes": bool(probes),
        "isolate": isolation is not None and isolation.status != "incomplete",
        "localize": bool(loc),
    }
    out = []
    for name in STAGES:
        rec = record.stages.get(name) if record is not None else None
        if rec is not None:
            status, detail = rec.status, rec.detail
            if status == "done" and not have.get(name, True):
                status, detail = "missing", "recorded as done, but its files are gone"
            elif status not in ("done", "partial", "missing", "failed", "skipped"):
                status, detail = "partial", "stopped while running (killed?)"
            out.append(StageInfo(name, status, rec.seconds, detail))
        elif name in have:
            partial = name == "isolate" and isolation is not None
            out.append(StageInfo(name, "done" if have[name] else "partial" if partial else "missing"))
    return tuple(out)
