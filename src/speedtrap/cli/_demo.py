"""``speedtrap demo`` (the whole hunt on smol-moe) and ``speedtrap run --manifest FILE`` (on any stack)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from speedtrap._errors import UsageError
from speedtrap.cli._app import app, emit_json, err_console, fail, user_errors
from speedtrap.cli._options import JsonOpt, SetOpt
from speedtrap.cli._report import print_verdict
from speedtrap.progress import LogProgress, RichProgress, for_console

DEMO_DIR = Path("speedtrap-runs") / "demo"
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="The run directory (reused by a rerun).")]
QuickOpt = Annotated[
    bool, typer.Option("--quick", help="Skip each culprit's own recall probe; localize on 48 tokens instead of 96.")
]


def _bar() -> RichProgress | LogProgress:
    return for_console(err_console)


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
            err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
        raise fail(f"{len(result.errors)} stage(s) failed; the report shows what finished", 2)


def _command_line() -> str:
    """The command as typed, secrets hidden (it is written into the run directory and the report)."""
    from speedtrap._redact import redact_argv

    return " ".join(shlex.quote(a) for a in ["speedtrap", *redact_argv(sys.argv[1:])])


@app.command("demo")
@user_errors
def demo_cmd(quick: QuickOpt = False, out: OutOpt = None, json: JsonOpt = False) -> None:
    """The whole hunt on smol-moe and its eight patches: triage, probes, isolation, localization, report."""
    from speedtrap.pipeline import demo_settings, run_pipeline
    from speedtrap.report import Source

    run_dir = out or DEMO_DIR
    err_console.print(f"run directory: {run_dir}", highlight=False, markup=False)
    with _bar() as bar:
        result = run_pipeline(
            run_dir,
            Source(target="smol-moe", quick=True),
            demo_settings(quick),
            command=_command_line(),
            progress=bar,
        )
    _finish(result, json)


@app.command("run")
@user_errors
def run_cmd(
    manifest: Annotated[
        Path | None, typer.Option("--manifest", "-m", help="A speedtrap.toml describing the stack.")
    ] = None,
    target: Annotated[
        str | None, typer.Option("--target", "-t", help="An in-process target: smol-moe or hf:<type|dir|gguf>.")
    ] = None,
    patches: Annotated[
        str | None,
        typer.Option("--patches", "-p", help="In-process: the patches to search, catalogue names or module:function."),
    ] = None,
    set_: SetOpt = None,
    symbol: Annotated[
        str | None,
        typer.Option(
            "--symbol",
            help="The factor triage traces and the scale check measures (default: the factor triage reads in the "
            "culprit's diff, else routed_scaling_factor; '' for none).",
        ),
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="The probes' quick presets (CI-sized grids).")] = False,
    out: OutOpt = None,
    json: JsonOpt = False,
) -> None:
    """The whole hunt on any stack: a manifest (servers launched per configuration) or an in-process
    target with your own patches (``--target hf:deepseek_v4 --patches mypkg.patches:a,mypkg.patches:b``)."""
    from speedtrap.patching import parse_patch_list
    from speedtrap.pipeline import PipelineSettings, run_pipeline
    from speedtrap.report import Source
    from speedtrap.serve import parse_overrides
    from speedtrap.targets import resolve_target, user_patches

    if (manifest is None) == (target is None):
        raise UsageError(
            "speedtrap run needs exactly one of --manifest and --target", "pass --manifest F or --target T"
        )
    if manifest is not None:
        if patches or set_:
            raise UsageError("--patches/--set are for in-process targets", "list a manifest's patches in the manifest")
        if not manifest.is_file():
            raise UsageError(f"manifest {str(manifest)!r} does not exist", "pass the path of a speedtrap.toml")
        from speedtrap.manifest import load_manifest

        load_manifest(manifest)  # a malformed manifest, or one with a TODO left, before any run directory
        source = Source(manifest=str(manifest.resolve()), quick=quick, **_symbol(symbol))
        settings = PipelineSettings(quick=quick)  # localize runs inside the manifest's stack (live)
        run_dir = out or Path("speedtrap-runs") / f"run-{manifest.stem}"
    else:
        name = str(target)
        resolve_target(name)  # an unknown target fails here, before any progress bar
        names = tuple(parse_patch_list(patches))
        user_patches(names)  # so does a bad entry point
        overrides = parse_overrides(set_ or [])
        source = Source(target=name, quick=quick, patches=names, **_symbol(symbol))
        settings = PipelineSettings(quick=quick, patches=names or None, overrides=overrides)
        run_dir = out or Path("speedtrap-runs") / f"run-{slug_of(name)}"
    err_console.print(f"run directory: {run_dir}", highlight=False, markup=False)
    with _bar() as bar:
        result = run_pipeline(run_dir, source, settings, command=_command_line(), progress=bar)
    _finish(result, json)


def _symbol(symbol: str | None) -> dict[str, Any]:
    """Source fields of ``--symbol``: not given (the default factor, or the one triage reads), a name, or none."""
    if symbol is None:
        return {}
    return {"symbol": symbol or None, "symbol_given": True}


def slug_of(name: str) -> str:
    """A folder name for a target: ``hf:deepseek_v4`` -> ``hf-deepseek_v4``."""
    from speedtrap.rundir import slug

    return slug(Path(name).name if "/" in name else name)
