"""``speedtrap probe repeat``: the determinism probe (the stack's own noise floor), and --floor verdicts."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from speedtrap._errors import UsageError
from speedtrap.cli._app import emit_json, err_console, out_console, probe_app, user_errors
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
from speedtrap.cli._probe_common import _close, _connect, _http, _ints, _is_url, _load_smol, _patch_names

if TYPE_CHECKING:
    from speedtrap.probe import Backend, RepeatReport


@probe_app.command("repeat")
@user_errors
def repeat_cmd(
    target: TargetOpt = "smol-moe",
    patches: PatchesOpt = None,
    lengths: LengthsOpt = None,
    sequences: Annotated[int | None, typer.Option("--sequences", help="Sequences per length.")] = None,
    batch: Annotated[
        int | None, typer.Option("--batch", help="Other requests in flight with the batched copy.")
    ] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Logprobs asked of a server.")] = None,
    seed: SeedOpt = None,
    model: ModelOpt = "",
    set_: SetOpt = None,
    concurrency: ConcurrencyOpt = 8,
    timeout: TimeoutOpt = 600.0,
    retries: RetriesOpt = 4,
    api: ApiOpt = "openai",
    quick: QuickOpt = False,
    into: Annotated[
        Path | None,
        typer.Option("--into", help="Store the floor in this recording (its checks then derive their bound from it)."),
    ] = None,
    json: JsonOpt = False,
) -> None:
    """Send the same teacher-forced requests again, alone and in a batch: the noise floor, and what repeats change."""
    from speedtrap.probe import InProcessBackend, RepeatSettings, read_recording, run_repeat

    if into is not None:
        read_recording(into)  # a bad recording is one line now, before any request

    settings = RepeatSettings.quick() if quick else RepeatSettings()
    changes: dict[str, Any] = {}
    if lengths:
        changes["lengths"] = _ints(lengths, "lengths")
    for key, value in (("sequences", sequences), ("batch", batch), ("top_k", top_k), ("seed", seed)):
        if value is not None:
            changes[key] = value
    settings = replace(settings, **changes)
    backend: Backend
    if _is_url(target):
        if patches or set_:
            raise UsageError("a server's patches are set when it is launched", "drop --patches/--set for a URL")
        backend = _http(target, model, max(concurrency, settings.batch + 1), timeout, api, retries)
        asyncio.run(_connect(backend))
    else:
        loaded = _load_smol(target, set_, patches)
        backend = InProcessBackend(loaded, _patch_names(loaded, patches))
    try:
        report = run_repeat(backend, settings, progress=True)
    finally:
        asyncio.run(_close(backend))
    if into is not None:
        store_floor(into, report)
    if json:
        emit_json(report.to_json())
        return
    print_repeat(report)


def store_floor(path: Path, report: RepeatReport) -> None:
    """Append the floor to a recording: checks and bisections against it derive their bound from it."""
    from speedtrap.probe import add_extension

    add_extension(path, "floor", report.floor.to_json())
    err_console.print(f"stored the noise floor in {path} ({report.floor.describe()})", highlight=False)


def print_repeat(report: RepeatReport) -> None:
    f = report.floor
    table = Table("comparison", "positions", "KL mean", "p99", "max", "same top-1", title=f"repeat {report.backend}")
    for label, s in (("first vs second (alone)", f.repeat), ("alone vs in a batch", f.batch), ("floor", f.overall)):
        table.add_row(label, str(s.tokens), f"{s.kl_mean:.3g}", f"{s.kl_p99:.3g}", f"{s.kl_max:.3g}",
                      f"{s.same_top1:.3f}")  # fmt: skip
    out_console.print(table)
    for finding in report.findings:
        out_console.print(f"finding: {finding.message}", highlight=False)
    if f.excluded:
        out_console.print(f"the floor leaves out: {', '.join(f.excluded)} (a finding, not noise)", highlight=False)
    from speedtrap.spec import Bound

    derived = Bound.from_floor(f)  # the spec's rule: floor + max(margin, floor) on worst.kl_p99
    out_console.print(
        f"derived verdict: fail when {derived.metric} > {derived.value:.4g} ({derived.origin})", highlight=False
    )
    if f.note:
        err_console.print(f"note: {f.note}", highlight=False)
