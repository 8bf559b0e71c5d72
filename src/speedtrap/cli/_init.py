"""``speedtrap init``: a manifest with one commit patch per commit of a range (triage fills in the rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from speedtrap._errors import UsageError
from speedtrap.cli._app import app, emit_json, err_console, user_errors


@app.command("init")
@user_errors
def init_cmd(
    repo: Annotated[Path | None, typer.Option("--repo", help="The stack's git checkout (only read).")] = None,
    range_: Annotated[str | None, typer.Option("--range", help="BASE..HEAD: one patch per commit after BASE.")] = None,
    pid: Annotated[
        list[int] | None,
        typer.Option("--pid", help="A running process of the stack (repeat for each role): read from /proc."),
    ] = None,
    ssh: Annotated[
        str | None, typer.Option("--ssh", help="Read the pids on this host (ssh HOST cat /proc/...).")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="With --pid: the commits after this ref, up to the checkout's HEAD.")
    ] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the manifest.")] = Path("speedtrap.toml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out if it exists.")] = False,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Write a manifest: from running processes (--pid: launch lines, switches, the commits of a range of the
    checkout the engine imports), or from a repository's range (--repo --range: commit patches, launch left to fill)."""
    if out.exists() and not force:
        raise UsageError(f"{str(out)!r} already exists", "pass --force to overwrite it, or choose --out")
    if pid:
        _from_pids(pid, ssh, since, range_, repo, out, json)
        return
    if repo is None or range_ is None:
        raise UsageError("init needs --pid (running processes) or --repo and --range", "e.g. --pid 4242 --since v0.5.0")
    if ssh is not None or since is not None:
        raise UsageError("--ssh and --since go with --pid", "pass --pid, or use --range with --repo")
    from speedtrap.triage import init_manifest

    result = init_manifest(repo, range_)
    if _written(out, result.text, result.to_json() if json else None):
        return
    for p in result.patches:
        tier = f"tier {p['tier']}" if p["tier"] is not None else "-"
        err_console.print(f"{p['commit'][:10]}  {tier:7}  {p['name']}", highlight=False)
    err_console.print(f"wrote {out}: fill in [target] launch, then `speedtrap run --manifest {out}`", highlight=False)


def _from_pids(
    pids: list[int], ssh: str | None, since: str | None, rng: str | None, repo: Path | None, out: Path, json: bool
) -> None:
    from speedtrap.stack import init_from_pids

    if repo is not None:
        raise UsageError(
            "--repo goes with --range alone", "drop --repo: with --pid the checkout is the one the engine imports"
        )
    result = init_from_pids(pids, ssh, since, rng)
    if _written(out, result.text, result.to_json() if json else None):
        return
    for r in result.roles:
        err_console.print(f"{r['role']:8} pid {r['pid']}  {r['engine']}  port {r['port']}", highlight=False)
    err_console.print(f"patches: {', '.join(result.patches) or 'none'}", highlight=False)
    for todo in result.todos:
        err_console.print(f"TODO {todo}", highlight=False)
    then = "fill in the TODO lines, then" if result.todos else "then"
    err_console.print(f"wrote {out}: {then} `speedtrap run --manifest {out}`", highlight=False)


def _written(out: Path, text: str, as_json: dict[str, Any] | None) -> bool:
    """Write the manifest to ``out``; with ``as_json`` print it as one JSON object (True: nothing more to print)."""
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {str(out)!r}: {exc.strerror}", "choose another --out") from None
    if as_json is not None:
        emit_json({**as_json, "path": str(out)})
    return as_json is not None
