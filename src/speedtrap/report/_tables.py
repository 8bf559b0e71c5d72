"""The report's tables as plain strings (headers, rows), shared by the HTML and Markdown renderers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speedtrap.report._data import ReportData
from speedtrap.report._model import DivergenceRun, TriageSection
from speedtrap.report._stages import IsolationSection, LayerSection, ScaleSection


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[int, ...] = ()  # columns to right-align
    code: tuple[int, ...] = ()  # columns shown as code (commands)


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a person: 3 significant digits, scientific when tiny or huge, '-' for missing (None or NaN)."""
    if value is None or value != value:
        return "-"
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def patches_label(patches: Sequence[str]) -> str:
    return " + ".join(patches) if patches else "(no patch)"


def layer_words(layers: LayerSection) -> str:
    """The layer diff in words, said after its first divergent module (the same in HTML and Markdown)."""
    return (
        f"(rel_diff {fmt(layers.first_rel_diff)} > threshold {fmt(layers.threshold)}); "
        f"{layers.modules_over_threshold} of {layers.modules_compared} modules over the threshold, "
        f"{layers.tokens} tokens."
    )


def triage_table(section: TriageSection) -> Table:
    rows = tuple(
        (
            str(r.tier),
            r.name,
            r.kind or "-",
            r.gate or "-",
            r.scope or "-",
            "+".join(r.phases) or "-",
            r.reasons[0] if r.reasons else "-",
        )
        for r in section.rows
    )
    return Table(("tier", "patch", "kind", "gate", "scope", "phases", "main reason"), rows, (0,), code=(3,))


def recall_table(data: ReportData) -> Table:
    rows = tuple(
        (
            run.label,
            patches_label(run.patches),
            f"{run.overall.correct}/{run.overall.n}",
            pct(run.overall.accuracy),
            f"{pct(run.overall.low)}-{pct(run.overall.high)}",
            str(len(run.cells)),
        )
        for run in data.recall
    )
    return Table(("configuration", "patches", "correct", "accuracy", "95% CI (Wilson)", "cells"), rows, (2, 3, 5))


def recall_stops(data: ReportData) -> list[str]:
    """Where each sequential run stopped and why, one line a run ("all patches: stopped after 6 of 10
    questions: 0/6 against 6/6 at 1,280 tokens, lost (alpha 0.05); ...")."""
    return [f"{run.label}: " + "; ".join(run.stops) + "." for run in data.recall if run.stops]


def divergence_table(runs: Sequence[DivergenceRun]) -> Table:
    rows = []
    for run in runs:
        for name, phase in run.phases.items():
            o = phase.overall
            rows.append(
                (
                    run.label,
                    name,
                    str(o.tokens),
                    fmt(o.kl_mean),
                    fmt(o.kl_p99),
                    fmt(o.kl_max),
                    fmt(o.same_top1),
                    fmt(o.rms_dp),
                )
            )
    return Table(
        ("configuration", "phase", "tokens", "KL mean (nats)", "KL p99", "KL max", "same top-1", "RMS Δp"),
        tuple(rows),
        (2, 3, 4, 5, 6, 7),
    )


def trial_table(section: IsolationSection) -> Table:
    metric = section.metric or "figure"
    rows = tuple(
        (
            str(t.index),
            patches_label(t.config),
            str(t.repeat),
            t.outcome or t.status,
            fmt(t.figures.get(section.metric)),
            f"{t.probe_s + t.launch_s:.1f}",
            "yes" if t.reused else "no",
        )
        for t in section.trials
    )
    return Table(("trial", "configuration", "repeat", "outcome", metric, "seconds", "from store"), rows, (0, 2, 4, 5))


def judgement_table(section: IsolationSection) -> Table:
    rows = tuple((patches_label(j.config), j.verdict, j.note or "-") for j in section.judgements)
    return Table(("configuration", "verdict", "note"), rows)


def scale_table(scale: ScaleSection) -> Table:
    ordered = sorted(scale.rows, key=lambda r: (r.layer is None, r.layer or 0, r.module))
    rows = tuple(
        (
            r.module,
            "-" if r.layer is None else str(r.layer),
            fmt(r.exponent),
            "-" if r.times is None else str(r.times),
            r.verdict,
        )
        for r in ordered
    )
    return Table(("module", "layer", "exponent", "times applied", "verdict"), rows, (1, 2, 3))


def reproduce_table(data: ReportData) -> Table:
    rows = [(f.id, f.title, f.command or "-") for f in data.figures]
    if data.run.command:
        rows.insert(0, ("(whole run)", "every section of this report", data.run.command))
    return Table(("figure", "what", "command"), tuple(rows), code=(2,))


def missing_table(data: ReportData) -> Table:
    return Table(
        ("part", "why it is missing", "command that produces it"),
        tuple((m.part, m.reason, m.command or "-") for m in data.missing),
        code=(2,),
    )


def stage_table(data: ReportData) -> Table:
    rows = tuple(
        (s.name, s.status, "-" if s.seconds is None else f"{s.seconds:.1f}", s.detail or "-") for s in data.run.stages
    )
    return Table(("stage", "status", "seconds", "detail"), rows, (2,))


def commit_table(section: IsolationSection, triage: TriageSection | None) -> Table:
    """Each commit patch: its commit, subject, verdict and relations, and triage's tier and reasons."""
    ranks = {r.name: r for r in triage.rows} if triage is not None else {}
    rows = []
    for c in section.commits:
        t = ranks.get(c.patch)
        sha = c.commits[0][:10] + (f" (+{len(c.commits) - 1})" if len(c.commits) > 1 else "") if c.commits else "-"
        rows.append(
            (
                c.patch,
                sha,
                c.subject or "-",
                c.verdict + ("; " + "; ".join(c.relations) if c.relations else ""),
                str(t.tier) if t else "-",
                "; ".join(t.reasons) if t and t.reasons else "-",
            )
        )
    return Table(("patch", "commit", "subject", "verdict", "triage tier", "triage reasons"), tuple(rows), (4,), (1,))
