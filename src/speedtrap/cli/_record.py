"""``speedtrap record`` (a baseline to a file), and probes and ``check --against`` against a recording."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from speedtrap._errors import UsageError
from speedtrap.cli._app import app, check_app, emit_json, err_console, out_console, user_errors
from speedtrap.cli._options import (
    ApiOpt,
    ConcurrencyOpt,
    JsonOpt,
    LengthsOpt,
    ModelOpt,
    PatchesOpt,
    QuickOpt,
    RetriesOpt,
    SeedOpt,
    SetOpt,
    TargetOpt,
    TimeoutOpt,
)
from speedtrap.cli._probe_common import (
    _floats,
    _ints,
    _is_url,
    _print_divergence,
    _print_recall,
    candidate_backend,
)
from speedtrap.cli._repeat import store_floor

if TYPE_CHECKING:
    from speedtrap.probe import AgainstRecording, Backend, RecallComparison, Recording

PROBES = ("divergence", "recall", "all")


@app.command("record")
@user_errors
def record_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="The recording file to write (e.g. baseline.strec).")],
    target: TargetOpt = "smol-moe",
    probe: Annotated[str, typer.Option("--probe", help="divergence, recall or all.")] = "divergence",
    patches: PatchesOpt = None,
    lengths: LengthsOpt = None,
    sequences: Annotated[int | None, typer.Option("--sequences", help="Divergence sequences per length.")] = None,
    decode_tokens: Annotated[int | None, typer.Option("--decode-tokens", help="Tail fed one token at a time.")] = None,
    bucket_size: Annotated[int | None, typer.Option("--bucket-size", help="Positions per report bucket.")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Logprobs kept per position.")] = None,
    depths: Annotated[str | None, typer.Option("--depths", help="Recall fact depths, e.g. 0.1,0.5,0.9.")] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Recall conversations per length.")] = None,
    seed: SeedOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Finish an interrupted recording in --out.")] = False,
    model: ModelOpt = "",
    api: ApiOpt = "openai",
    set_: SetOpt = None,
    concurrency: ConcurrencyOpt = 8,
    timeout: TimeoutOpt = 600.0,
    retries: RetriesOpt = 4,
    quick: QuickOpt = False,
    floor: Annotated[
        bool,
        typer.Option("--floor", help="Also measure the stack's noise floor (probe repeat) and store it with it."),
    ] = False,
    json: JsonOpt = False,
) -> None:
    """Record a baseline: per position the top-k logprobs and tail mass, decode steps, recall answers, identity."""
    from speedtrap.probe import DivergenceSettings, RecallSettings, RepeatSettings, record, run_repeat

    if probe not in PROBES:
        raise UsageError(f"unknown --probe {probe!r}", "choose divergence, recall or all")
    div = rec = None
    if probe in ("divergence", "all"):
        div = DivergenceSettings.quick() if quick else DivergenceSettings()
        changes: dict[str, Any] = {"lengths": _ints(lengths, "lengths")} if lengths else {}
        for key, value in (("sequences", sequences), ("decode_tokens", decode_tokens), ("bucket_size", bucket_size),
                           ("top_k", top_k), ("seed", seed)):  # fmt: skip
            if value is not None:
                changes[key] = value
        div = replace(div, **changes)
    if probe in ("recall", "all"):
        rec = RecallSettings.quick() if quick else RecallSettings()
        rchanges: dict[str, Any] = {"lengths": _ints(lengths, "lengths")} if lengths else {}
        if depths:
            rchanges["depths"] = _floats(depths, "depths")
        for key, value in (("samples", samples), ("seed", seed)):
            if value is not None:
                rchanges[key] = value
        rec = replace(rec, **rchanges)
    backend = candidate_backend(target, model, api, patches, set_, concurrency, timeout, retries)
    recording = record(backend, out, divergence=div, recall=rec, resume=resume, progress=True, target=target)
    if floor:  # the same server, still up: its own noise, stored where every check against it finds it
        settings = RepeatSettings.quick() if quick else RepeatSettings()
        if div is not None:
            settings = replace(settings, lengths=div.lengths, top_k=div.top_k, seed=div.seed)
        store_floor(out, run_repeat(backend, settings, progress=True))
        recording = load_recording(out)
    summary = recording.summary()
    if json:
        emit_json(summary)
        return
    positions = summary["positions"]
    out_console.print(
        f"recorded {summary['sequences']} sequence(s) ({positions} positions) and {summary['recall_samples']} recall "
        f"answer(s) of {recording.identity.model} into {out} ({summary['bytes']:,} bytes)",
        highlight=False,
    )


def load_recording(path: str | Path) -> Recording:
    from speedtrap.probe import read_recording

    return read_recording(Path(path))


def divergence_against(
    recording_path: Path, make: Callable[[], Backend], changes: dict[str, Any], quick: bool, json: bool
) -> None:
    """``probe divergence --baseline FILE``: the candidate against a recording (checked before it is loaded).

    Settings default to the recording's; options given (or ``--quick``) must agree with it.
    """
    from speedtrap.probe import DivergenceSettings, resolve_settings, run_against

    recording = load_recording(recording_path)
    asked = None
    if changes or quick:
        start = DivergenceSettings.quick() if quick else resolve_settings(recording, "divergence", None)
        asked = replace(start, **changes)
    resolve_settings(recording, "divergence", asked)
    result = run_against(recording, make(), ["divergence"], asked, progress=True)
    assert result.divergence is not None
    if json:
        emit_json({**result.divergence.to_json(), "notes": result.notes})
        return
    _print_divergence(result.divergence)
    _print_notes(result)


def recall_against(recording_path: Path, make: Callable[[], Backend], json: bool) -> None:
    """``probe recall --baseline FILE``: the answers' drop against the recorded ones."""
    from speedtrap.probe import resolve_settings, run_against

    recording = load_recording(recording_path)
    resolve_settings(recording, "recall", None)
    result = run_against(recording, make(), ["recall"], progress=True)
    assert result.recall is not None
    if json:
        emit_json({**result.recall.to_json(), "notes": result.notes})
        return
    _print_recall(result.recall.candidate)
    _print_recall_drop(result.recall)
    _print_notes(result)


