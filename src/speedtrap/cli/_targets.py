"""``speedtrap targets``, ``speedtrap patches`` and ``speedtrap check equivalence``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from speedtrap._errors import UsageError
from speedtrap.cli._app import app, check_app, emit_json, err_console, out_console, user_errors
from speedtrap.cli._options import JsonOpt
from speedtrap.patching import names_switched_on, parse_patch_list, select_patches_by_name
from speedtrap.targets import known_targets, load_target, resolve_target

TargetOpt = Annotated[str, typer.Option("--target", "-t", help="Target name (see `speedtrap targets`).")]
PatchesOpt = Annotated[
    str | None,
    typer.Option("--patches", "-p", help="Comma-separated patch names; default: those whose env var is on."),
]


@app.command()
@user_errors
def targets(json: JsonOpt = False) -> None:
    """List the known targets."""
    rows = [{"name": t.name, "description": t.description, "patches": len(t.patch_infos())} for t in known_targets()]
    if json:
        emit_json({"targets": rows})
        return
    table = Table("target", "patches", "description")
    for row in rows:
        table.add_row(str(row["name"]), str(row["patches"]), str(row["description"]))
    out_console.print(table)


@app.command()
@user_errors
def patches(target: TargetOpt = "smol-moe", json: JsonOpt = False) -> None:
    """List a target's speed patches: gate, kind, layers, phases, diff."""
    infos = resolve_target(target).patch_infos()
    if json:
        emit_json({"target": target, "patches": [i.to_json() for i in infos]})
        return
    table = Table("patch", "gate", "kind", "scope", "phases", "summary")
    for i in infos:
        table.add_row(i.name, i.gate.describe(), i.kind.value, i.scope, "+".join(sorted(i.phases)), i.summary)
    out_console.print(table)


@check_app.command("equivalence")
@user_errors
def check_equivalence_cmd(target: TargetOpt = "smol-moe", patches: PatchesOpt = None, json: JsonOpt = False) -> None:
    """Compare smol-moe (with patches) to the dense model it was built from, on fixed text."""
    from speedtrap.targets.smolmoe import SmolMoETarget, check_equivalence, dense_reference, dense_weights

    resolved = resolve_target(target)
    if not isinstance(resolved, SmolMoETarget):
        raise typer.BadParameter("equivalence is defined for smol-moe only", param_hint="--target")
    infos = resolved.patch_infos()
    names = parse_patch_list(patches) if patches is not None else names_switched_on(infos, os.environ)
    select_patches_by_name(infos, names)
    with err_console.status("loading smol-moe and its dense reference"):
        model = load_target(resolved)
        result = check_equivalence(model, dense_reference(dense_weights()), names)
    if json:
        emit_json(result.to_json())
        return
    verdict = "[green]equivalent[/]" if result.equivalent else "[red]NOT equivalent[/]"
    out_console.print(
        f"{verdict}: {result.tokens} tokens, top-1 agreement {result.top1_agreement:.4f}, "
        f"max |logit diff| {result.max_abs_logit_diff:.3g} (bound {result.bound:g}), patches: {list(result.patches)}"
    )


@app.command("export")
@user_errors
def export_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="The folder to write (new, or empty).")],
    target: TargetOpt = "smol-moe",
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="hf: a Hugging Face folder (LlamaForCausalLM); glm4-moe: the same function as Glm4MoeForCausalLM.",
        ),
    ] = "hf",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing folder.")] = False,
    json: JsonOpt = False,
) -> None:
    """Write the dense model a target is built from, for any server to serve (vLLM, SGLang, transformers)."""
    from speedtrap.targets.smolmoe import FORMATS, SmolMoETarget, check_out, dense_weights, export_hf

    if not isinstance(resolve_target(target), SmolMoETarget):
        raise UsageError(f"export is defined for smol-moe only, not {target!r}", "pass --target smol-moe")
    if format not in FORMATS:
        raise UsageError(f"--format {format!r} is not one of {', '.join(FORMATS)}", f"pass --format {FORMATS[0]}")
    check_out(out, force)  # before reading any weights
    with err_console.status("reading the dense weights"):
        result = export_hf(dense_weights(), out, overwrite=force, format=format)
    if json:
        emit_json(result.to_json())
        return
    out_console.print(f"wrote {result.out} ({result.parameters:,} parameters, float32): {', '.join(result.files)}")
