"""``speedtrap probe recall`` and ``speedtrap probe divergence`` (what they share with ``record`` and
``check``: ``_probe_common.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from speedtrap._errors import UsageError
from speedtrap.cli import _serve as _serve  # registers `speedtrap serve`
from speedtrap.cli._app import emit_json, out_console, probe_app, user_errors
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
    _close,
    _connect,
    _floats,
    _http,
    _ints,
    _is_url,
    _load_smol,
    _patch_names,
    _print_divergence,
    _print_recall,
    candidate_backend,
)

if TYPE_CHECKING:
    from speedtrap.probe import Backend, DivergenceReport, NoiseFloor


@probe_app.command("recall")
@user_errors
def recall_cmd(
    target: TargetOpt = "smol-moe",
    patches: PatchesOpt = None,
    lengths: LengthsOpt = None,
    depths: Annotated[str | None, typer.Option("--depths", help="Fact depths in [0, 1], e.g. 0.1,0.5,0.9.")] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Conversations per length.")] = None,
    seed: SeedOpt = None,
    max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", help="Answer length cap.")] = None,
    shared_prefix: Annotated[
        bool, typer.Option("--shared-prefix", help="One conversation per length and sample holds every depth's fact.")
    ] = False,
    results: Annotated[Path | None, typer.Option("--results", help="Write samples here as they finish.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Finish the samples missing from --results.")] = False,
    model: ModelOpt = "",
    api: ApiOpt = "openai",
    set_: SetOpt = None,
    concurrency: ConcurrencyOpt = 8,
    timeout: TimeoutOpt = 600.0,
    retries: RetriesOpt = 4,
    quick: QuickOpt = False,
    baseline: Annotated[
        Path | None, typer.Option("--baseline", help="A recording (speedtrap record): the drop against its answers.")
    ] = None,
    json: JsonOpt = False,
) -> None:
    """Planted-fact recall over a grid of prompt length x fact depth (options override the preset)."""
    if baseline is not None:
        from speedtrap.cli._record import recall_against

        if lengths or depths or samples is not None or seed is not None or quick or shared_prefix or results:
            raise UsageError("with --baseline FILE the recording's settings are used", "drop the grid options")
        recall_against(
            baseline,
            lambda: candidate_backend(target, model, api, patches, set_, concurrency, timeout, retries),
            json,
        )
        return
    from speedtrap.probe import InProcessBackend, RecallSettings, run_recall

    settings = RecallSettings.quick() if quick else RecallSettings()
    changes: dict[str, Any] = {}
    if lengths:
        changes["lengths"] = _ints(lengths, "lengths")
    if depths:
        changes["depths"] = _floats(depths, "depths")
    for key, value in (("samples", samples), ("seed", seed), ("max_new_tokens", max_new_tokens)):
        if value is not None:
            changes[key] = value
    if shared_prefix:
        changes["shared_prefix"] = True
    settings = replace(settings, **changes)
    if resume and results is None:
        raise UsageError("--resume needs --results", "pass --results PATH of the interrupted run")
    backend: Backend
    if _is_url(target):
        if patches or set_:
            raise UsageError("a server's patches are set when it is launched", "drop --patches/--set for a URL")
        backend = _http(target, model, concurrency, timeout, api, retries)
        asyncio.run(_connect(backend))  # an unreachable server fails here, before any progress bar
    else:
        loaded = _load_smol(target, set_, patches)
        backend = InProcessBackend(loaded, _patch_names(loaded, patches))
    report = run_recall(backend, settings, results_path=results, resume=resume, progress=True)
    if json:
        emit_json(report.to_json())
        return
    _print_recall(report)


@probe_app.command("divergence")
@user_errors
def divergence_cmd(
    target: TargetOpt = "smol-moe",
    patches: PatchesOpt = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="A recording file (speedtrap record); smol-moe: baseline patches a,b (default none); URL target: "
            "the baseline URL, or an in-process reference (hf:<dir|file.gguf>, smol-moe).",
        ),
    ] = None,
    lengths: LengthsOpt = None,
    sequences: Annotated[int | None, typer.Option("--sequences", help="Sequences per length.")] = None,
    decode_tokens: Annotated[int | None, typer.Option("--decode-tokens", help="Tail fed one token at a time.")] = None,
    bucket_size: Annotated[int | None, typer.Option("--bucket-size", help="Positions per report bucket.")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", help="Logprobs asked of a server.")] = None,
    seed: SeedOpt = None,
    model: ModelOpt = "",
    baseline_model: Annotated[str, typer.Option("--baseline-model", help="Model name on the baseline server.")] = "",
    results: Annotated[Path | None, typer.Option("--results", help="Write sequences here as they finish.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Finish the sequences missing from --results.")] = False,
    set_: SetOpt = None,
    concurrency: ConcurrencyOpt = 8,
    timeout: TimeoutOpt = 600.0,
    retries: RetriesOpt = 4,
    api: ApiOpt = "openai",
    quick: QuickOpt = False,
    floor: Annotated[
        Path | None, typer.Option("--floor", help="A noise floor (probe repeat --json): print the derived verdict.")
    ] = None,
    margin: Annotated[float, typer.Option("--margin", help="--floor: bound = floor + max(margin, floor).")] = 0.1,
    bound: Annotated[float | None, typer.Option("--bound", help="Print the verdict against this bound.")] = None,
    json: JsonOpt = False,
) -> None:
    """Teacher-forced divergence of a configuration from the baseline, by position, prefill and decode."""
    from speedtrap.patching import parse_patch_list
    from speedtrap.probe import DivergenceSettings, InProcessBackend, load_floor, run_divergence

    noise = load_floor(floor) if floor is not None else None  # a bad file fails before any probing
    settings = DivergenceSettings.quick() if quick else DivergenceSettings()
    changes: dict[str, Any] = {}
    if lengths:
        changes["lengths"] = _ints(lengths, "lengths")
    for key, value in (
        ("sequences", sequences), ("decode_tokens", decode_tokens), ("bucket_size", bucket_size),
        ("top_k", top_k), ("seed", seed),
    ):  # fmt: skip
        if value is not None:
            changes[key] = value
    if baseline and not _is_url(baseline) and Path(baseline).is_file():  # a recording of the baseline
        from speedtrap.cli._record import divergence_against

        if results or resume:
            raise UsageError("--results/--resume are for live baselines", "drop them with --baseline FILE")
        divergence_against(
            Path(baseline),
            lambda: candidate_backend(target, model, api, patches, set_, concurrency, timeout, retries),
            changes,
            quick,
            json,
        )
        return
    settings = replace(settings, **changes)
    if resume and results is None:
        raise UsageError("--resume needs --results", "pass --results PATH of the interrupted run")
    base: Backend
    cand: Backend
    if _is_url(target):
        if not baseline:
            raise UsageError(
                "a URL target needs --baseline URL of the baseline server", "pass --baseline http://... or hf:<dir>"
            )
        if patches or set_:
            raise UsageError("a server's patches are set when it is launched", "drop --patches/--set for a URL")
        cand = _http(target, model, concurrency, timeout, api, retries)
        if _is_url(baseline):
            base = _http(baseline, baseline_model, concurrency, timeout, api, retries)
        else:  # an in-process reference (transformers or smol-moe), its patches off
            reference = _load_smol(baseline, None)
            base = InProcessBackend(reference, [], name=f"{baseline}[in-process]")
        asyncio.run(_connect(cand, base))
    else:
        if baseline and _is_url(baseline):
            raise UsageError("--baseline is a list of patches for an in-process target", "pass --baseline a,b")
        loaded = _load_smol(target, set_, ",".join([patches or "", baseline or ""]))
        base = InProcessBackend(loaded, parse_patch_list(baseline))
        cand = InProcessBackend(loaded, _patch_names(loaded, patches))
    try:
        report = run_divergence(base, cand, settings, results_path=results, resume=resume, progress=True)
    finally:
        asyncio.run(_close(base, cand))
    verdict = _verdict(report, noise, margin, bound) if noise is not None or bound is not None else None
    if json:
        emit_json({**report.to_json(), **({"verdict": verdict} if verdict else {})})
        return
    _print_divergence(report)
    if verdict:
        word = "FAIL" if verdict["fails"] else "pass"
        out_console.print(f"verdict: {word}: {verdict['metric']} {verdict['value']:.4g} vs {verdict['bound']:.4g} "
                          f"({verdict['origin']})", highlight=False)  # fmt: skip


def _verdict(report: DivergenceReport, floor: NoiseFloor | None, margin: float, bound: float | None) -> dict[str, Any]:
    """worst.kl_p99 against ``bound`` if given (it wins), else against the bound derived from ``floor``."""
    from speedtrap.spec import DEFAULT_BOUND, Bound

    explicit = Bound.of(DEFAULT_BOUND.metric, bound, origin="the explicit --bound") if bound is not None else None
    limit = Bound.resolve(explicit, floor, DEFAULT_BOUND.metric, margin)
    value = report.figures()[limit.metric]
    return {"metric": limit.metric, "value": value, "bound": limit.value, "origin": limit.origin,
            "fails": limit.fails(value)}  # fmt: skip
