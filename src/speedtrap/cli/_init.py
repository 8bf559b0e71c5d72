"""``speedtrap init``: a manifest with one commit patch per commit of a range (triage fills in the rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from speedtrap._errors import UsageError
from speedtrap.cli._app import app, emit_json, err_console, user_errors


@app.command("init")
@user_errors
def init_cmd(
    repo: Annotated[Path, typer.Option("--repo", help="The stack's git checkout (only read).")],
    range_: Annotated[str, typer.Option("--range", help="BASE..HEAD: one patch per commit after BASE.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the manifest.")] = Path("speedtrap.toml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out if it exists.")] = False,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """Write a manifest of commit patches: names from their subjects, triage's tiers as comments and prior."""
    from speedtrap.triage import init_manifest

    if out.exists() and not force:
        raise UsageError(f"{str(out)!r} already exists", "pass --force to overwrite it, or choose --out")
    result = init_manifest(repo, range_)
    try:
        out.write_text(result.text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {str(out)!r}: {exc.strerror}", "choose another --out") from None
    if json:
        emit_json({**result.to_json(), "path": str(out)})
        return
    for p in result.patches:
        tier = f"tier {p['tier']}" if p["tier"] is not None else "-"
        err_console.print(f"{p['commit'][:10]}  {tier:7}  {p['name']}", highlight=False)
    err_console.print(f"wrote {out}: fill in [target] launch, then `speedtrap run --manifest {out}`", highlight=False)
