"""``speedtrap report RUN_DIR``: re-render report.html, report.md and report.json from a run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from speedtrap.cli._app import app, emit_json, err_console, out_console, user_errors


def print_verdict(data: Any, paths: Any) -> None:
    """The verdict on the terminal: headline, culprits, the evidence chain, what is missing, where the report is."""
    v = data.verdict
    style = {"culprit": "bold red", "no_regression": "bold green"}.get(v.status, "bold yellow")
    out_console.print(f"[{style}]{escape(v.headline)}[/]", highlight=False, soft_wrap=True)
    for i in v.interactions:
        out_console.print(
            f"  interaction ({escape(i.kind)}): {escape(' + '.join(i.patches))}: {escape(i.explanation)}",
            highlight=False,
            soft_wrap=True,
        )
    for n, line in enumerate(v.evidence, 1):
        out_console.print(f"  {n}. {line}", highlight=False, soft_wrap=True, markup=False)
    if data.missing:
        out_console.print(f"[yellow]missing {len(data.missing)} part(s):[/]", highlight=False)
        for m in data.missing:
            out_console.print(f"  - {m.part}: {m.reason} -> {m.command}", highlight=False, soft_wrap=True, markup=False)
    out_console.print(f"report: {paths.html}", highlight=False, soft_wrap=True, markup=False)


@app.command("report")
@user_errors
def report_cmd(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `speedtrap demo` or `speedtrap run`.")],
    out: Annotated[Path | None, typer.Option("--out", help="Write the report here instead of into RUN_DIR.")] = None,
    json: Annotated[bool, typer.Option("--json", help="Print report.json's document on stdout.")] = False,
) -> None:
    """Render report.html, report.md and report.json from a run directory's stored results (missing parts listed)."""
    from speedtrap.report import render_run

    with err_console.status("rendering the report"):
        data, paths = render_run(run_dir, out)
    if json:
        emit_json(data.to_json())  # exactly report.json (it validates against schemas/report.schema.json)
        return
    print_verdict(data, paths)
