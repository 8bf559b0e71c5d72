"""``speedtrap bisect``: find the culprit patch sets, in-process (``--target``) or by relaunching servers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from speedtrap._errors import UsageError
from speedtrap.cli._app import app, emit_json, err_console, out_console, user_errors
from speedtrap.cli._options import JsonOpt, SetOpt
from speedtrap.patching import parse_patch_list
from speedtrap.progress import RichProgress


@app.command("bisect")
@user_errors
def bisect_cmd(
    target: Annotated[str | None, typer.Option("--target", "-t", help="An in-process target: smol-moe.")] = None,
    manifest: Annotated[
        Path | None, typer.Option("--manifest", "-m", help="A speedtrap.toml: a server launched per configuration.")
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="Where trials, logs and the result are kept.")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted run in --run-dir.")] = False,
    patches: Annotated[
        str | None, typer.Option("--patches", "-p", help="--target: comma-separated patches to search (default all).")
    ] = None,
    prior: Annotated[
        str | None, typer.Option("--prior", help="Likely suspects first, comma-separated (e.g. triage's tier 1).")
    ] = None,
    set_: SetOpt = None,
    probe: Annotated[str | None, typer.Option("--probe", help="--target: divergence (default) or recall.")] = None,
    metric: Annotated[str | None, typer.Option("--metric", help="The figure the verdict reads.")] = None,
    bound: Annotated[float | None, typer.Option("--bound", help="Fail above (or below) this value.")] = None,
    repeats: Annotated[
        int | None, typer.Option("--repeats", help="Extra trials for a verdict near the threshold.")
    ] = None,
    floor: Annotated[
        Path | None,
        typer.Option("--floor", help="A noise floor (speedtrap probe repeat --json): the bound derives from it."),
    ] = None,
    margin: Annotated[
        float, typer.Option("--margin", help="--floor: bound = floor + max(margin, floor), in the figure's unit.")
    ] = 0.1,
    threads: Annotated[
        int | None, typer.Option("--threads", help="--target: torch intra-op threads (default: torch's).")
    ] = None,
    executor: Annotated[
        str | None,
        typer.Option("--executor", help="local (default) or ray: trials on a Ray cluster."),
    ] = None,
    address: Annotated[
        str | None, typer.Option("--address", help="--executor ray: the head's host:port (default: a local cluster).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", help="Trials at once (servers or Ray workers; Ray's default: what fits)."),
    ] = None,
    localize: Annotated[
        bool, typer.Option("--localize", help="--manifest: then localize each culprit inside the stack (live).")
    ] = False,
    json: JsonOpt = False,
) -> None:
    """Find every minimal set of patches that makes the stack fail, and say which ones only interact."""
    import dataclasses

    from speedtrap.isolate import build_manifest, default_run_dir, isolate, make_executor

    if (target is None) == (manifest is None):
        raise UsageError("give exactly one of --target or --manifest", "e.g. --target smol-moe")
    if localize and manifest is None:
        raise UsageError("--localize is for --manifest (a stack)", "in-process: speedtrap run --target T localizes")
    if manifest is not None and (patches or set_ or probe):
        raise UsageError("--patches, --set and --probe are for --target", "write them in the manifest instead")
    from speedtrap.probe import load_floor

    noise = load_floor(floor) if floor is not None else None
    spec = build_manifest(
        target, manifest, parse_patch_list(patches) or None, set_ or [], probe, metric, bound, repeats,
        parse_patch_list(prior), noise, margin,
    )  # fmt: skip
    if spec.verdict.origin:
        err_console.print(f"verdict: fail when {spec.verdict.metric} > {spec.verdict.bound:.4g}; {spec.verdict.origin}",
                          highlight=False)  # fmt: skip
    if executor is not None:
        if executor not in ("local", "ray"):
            raise UsageError(f"--executor {executor!r} is not local or ray", "pass --executor ray")
        spec = dataclasses.replace(spec, executor=executor)
    if address is not None:
        if spec.executor != "ray":
            raise UsageError("--address is for --executor ray", "add --executor ray")
        spec = dataclasses.replace(spec, address=address)
    if threads is not None:
        if threads < 1:
            raise UsageError(f"--threads {threads} must be at least 1", "pass --threads 1")
        import torch

        torch.set_num_threads(threads)
    directory = run_dir or default_run_dir(spec)
    err_console.print(f"run directory: {escape(str(directory))}", highlight=False)
    runner = make_executor(spec, workers)
    if spec.executor == "ray":
        err_console.print(f"ray: {runner.capacity} worker(s), one trial each", highlight=False)
    try:
        with RichProgress(err_console, transient=True) as bar:
            result = isolate(spec, directory, resume=resume, executor=runner, progress=bar)
    finally:
        runner.close()
    if not json:
        _print(result)
    localized = None
    if localize:
        from speedtrap.cli._localize import localize_culprits

        localized = localize_culprits(spec, [tuple(c) for c in result.culprit_names], directory / "localize")
    if json:
        emit_json({"run_dir": str(directory), **result.to_json(), **({"localize": localized} if localize else {})})
    hint = inconclusive_hint(result, spec.verdict)
    if hint:
        err_console.print(escape(hint), highlight=False)
        raise typer.Exit(1)


def inconclusive_hint(result: object, verdict: object) -> str:
    """For an inconclusive hunt, what to change (a success it is not: the exit code is 1); else ""."""
    from speedtrap.isolate import IsolateResult, Status

    assert isinstance(result, IsolateResult)
    if result.status is not Status.INCONCLUSIVE:
        return ""
    metric = str(getattr(verdict, "metric", ""))
    near = [j for j in result.judgements if j.verdict.value == "inconclusive"]
    shown = "; ".join(
        f"{'+'.join(j.config) or '(baseline)'}" + (f": {j.figures[metric]:.4g}" if metric in j.figures else "")
        for j in near[:4]
    )
    repeats = getattr(verdict, "repeats", None)
    bound = getattr(verdict, "bound", None)
    return (
        f"inconclusive: {len(near) or 'some'} verdict(s) the search needed stayed near the bound {bound}"
        + (f" ({shown})" if shown else "")
        + f"; raise [verdict] repeats (now {repeats}) so those configurations are measured again, "
        "or move the bound (--bound) away from where they land"
    )


def _print(result: object) -> None:
    from speedtrap.isolate import IsolateResult

    assert isinstance(result, IsolateResult)
    out_console.print(escape(result.summary()), highlight=False)
    metric = str(result.rule.get("metric", "")) if result.rule.get("rule") == "threshold" else "accuracy"
    table = Table("trial", "configuration", "repeat", "outcome", metric, "log")
    for t in result.trials:
        figures = f"{t.figures[metric]:.4g}" if metric in t.figures else ""
        table.add_row(
            str(t.index) + (" (stored)" if t.reused else ""),
            "+".join(t.config) or "(baseline)",
            str(t.repeat),
            t.outcome.value if t.outcome else f"failed: {t.error}",
            figures,
            t.log_path or "",
        )
    out_console.print(table)
