"""``report.html``: one self-contained page (inline CSS, figures as base64 PNG, one tiny inline script).

A Content-Security-Policy forbids every network load, so the page opens offline exactly as it
does online. The script only checks the page itself: it counts images that failed to decode and
script errors into ``data-*`` attributes of ``<body>`` (read by the headless-browser test).
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from speedtrap.localize import scale_words
from speedtrap.report import _tables
from speedtrap.report._data import ReportData
from speedtrap.report._mdhtml import inline, markdown_to_html
from speedtrap.report._plan import DrawnFigure
from speedtrap.report._tables import Table, fmt, patches_label
from speedtrap.report._verdict import sites_sentence
from speedtrap.rundir import slug, write_atomic

HTML_NAME = "report.html"

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

_CSS = """
:root { --ink:#1d2330; --muted:#5b6472; --line:#dde1e7; --bad:#b42318; --bad-bg:#fef3f2; --ok:#067647;
  --ok-bg:#ecfdf3; --warn:#b54708; --warn-bg:#fffaeb; --accent:#1f4fa8; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
  color: var(--ink); background: #f6f7f9; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 60px; background: #fff; }
h1 { font-size: 26px; margin: 4px 0 2px; } h2 { font-size: 20px; margin: 34px 0 10px; padding-top: 8px;
  border-top: 1px solid var(--line); } h3 { font-size: 16px; margin: 22px 0 8px; } h4, h5, h6 { font-size: 14px; }
.meta { color: var(--muted); font-size: 13px; } .meta code { font-size: 12px; }
code { font: 12.5px/1.4 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; background: #f1f3f6;
  padding: 1px 4px; border-radius: 3px; }
pre { background: #f1f3f6; padding: 10px 12px; border-radius: 6px; overflow-x: auto; }
pre code { background: none; padding: 0; }
.verdict { border-left: 6px solid var(--bad); background: var(--bad-bg); padding: 14px 18px; border-radius: 6px;
  margin: 18px 0; }
.verdict.ok { border-color: var(--ok); background: var(--ok-bg); }
.verdict.unsure { border-color: var(--warn); background: var(--warn-bg); }
.verdict .headline { font-size: 19px; font-weight: 650; margin: 0 0 6px; }
.verdict ol { margin: 6px 0 0 0; padding-left: 22px; } .verdict li { margin: 3px 0; }
.culprit { display: inline-block; font: 600 14px ui-monospace, "DejaVu Sans Mono", monospace; color: #fff;
  background: var(--bad); padding: 2px 9px; border-radius: 12px; margin: 2px 6px 2px 0; }
div.missing, p.missing { border-left: 6px solid var(--warn); background: var(--warn-bg); padding: 10px 16px;
  border-radius: 6px; }
.tablewrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 14px; font-size: 13.5px; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 8px; text-align: left; vertical-align: top;
  overflow-wrap: break-word; }
td code { white-space: pre-wrap; overflow-wrap: anywhere; } td.code { min-width: 15em; }
th { background: #f6f7f9; font-weight: 600; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fff5f4; }
figure { margin: 10px 0 18px; } figure img { max-width: 100%; height: auto; border: 1px solid var(--line);
  border-radius: 4px; } figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
figcaption a { color: var(--accent); }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(330px, 1fr)); gap: 8px 18px; }
.grid.wide { grid-template-columns: repeat(auto-fill, minmax(480px, 1fr)); }
details { margin: 8px 0; } summary { cursor: pointer; color: var(--accent); font-weight: 600; }
.chips span { display: inline-block; font-size: 12px; padding: 1px 8px; border-radius: 10px; margin-right: 6px;
  background: #eef1f5; } .chips .st-done { background: var(--ok-bg); color: var(--ok); }
.chips .st-missing, .chips .st-failed, .chips .st-partial { background: var(--warn-bg); color: var(--warn); }
nav a { margin-right: 12px; color: var(--accent); text-decoration: none; font-size: 14px; }
"""

_SCRIPT = """
(function () {
  var errors = 0;
  window.addEventListener('error', function (event) {
    if (event instanceof ErrorEvent) { errors += 1; }  // a script error (a failed image is checked below)
  }, true);
  window.addEventListener('load', function () {
    var images = document.images, broken = 0;
    for (var i = 0; i < images.length; i++) {
      if (!images[i].complete || images[i].naturalWidth === 0) { broken += 1; }
    }
    document.body.dataset.images = String(images.length);
    document.body.dataset.brokenImages = String(broken);
    document.body.dataset.scriptErrors = String(errors);
    document.body.dataset.checked = 'yes';
  });
})();
"""


def _esc(text: object) -> str:
    return html.escape(str(text))


def _stops_html(lines: list[str]) -> str:
    if not lines:
        return ""
    items = "".join(f"<li>{_esc(line)}</li>" for line in lines)
    return f'<p class="meta">Sequential verdicts (each length asked in rounds until decided):</p><ul>{items}</ul>'


def _table(t: Table, fail_col: int | None = None) -> str:
    if not t.rows:
        return '<p class="meta">(none)</p>'
    head = "".join(
        f'<th class="num">{_esc(h)}</th>' if i in t.numeric else f"<th>{_esc(h)}</th>" for i, h in enumerate(t.headers)
    )
    body = []
    for row in t.rows:
        cls = ' class="fail"' if fail_col is not None and row[fail_col] in ("fail", "failed", "error") else ""
        cells = "".join(_cell(t, i, c) for i, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f'<div class="tablewrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _cell(t: Table, i: int, text: str) -> str:
    if i in t.numeric:
        return f'<td class="num">{_esc(text)}</td>'
    if i in t.code and text != "-":
        return f'<td class="code"><code>{_esc(text)}</code></td>'
    return f"<td>{inline(text)}</td>"


def _figure(fig: DrawnFigure) -> str:
    if fig.png is None:
        return f'<p class="missing">figure {_esc(fig.ref.id)} could not be drawn: {_esc(fig.error)}</p>'
    data = base64.b64encode(fig.png).decode("ascii")
    return (
        f'<figure id="fig-{_esc(fig.ref.id)}"><img src="data:image/png;base64,{data}" alt="{_esc(fig.ref.title)}">'
        f'<figcaption>{_esc(fig.ref.title)} &middot; <a href="#reproduce" title="{_esc(fig.ref.command)}">'
        "reproduce</a></figcaption></figure>"
    )


def _figures(figs: Sequence[DrawnFigure], section: str, fid: str | None = None, grid: str = "") -> str:
    chosen = [f for f in figs if f.ref.section == section and (fid is None or f.ref.id == fid)]
    if not chosen:
        return ""
    inner = "".join(_figure(f) for f in chosen)
    return f'<div class="{grid}">{inner}</div>' if grid else inner


def _verdict(data: ReportData) -> str:
    v = data.verdict
    cls = {"culprit": "", "baseline_fails": "", "no_regression": " ok"}.get(v.status, " unsure")
    chips = "".join(f'<span class="culprit">{_esc(patches_label(c.patches))}</span>' for c in v.culprits)
    inter = "".join(
        f"<li><strong>interaction ({_esc(i.kind)})</strong>: {_esc(patches_label(i.patches))}: {_esc(i.explanation)}"
        "</li>"
        for i in v.interactions
    )
    evidence = "".join(f"<li>{inline(e)}</li>" for e in v.evidence)
    return (
        f'<section id="verdict" class="verdict{cls}"><p class="headline">{_esc(v.headline)}</p>'
        f"{('<p>' + chips + '</p>') if chips else ''}"
        f"{('<p><strong>Evidence</strong></p><ol>' + evidence + '</ol>') if evidence else ''}"
        f"{('<ul>' + inter + '</ul>') if inter else ''}</section>"
    )


def _sections(data: ReportData, figs: Sequence[DrawnFigure]) -> list[str]:
    out: list[str] = []
    if data.missing:
        out.append(
            '<h2 id="missing">Missing</h2><div class="missing"><p>This run directory does not hold every part of a '
            "report; what it has is shown below. Each missing part, and the command that produces it:</p>"
            f"{_table(_tables.missing_table(data))}</div>"
        )
    if data.triage is not None:
        t = data.triage
        plan = (
            f"<details><summary>Diagnostic plan (from triage)</summary>{markdown_to_html(t.plan_markdown)}</details>"
            if t.plan_markdown
            else ""
        )
        warn = "".join(f'<p class="meta">note: {_esc(w)}</p>' for w in t.warnings)
        out.append(
            f'<h2 id="triage">Triage</h2><p class="meta">{_esc(t.source)} &middot; '
            f"<code>{_esc(t.command or '-')}</code></p>{_table(_tables.triage_table(t))}{warn}{plan}"
        )
    if data.recall:
        out.append(
            '<h2 id="probes">Probes: planted-fact recall</h2><p class="meta">Multi-turn chats with facts planted at '
            "a depth of the conversation; greedy answers scored by substring; Wilson 95% intervals.</p>"
            f"{_table(_tables.recall_table(data))}{_stops_html(_tables.recall_stops(data))}"
            f"{_figures(figs, 'probes', grid='grid')}"
        )
    if data.divergence:
        out.append(
            '<h2 id="divergence">Probes: divergence by position</h2><p class="meta">Teacher-forced next-token '
            "distributions of the same token sequences, baseline vs patched: prefill (one forward) and decode "
            f"(token by token through the KV cache).</p>{_table(_tables.divergence_table(data.divergence))}"
            + "".join(f"<p>Reading of {_esc(r.label)}: {_esc(r.reading)}.</p>" for r in data.divergence if r.reading)
            + _figures(figs, "divergence", grid="grid wide")
        )
    if data.isolation is not None:
        iso = data.isolation
        notes = "".join(f'<p class="meta">note: {_esc(n)}</p>' for n in iso.notes)
        out.append(
            f'<h2 id="isolation">Isolation</h2><p>{_esc(iso.message)}</p><p class="meta">rule: {_esc(iso.rule)} '
            f"&middot; searched: {_esc(', '.join(iso.searched) or '-')} &middot; trials run {iso.launches}, "
            f"reused from the store {iso.reused} &middot; <code>{_esc(iso.command or '-')}</code></p>"
            f"{_figures(figs, 'isolation')}<h3>Trial log</h3>{_table(_tables.trial_table(iso), fail_col=3)}"
            f"<h3>Verdicts per configuration</h3>{_table(_tables.judgement_table(iso), fail_col=1)}{notes}"
        )
        if iso.commits:
            diffs = "".join(
                f"<details><summary>{_esc(c.patch)}: {_esc(c.subject)}</summary><pre>{_esc(c.diff)}</pre></details>"
                for c in iso.commits
            )
            out.append(f"<h3>Commits</h3>{_table(_tables.commit_table(iso, data.triage))}{diffs}")
    if data.localization:
        parts = ['<h2 id="localization">Localization</h2>']
        for loc in data.localization:
            name = patches_label(loc.patches)
            parts.append(f"<h3>{_esc(name)}</h3>")
            if loc.measured_on:
                parts.append(f'<p class="meta">Measured {_esc(loc.measured_on)}.</p>')
            if loc.layers is not None:
                lay = loc.layers
                parts.append(
                    f"<p>First divergent module: <code>{_esc(lay.first_divergent or 'none')}</code> "
                    f"{_esc(_tables.layer_words(lay))}</p>"
                )
            parts.append(_figures(figs, "localization", f"growth-{slug('-'.join(loc.patches))}"))
            if loc.scale is not None:
                sc = loc.scale
                once = "exactly once everywhere" if sc.exactly_once else "NOT exactly once everywhere"
                parts.append(
                    f"<p>Scale check of <code>{_esc(sc.param)}</code> (nominal {fmt(sc.nominal)}, probed at "
                    f"{_esc(', '.join(fmt(v) for v in sc.values))}): applied {once}.</p>"
                )
                if any(r.sites is not None for r in sc.rows):
                    parts.append(f"<p>Where: {inline(scale_words(sc.rows))}.</p>")
                beside = sites_sentence(loc, data.triage)
                if beside:
                    parts.append(f"<p>{inline(beside)}</p>")
                if loc.base_scale is not None:
                    parts.append(f"<p>In the base configuration: {_esc(scale_words(loc.base_scale.rows))}.</p>")
                parts.append(_figures(figs, "localization", f"scale-{slug('-'.join(loc.patches))}"))
                parts.append(
                    f"<details><summary>Exponent per module</summary>{_table(_tables.scale_table(sc))}</details>"
                )
        out.append("".join(parts))
    out.append(
        '<h2 id="reproduce">Reproduce</h2><p class="meta">The exact command behind each figure (each prints JSON '
        f"with <code>--json</code>).</p>{_table(_tables.reproduce_table(data))}"
    )
    if data.notes:
        out.append('<h2 id="notes">Notes</h2><ul>' + "".join(f"<li>{_esc(n)}</li>" for n in data.notes) + "</ul>")
    return out


def html_page(data: ReportData, figs: Sequence[DrawnFigure]) -> str:
    run = data.run
    chips = "".join(f'<span class="st-{_esc(s.status)}">{_esc(s.name)}: {_esc(s.status)}</span>' for s in run.stages)
    nav = "".join(
        f'<a href="#{a}">{t}</a>'
        for a, t, on in (
            ("verdict", "Verdict", True),
            ("missing", "Missing", bool(data.missing)),
            ("triage", "Triage", data.triage is not None),
            ("probes", "Recall", bool(data.recall)),
            ("divergence", "Divergence", bool(data.divergence)),
            ("isolation", "Isolation", data.isolation is not None),
            ("localization", "Localization", bool(data.localization)),
            ("reproduce", "Reproduce", True),
        )
        if on
    )
    stages = f"<details><summary>Stages</summary>{_table(_tables.stage_table(data))}</details>" if run.stages else ""
    body = "".join(_sections(data, figs))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>speedtrap report: {_esc(run.target or 'run')}</title><style>{_CSS}</style>"
        f"<script>{_SCRIPT}</script></head>"
        f'<body><main><p class="meta">speedtrap {_esc(data.speedtrap_version)} report</p>'
        f"<h1>{_esc(run.target or 'speedtrap run')}: which speed patch broke it?</h1>"
        f'<p class="meta">run directory <code>{_esc(run.run_dir)}</code> &middot; rendered {_esc(data.generated_at)}'
        f"{(' &middot; command <code>' + _esc(run.command) + '</code>') if run.command else ''}</p>"
        f'<p class="chips">{chips}</p><nav>{nav}</nav>{_verdict(data)}{stages}{body}</main></body></html>\n'
    )


def render_html(data: ReportData, out_dir: Path, figures: Sequence[DrawnFigure] | None = None) -> Path:
    """Write ``out_dir/report.html`` (self-contained) and return its path."""
    from speedtrap.report._plan import draw_all

    figs = list(figures) if figures is not None else draw_all(data)
    return write_atomic(out_dir / HTML_NAME, html_page(data, figs))
