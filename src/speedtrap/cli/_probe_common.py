"""What the probe commands share (``probe recall/divergence/repeat``, ``record``, ``check --against``):
option parsers, the backend a ``--target`` names (a server URL or an in-process target with patches), and
the tables a probe report prints."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from rich.table import Table

from speedtrap._errors import UsageError
from speedtrap.cli._app import err_console, out_console

if TYPE_CHECKING:
    from speedtrap.probe import Backend, DivergenceReport, RecallReport


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--{what} must be integers, comma-separated: {text!r}", f"pass --{what} 256,512") from None


def _floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--{what} must be numbers, comma-separated: {text!r}", f"pass --{what} 0.1,0.9") from None


def _is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def _http(url: str, model: str, concurrency: int, timeout: float, api: str, retries: int = 4) -> Backend:
    from speedtrap.probe import HttpBackend

    if api not in {"openai", "vllm", "sglang"}:
        raise UsageError(f"unknown --api {api!r}", "choose openai, vllm or sglang")
    key = os.environ.get("SPEEDTRAP_API_KEY")  # sent as a bearer token, never printed
    return HttpBackend(
        url,
        model,
        concurrency=concurrency,
        timeout=timeout,
        retries=retries,
        api=api,  # type: ignore[arg-type]
        api_key=key,
    )


def _load_smol(target: str, overrides: list[str] | None, patches: str | None = None) -> Any:
    """An in-process target with the user patches among ``patches`` (imported before the slow load)."""
    from speedtrap.patching import parse_patch_list
    from speedtrap.targets import load_target, parse_overrides, resolve_target

    resolved = resolve_target(target)  # a bad name fails before the spinner
    with err_console.status(f"loading {target}"):
        return load_target(resolved, parse_overrides(overrides or []), parse_patch_list(patches))


def _patch_names(model: Any, patches: str | None) -> list[str]:
    from speedtrap.patching import parse_patch_list
    from speedtrap.targets import patches_switched_on

    return parse_patch_list(patches) if patches is not None else patches_switched_on(model)


def candidate_backend(
    target: str, model: str, api: str, patches: str | None, set_: list[str] | None, concurrency: int, timeout: float,
    retries: int,
) -> Backend:  # fmt: skip
    """A server URL (patches set at its launch) or an in-process target with patches."""
    from speedtrap.probe import InProcessBackend

    if _is_url(target):
        if patches or set_:
            raise UsageError("a server's patches are set when it is launched", "drop --patches/--set for a URL")
        backend = _http(target, model, concurrency, timeout, api, retries)
        asyncio.run(_connect(backend))  # an unreachable server fails here, before any progress bar
        return backend
    loaded = _load_smol(target, set_, patches)  # user patches (module:function) join the catalogue
    return InProcessBackend(loaded, _patch_names(loaded, patches))


async def _connect(*backends: Backend) -> None:
    for b in backends:
        connect = getattr(b, "connect", None)
        if connect is not None:
            await connect()


async def _close(*backends: Backend) -> None:
    for b in backends:
        await b.aclose()


def _print_recall(report: RecallReport) -> None:
    table = Table("length", "depth", "n", "accuracy", "95% interval", "prompt tokens", title=f"recall {report.backend}")
    for c in report.cells:
        table.add_row(str(c.length), f"{c.depth:g}", str(c.n), f"{c.accuracy:.2f}", f"{c.low:.2f}-{c.high:.2f}",
                      str(c.prompt_tokens))  # fmt: skip
    out_console.print(table)
    o = report.overall
    out_console.print(
        f"overall {o.correct}/{o.n} = {o.accuracy:.2f} (95% {o.low:.2f}-{o.high:.2f}) in {report.elapsed_s:.1f} s",
        highlight=False,
    )


def _print_divergence(report: DivergenceReport) -> None:
    for phase, div in report.phases.items():
        table = Table(
            "positions", "tokens", "KL mean", "median", "p90", "p99", "max", "same top-1", "RMS dp",
            title=f"{phase}: {report.candidate} vs {report.baseline}",
        )  # fmt: skip
        rows = [("all", div.overall), *((f"{b.start}-{b.end - 1}", b.stats) for b in div.by_bucket)]
        for label, s in rows:
            table.add_row(label, str(s.tokens), f"{s.kl_mean:.3g}", f"{s.kl_median:.3g}", f"{s.kl_p90:.3g}",
                          f"{s.kl_p99:.3g}", f"{s.kl_max:.3g}", f"{s.same_top1:.3f}", f"{s.rms_dp:.3g}")  # fmt: skip
        out_console.print(table)
    worst = {k: v for k, v in report.figures().items() if k.startswith("worst.")}
    if worst:  # the figures a verdict (--bound, check --against, the manifest's [verdict]) reads
        out_console.print("  ".join(f"{k} {v:.4g}" for k, v in sorted(worst.items())), highlight=False)
    note = report.figures_note()
    if note:  # stopped once the verdict was decided: the phases not measured are not in the tables above
        out_console.print(note, highlight=False, markup=False, soft_wrap=True)
    reading = report.reading()
    if reading:
        out_console.print(f"reading: {reading}", highlight=False, markup=False, soft_wrap=True)
    for side, engine in report.engines.items():
        out_console.print(f"{side}: {engine}", highlight=False)
    if report.keys.get("unmapped") or report.keys.get("mapped"):
        out_console.print(
            f"token names mapped to ids: {report.keys['mapped']}, left as text (unmapped): {report.keys['unmapped']}"
            + (f" e.g. {report.keys['examples']!r}" if report.keys.get("examples") else ""),
            highlight=False,
        )
    if report.approximation:
        err_console.print(f"note: {report.approximation}", highlight=False, markup=False)
