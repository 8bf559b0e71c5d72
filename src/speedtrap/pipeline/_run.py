"""One pipeline run: triage -> probes -> isolate -> localize -> report, into one run directory.

Each stage's output is stored as it finishes (``run.json`` says which stages are done), so a killed
run keeps what finished and the same command run again reuses it; a failed stage is recorded, the
stages that need it are skipped, and the report is rendered from whatever is there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._errors import SpeedtrapError, UsageError
from speedtrap.pipeline import _stages
from speedtrap.pipeline._context import Context
from speedtrap.pipeline._settings import PipelineSettings
from speedtrap.progress import NoProgress, Progress
from speedtrap.report import ReportData, RunRecord, Source, load_report_data, write_report
from speedtrap.rundir import now_iso

if TYPE_CHECKING:
    from speedtrap.targets import InProcessModel


@dataclass
class PipelineResult:
    run_dir: Path
    data: ReportData
    html: Path
    markdown: Path
    json: Path
    seconds: dict[str, float] = field(default_factory=dict)  # per stage, this run
    reused: list[str] = field(default_factory=list)  # parts taken from an earlier run
    computed: list[str] = field(default_factory=list)  # parts measured by this run
    errors: list[str] = field(default_factory=list)  # one line per failed stage

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "report": {"html": str(self.html), "markdown": str(self.markdown), "json": str(self.json)},
            "verdict": self.data.verdict.to_json(),
            "missing": [m.to_json() for m in self.data.missing],
            "seconds": self.seconds,
            "reused": self.reused,
            "computed": self.computed,
            "errors": self.errors,
        }


def _stage(ctx: Context, name: str, seconds: dict[str, float], errors: list[str], fn: Callable[[], Any]) -> Any:
    rec = ctx.record.stage(name)
    rec.status, rec.detail = "running", ""
    ctx.save_record()
    computed, reused = len(ctx.computed), len(ctx.reused)
    t0 = time.perf_counter()
    try:
        out = fn()
    except SpeedtrapError as exc:
        rec.status, rec.detail = "failed", exc.one_line()
        errors.append(f"{name}: {exc.one_line()}")
        ctx.progress.done(name, "failed", exc.one_line())
        return None
    except KeyboardInterrupt:
        rec.status, rec.detail = "failed", "interrupted"
        raise
    finally:
        seconds[name] = round(time.perf_counter() - t0, 3)
        rec.seconds = seconds[name]
        ctx.save_record()
    rec.status = "done"
    if len(ctx.computed) == computed and len(ctx.reused) > reused:
        rec.detail = "reused the results stored by an earlier run"
    ctx.save_record()
    ctx.progress.done(name, "done")
    return out


def _skip(ctx: Context, name: str, why: str) -> None:
    rec = ctx.record.stage(name)
    rec.status, rec.detail = "skipped", why
    ctx.save_record()
    ctx.progress.done(name, "skipped", why)


def run_pipeline(
    run_dir: Path,
    source: Source,
    settings: PipelineSettings | None = None,
    *,
    command: str = "",
    model: InProcessModel | None = None,
    progress: Progress | None = None,
) -> PipelineResult:
    """Run every stage into ``run_dir`` (reusing what an earlier run with the same settings stored)."""
    settings = settings or PipelineSettings()
    progress = progress or NoProgress()
    if source.in_process and settings.overrides:
        source = dataclasses.replace(
            source, sets=tuple(sorted((str(k), str(v)) for k, v in settings.overrides.items()))
        )
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the output folder {str(run_dir)!r}: {exc.strerror}", "pass --out") from None
    record = RunRecord(source, command or "", settings=settings.to_json())
    ctx = Context(run_dir, source, settings, record, progress, model=model)
    if not source.in_process:
        from speedtrap.manifest import load_manifest

        ctx.manifest = load_manifest(Path(str(source.manifest)))
        _ = ctx.manifest.target, ctx.manifest.verdict  # what run launches and judges by: named before any stage
    ctx.save_record()
    seconds: dict[str, float] = {}
    errors: list[str] = []

    triage = _stage(ctx, "triage", seconds, errors, lambda: _stages.triage_stage(ctx))
    prior = _stages.tier_one(triage) if triage and settings.use_triage_prior else []
    all_patches = _all_patches(ctx)

    def probes() -> None:
        progress.start("probes", 2)
        runs = [("baseline", "baseline", ()), ("all patches", "all", all_patches)]
        if _stages.sequential_recall(ctx):  # the baseline is asked what the patched runs need, beside them
            runs.reverse()
        for label, role, config in runs:
            part = _stages.probe(ctx, "recall", label, role, config)
            progress.advance("probes", 1, f"recall: {label}{_stages.summary(part)}")

    no_chat = _stages.why_no_chat(ctx)
    if no_chat:
        _skip(ctx, "probes", no_chat)
    else:
        _stage(ctx, "probes", seconds, errors, probes)
    result = _stage(ctx, "isolate", seconds, errors, lambda: _stages.isolate_stage(ctx, prior))
    culprits = [c.patches for c in result.culprits] if result is not None else []
    if result is not None:
        spec = _stages.isolation_spec(ctx, prior)

        def evidence() -> None:
            configs = [("all patches", "all", all_patches)]
            if settings.probe_culprits:
                configs += [(" + ".join(c), "culprit", c) for c in culprits if c != all_patches]
            progress.start("evidence", len(configs) * 2)
            for label, role, config in configs:
                part = _stages.from_trial_report(ctx, spec, result, config, label, role)
                if part is None:
                    part = _stages.probe(ctx, "divergence", label, role, config)
                progress.advance("evidence", 1, f"divergence: {label}{_stages.summary(part)}")
                if role == "culprit" and not no_chat:
                    part = _stages.probe(ctx, "recall", label, role, config)
                    progress.advance("evidence", 1, f"recall: {label}{_stages.summary(part)}")
                else:
                    progress.advance("evidence", 1, f"recall: {label} (not needed)")

        _stage(ctx, "evidence", seconds, errors, evidence)
    else:
        _skip(ctx, "evidence", "no isolation result")
    if not settings.localize or not culprits:
        _skip(ctx, "localize", "no culprit to localize" if settings.localize else "switched off")
    elif not source.in_process and (why := _stages.why_no_live_localize(ctx)):
        _skip(ctx, "localize", why)
    elif not source.in_process:  # inside the manifest's own stack, one launch at a time
        _stage(ctx, "localize", seconds, errors, lambda: _stages.live_localize_stage(ctx, culprits, triage))
    else:
        _stage(ctx, "localize", seconds, errors, lambda: _stages.localize_stage(ctx, culprits, triage))

    t0 = time.perf_counter()
    progress.start("report", 1)
    record.finished = now_iso()
    rec = record.stage("report")
    rec.status = "done"
    ctx.save_record()
    data = load_report_data(run_dir)
    paths = write_report(data, run_dir)
    seconds["report"] = round(time.perf_counter() - t0, 3)
    rec.seconds = seconds["report"]
    ctx.save_record()
    progress.done("report", "done")
    return PipelineResult(
        run_dir, data, paths.html, paths.markdown, paths.json, seconds, ctx.reused, ctx.computed, errors
    )


def _all_patches(ctx: Context) -> tuple[str, ...]:
    """Every patch searched: the settings' list, the target's own catalogue, or the manifest's patches."""
    if ctx.source.in_process:
        if ctx.settings.patches is not None:
            return tuple(ctx.settings.patches)
        from speedtrap.targets import resolve_target

        return tuple(i.name for i in resolve_target(str(ctx.source.target)).patch_infos())
    return tuple(p.name for p in ctx.server_manifest().patches if not p.ungated)
