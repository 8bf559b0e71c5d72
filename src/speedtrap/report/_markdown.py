"""``report.md``: the same report in Markdown, its figures written as PNG files in ``figures/`` beside it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from speedtrap.localize import scale_words
from speedtrap.report import _tables
from speedtrap.report._data import ReportData
from speedtrap.report._plan import DrawnFigure
from speedtrap.report._tables import Table, fmt, patches_label
from speedtrap.report._verdict import sites_sentence
from speedtrap.rundir import slug, write_atomic

MD_NAME = "report.md"
FIGURES_DIR = "figures"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(t: Table) -> str:
    if not t.rows:
        return "(none)\n"
    align = ["---:" if i in t.numeric else "---" for i in range(len(t.headers))]
    lines = ["| " + " | ".join(_cell(h) for h in t.headers) + " |", "|" + "|".join(align) + "|"]
    lines += [
        "| " + " | ".join(f"`{_cell(c)}`" if i in t.code and c != "-" else _cell(c) for i, c in enumerate(row)) + " |"
        for row in t.rows
    ]
    return "\n".join(lines) + "\n"


def _figures(figs: Sequence[DrawnFigure], section: str, fid: str | None = None) -> str:
    out = []
    for f in figs:
        if f.ref.section != section or (fid is not None and f.ref.id != fid):
            continue
        if f.png is None:
            out.append(f"*figure {f.ref.id} could not be drawn: {f.error}*\n")
        else:
            out.append(f"![{f.ref.title}]({FIGURES_DIR}/{f.ref.id}.png)\n\n*{f.ref.title}*: `{f.ref.command or '-'}`\n")
    return "\n".join(out)


def markdown_text(data: ReportData, figs: Sequence[DrawnFigure]) -> str:
    run, v = data.run, data.verdict
    out = [f"# {run.target or 'speedtrap run'}: which speed patch broke it?\n"]
    out.append(f"Run directory `{run.run_dir}`, rendered {data.generated_at} by speedtrap {data.speedtrap_version}.")
    if run.command:
        out.append(f"Command: `{run.command}`")
    out.append("\n## Verdict\n")
    out.append(f"**{v.headline}**\n")
    for c in v.culprits:
        out.append(f"- culprit: `{patches_label(c.patches)}`" + ("" if c.confirmed else " (inconclusive)"))
    for i in v.interactions:
        out.append(f"- interaction ({i.kind}): `{patches_label(i.patches)}`: {i.explanation}")
    if v.evidence:
        out.append("\nEvidence:\n")
        out += [f"{n}. {e}" for n, e in enumerate(v.evidence, 1)]
    if run.stages:
        out.append("\n" + _table(_tables.stage_table(data)))
    if data.missing:
        out.append("\n## Missing\n")
        out.append("This run directory does not hold every part of a report; what it has is shown below.\n")
        out.append(_table(_tables.missing_table(data)))
    if data.triage is not None:
        t = data.triage
        out.append(f"\n## Triage\n\n{t.source}: `{t.command or '-'}`\n")
        out.append(_table(_tables.triage_table(t)))
        out += [f"note: {w}\n" for w in t.warnings]
        if t.plan_markdown:
            plan = "\n".join(
                ("#" * 2 + line) if line.startswith("#") else line for line in t.plan_markdown.splitlines()
            )
            out.append("<details><summary>Diagnostic plan (from triage)</summary>\n\n" + plan + "\n\n</details>\n")
    if data.recall:
        out.append("\n## Probes: planted-fact recall\n")
        out.append(_table(_tables.recall_table(data)))
        stops = _tables.recall_stops(data)
        if stops:
            out.append("Sequential verdicts (each length asked in rounds until decided against the baseline):\n")
            out += [f"- {line}\n" for line in stops]
        out.append(_figures(figs, "probes"))
    if data.divergence:
        out.append("\n## Probes: divergence by position\n")
        out.append(_table(_tables.divergence_table(data.divergence)))
        out += [f"Reading of {d.label}: {d.reading}.\n" for d in data.divergence if d.reading]
        out.append(_figures(figs, "divergence"))
    if data.isolation is not None:
        iso = data.isolation
        out.append(f"\n## Isolation\n\n{iso.message}\n")
        out.append(
            f"Rule: {iso.rule}; searched: {', '.join(iso.searched) or '-'}; trials run {iso.launches}, "
            f"reused from the store {iso.reused}; `{iso.command or '-'}`\n"
        )
        out.append(_figures(figs, "isolation"))
        out.append("\n### Trial log\n\n" + _table(_tables.trial_table(iso)))
        out.append("\n### Verdicts per configuration\n\n" + _table(_tables.judgement_table(iso)))
        out += [f"note: {n}\n" for n in iso.notes]
        if iso.commits:
            out.append("\n### Commits\n\n" + _table(_tables.commit_table(iso, data.triage)))
            for row in iso.commits:
                fence = "~~~~" if "~~~" in row.diff else "~~~"
                out.append(f"\n#### {row.patch}: {row.subject}\n\n{fence}diff\n{row.diff.rstrip()}\n{fence}\n")
    if data.localization:
        out.append("\n## Localization\n")
        for loc in data.localization:
            out.append(f"\n### {patches_label(loc.patches)}\n")
            name = slug("-".join(loc.patches))
            if loc.measured_on:
                out.append(f"Measured {loc.measured_on}.\n")
            if loc.layers is not None:
                lay = loc.layers
                out.append(f"First divergent module: `{lay.first_divergent or 'none'}` {_tables.layer_words(lay)}\n")
            out.append(_figures(figs, "localization", f"growth-{name}"))
            if loc.scale is not None:
                sc = loc.scale
                once = "exactly once everywhere" if sc.exactly_once else "NOT exactly once everywhere"
                out.append(f"Scale check of `{sc.param}` (nominal {fmt(sc.nominal)}): applied {once}.\n")
                if any(r.sites is not None for r in sc.rows):
                    out.append(f"Where: {scale_words(sc.rows)}.\n")
                beside = sites_sentence(loc, data.triage)
                if beside:
                    out.append(beside + "\n")
                if loc.base_scale is not None:
                    out.append(f"In the base configuration: {scale_words(loc.base_scale.rows)}.\n")
                out.append(_figures(figs, "localization", f"scale-{name}"))
                out.append(_table(_tables.scale_table(sc)))
    out.append("\n## Reproduce\n\n" + _table(_tables.reproduce_table(data)))
    if data.notes:
        out.append("\n## Notes\n\n" + "\n".join(f"- {n}" for n in data.notes) + "\n")
    return "\n".join(out) + "\n"


def render_markdown(data: ReportData, out_dir: Path, figures: Sequence[DrawnFigure] | None = None) -> Path:
    """Write ``out_dir/report.md`` and its figures as ``out_dir/figures/<id>.png``; return the Markdown path."""
    from speedtrap.report._plan import draw_all

    figs = list(figures) if figures is not None else draw_all(data)
    for f in figs:
        if f.png is not None:
            write_atomic(out_dir / FIGURES_DIR / f"{f.ref.id}.png", f.png)
    return write_atomic(out_dir / MD_NAME, markdown_text(data, figs))