def _print_recall_drop(c: RecallComparison) -> None:
    b, r = c.baseline.overall, c.candidate.overall
    out_console.print(
        f"recorded baseline {b.correct}/{b.n} = {b.accuracy:.2f} (95% {b.low:.2f}-{b.high:.2f}); drop {c.drop:+.2f}; "
        f"intervals {'overlap' if c.overlap else 'do not overlap'}; {len(c.changed)} answer(s) changed",
        highlight=False,
    )
    del r


def _print_notes(result: AgainstRecording) -> None:
    for note in result.notes:
        err_console.print(f"note: {note}", highlight=False)


# -- speedtrap check --against -----------------------------------------------------------------


@check_app.callback(invoke_without_command=True)
@user_errors
def check_callback(
    ctx: typer.Context,
    against: Annotated[
        Path | None, typer.Option("--against", help="A recording of the trusted build (speedtrap record).")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option("--target", "-t", help="The build to gate: a server URL, smol-moe or hf:<model> (--patches)."),
    ] = None,
    bound: Annotated[
        list[str] | None,
        typer.Option("--bound", help="METRIC<=VALUE or METRIC>=VALUE (repeatable; default worst.kl_p99<=0.1)."),
    ] = None,
    margin: Annotated[float, typer.Option("--margin", help="Recall: extra drop needed beyond the intervals.")] = 0.0,
    probe: Annotated[
        str, typer.Option("--probe", help="divergence, recall or all (what the recording holds).")
    ] = "all",
    junit: Annotated[Path | None, typer.Option("--junit", help="Write a JUnit XML report here.")] = None,
    manifest: Annotated[
        Path | None, typer.Option("--manifest", "-m", help="With --bisect-on-fail: the stack's speedtrap.toml.")
    ] = None,
    bisect_on_fail: Annotated[
        bool, typer.Option("--bisect-on-fail", help="On a regression, find the culprit patches (needs --manifest).")
    ] = False,
    localize: Annotated[
        bool, typer.Option("--localize", help="--bisect-on-fail: then localize each culprit inside the stack (live).")
    ] = False,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="--bisect-on-fail: where trials are kept.")] = None,
    config: Annotated[
        str | None,
        typer.Option("--config", help="No --target: the patches the launched build has on (default: every one)."),
    ] = None,
    stop_command: Annotated[
        str | None,
        typer.Option("--stop-command", help="A URL --target with --bisect-on-fail: stops it before the hunt."),
    ] = None,
    patches: PatchesOpt = None,
    set_: SetOpt = None,
    model: ModelOpt = "",
    api: ApiOpt = "openai",
    concurrency: ConcurrencyOpt = 8,
    timeout: TimeoutOpt = 600.0,
    retries: RetriesOpt = 4,
    json: JsonOpt = False,
) -> None:
    """Gate a build against a recording: exit 0 within bounds, 1 on a regression, 2 on bad input or errors.

    Without --target, the build is launched from --manifest (a stack of roles or one server), checked,
    and stopped before any hunt: one stack alive at a time. Subcommands: ``check equivalence`` and
    ``check scale``.
    """
    if ctx.invoked_subcommand is not None:
        return
    if against is None or (target is None and manifest is None):
        raise UsageError(
            "speedtrap check needs --against FILE and --target T, or --manifest F to launch the build "
            "(or a subcommand)",
            "see --help",
        )
    if bisect_on_fail and manifest is None:
        raise UsageError("--bisect-on-fail needs --manifest FILE", "pass the stack's speedtrap.toml")
    if config is not None and target is not None:
        raise UsageError("--config names the build check launches from --manifest", "drop --target, or --config")
    if stop_command is not None and (target is None or not _is_url(target)):
        raise UsageError("--stop-command stops a --target URL before the hunt", "drop --stop-command")
    if bisect_on_fail and target is not None and _is_url(target) and stop_command is None:
        raise UsageError(
            "--bisect-on-fail with a --target URL would launch every trial while the checked build still runs "
            "(two stacks at once)",
            "drop --target so check launches the build from --manifest and stops it before the hunt, "
            "or pass --stop-command 'CMD' that stops it",
        )
    if probe not in PROBES:
        raise UsageError(f"unknown --probe {probe!r}", "choose divergence, recall or all")
    from speedtrap.manifest import load_manifest

    written = load_manifest(manifest) if manifest is not None else None  # read once, handed to every stage
    from speedtrap.probe import resolve_settings
    from speedtrap.progress import LineProgress
    from speedtrap.regress import GateRequest, junit_xml, run_gate
    from speedtrap.spec import Bound

    recording = load_recording(against)
    noise = recording.floor if "divergence" in recording.kinds else None
    bounds = [Bound.parse(b) for b in bound or []] or [Bound.resolve(None, noise)]  # explicit, else floor, else default
    if not bound and noise is not None:
        err_console.print(f"verdict: {bounds[0].origin} (stored with the recording)", highlight=False)
    kinds = recording.kinds if probe == "all" else [probe]
    for kind in kinds:
        resolve_settings(recording, kind, None)
    request = GateRequest(
        kinds, bounds, margin, target, config, None if api == "openai" else api, model,
        bisect_on_fail, stop_command, localize, run_dir,
    )  # fmt: skip
    run = run_gate(
        recording,
        request,
        written,
        lambda: candidate_backend(str(target), model, api, patches, set_, concurrency, timeout, retries),
        LineProgress(err_console),
        lambda line: err_console.print(line, highlight=False, markup=False),
    )
    result, hunt = run.result, run.hunt
    if junit is not None:
        try:
            junit.parent.mkdir(parents=True, exist_ok=True)
            junit.write_text(junit_xml(result), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write --junit {str(junit)!r}: {exc.strerror}", "pass a writable path") from None
    localized = None
    if run.localized is not None:
        from speedtrap.cli._localize import print_localized

        localized = print_localized(run.localized)
    if json:
        doc = {**result.to_json(), "bisect": hunt.to_json() if hunt is not None else None}
        if localize:
            doc["localize"] = localized
        emit_json({**doc, "bisect_error": run.hunt_error} if run.hunt_error is not None else doc)
    else:
        _print_gate(result, hunt)
        if run.hunt_error is not None:
            err_console.print(f"the hunt after the regression failed: {run.hunt_error}", highlight=False, markup=False)
    raise typer.Exit(result.exit_code)


def _print_gate(result: Any, hunt: Any) -> None:
    for check in result.checks:
        mark = "PASS" if check.passed else "FAIL"
        out_console.print(f"{mark} {check.probe}: {check.message}", highlight=False)
    for note in result.notes:
        out_console.print(f"note: {note}", highlight=False)
    if result.reading:
        out_console.print(f"reading: {result.reading}", highlight=False, markup=False, soft_wrap=True)
    if result.passed:
        out_console.print(f"speedtrap check: pass against {result.recording}", highlight=False)
        return
    failed = result.failures()
    out_console.print(f"speedtrap check: REGRESSION ({len(failed)} of {len(result.checks)} checks failed)",
                      highlight=False)  # fmt: skip
    if hunt is not None:
        out_console.print(hunt.summary(), highlight=False)
        names = ["+".join(c) for c in hunt.culprit_names]
        out_console.print(f"culprits: {', '.join(names) if names else 'none found'}", highlight=False)
