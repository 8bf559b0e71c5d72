"""``speedtrap demo`` (the whole hunt on smol-moe) and ``speedtrap run --manifest FILE`` (on any stack)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column

from speedtrap._errors import UsageError
from speedtrap.cli._app import app, emit_json, err_console, fail, user_errors
from speedtrap.cli._report import print_verdict

DEMO_DIR = Path("speedtrap-runs") / "demo"
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the run's summary as one JSON object on stdout.")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="The run directory (reused by a rerun).")]
QuickOpt = Annotated[
    bool, typer.Option("--quick", help="Skip each culprit's own recall probe; localize on 48 tokens instead of 96.")
]


class RichStages:
    """One progress bar per stage on stderr."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.tasks: dict[str, TaskID] = {}

    def _task(self, stage: str, total: int | None = None) -> TaskID:
        if stage not in self.tasks:
            self.tasks[stage] = self.bar.add_task(stage, total=total, note="")
        return self.tasks[stage]

    def start(self, stage: str, total: int | None, detail: str = "") -> None:
        task = self._task(stage, total)
        self.bar.update(task, total=total, note=detail)

    def advance(self, stage: str, n: int = 1, detail: str = "") -> None:
        self.bar.update(self._task(stage), advance=n, note=detail)

    def done(self, stage: str, status: str, detail: str = "") -> None:
        task = self._task(stage)
        total = self.bar.tasks[task].total
        if status == "done":
            completed = total if total is not None else self.bar.tasks[task].completed
            self.bar.update(task, total=completed or 1, completed=completed or 1, note="done")
        else:
            self.bar.update(task, total=total or 1, note=f"{status}: {detail}"[:80])


def _bar() -> Progress:
    return Progress(
        TextColumn("{task.description}", table_column=Column(no_wrap=True, min_width=9)),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}", style="dim", table_column=Column(no_wrap=True, overflow="ellipsis")),
        console=err_console,
        transient=False,
    )


def _finish(result: Any, json: bool) -> None:
    if json:
        emit_json(result.to_json())
    else:
        from speedtrap.report import ReportPaths

        print_verdict(result.data, ReportPaths(result.html, result.markdown, result.json))
        reused = len(result.reused)
        err_console.print(
            f"{reused} stored part(s) reused, {len(result.computed)} measured; "
            f"stage seconds: {', '.join(f'{k} {v:.1f}' for k, v in result.seconds.items())}",
            highlight=False,
        )
    if result.errors:
        for line in result.errors:
            err_console.print(f"[bold red]error:[/] {line}", highlight=False, soft_wrap=True)
        raise fail(f"{len(result.errors)} stage(s) failed; the report shows what finished", 2)


def _command_line() -> str:
    return " ".join(shlex.quote(a) for a in ["speedtrap", *sys.argv[1:]])


@app.command("demo")
@user_errors
def demo_cmd(quick: QuickOpt = False, out: OutOpt = None, json: JsonOpt = False) -> None:
    """The whole hunt on smol-moe and its eight patches: triage, probes, isolation, localization, report."""
    from speedtrap.pipeline import run_pipeline
    from speedtrap.pipeline._settings import demo_settings
    from speedtrap.report import Source

    run_dir = out or DEMO_DIR
    err_console.print(f"run directory: {run_dir}", highlight=False)
    with _bar() as bar:
        result = run_pipeline(
            run_dir,
            Source(target="smol-moe", quick=True),
            demo_settings(quick),
            command=_command_line(),
            progress=RichStages(bar),
        )
    _finish(result, json)


@app.command("run")
@user_errors
def run_cmd(
    manifest: Annotated[Path, typer.Option("--manifest", "-m", help="A speedtrap.toml describing the stack.")],
    quick: Annotated[bool, typer.Option("--quick", help="The probes' quick presets (CI-sized grids).")] = False,
    out: OutOpt = None,
    json: JsonOpt = False,
) -> None:
    """The whole hunt on any stack described by a manifest (servers launched per configuration)."""
    from speedtrap.pipeline import PipelineSettings, run_pipeline
    from speedtrap.report import Source

    if not manifest.is_file():
        raise UsageError(f"manifest {str(manifest)!r} does not exist", "pass the path of a speedtrap.toml")
    run_dir = out or Path("speedtrap-runs") / f"run-{manifest.stem}"
    err_console.print(f"run directory: {run_dir}", highlight=False)
    with _bar() as bar:
        result = run_pipeline(
            run_dir,
            Source(manifest=str(manifest.resolve()), symbol=None, quick=quick),
            PipelineSettings(quick=quick, localize=False),
            command=_command_line(),
            progress=RichStages(bar),
        )
    _finish(result, json)
