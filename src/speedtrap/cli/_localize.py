"""``speedtrap diff layers`` and ``speedtrap check scale``: where the numbers go wrong, and why."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Column, Table

from speedtrap._errors import UsageError
from speedtrap.cli._app import app, check_app, emit_json, err_console, out_console, user_errors
from speedtrap.cli._options import JsonOpt, PatchesOpt, SetOpt
from speedtrap.patching import parse_patch_list
from speedtrap.targets import InProcessModel

if TYPE_CHECKING:
    from speedtrap.localize import LayerDiffResult, ScaleCheckResult, StackLocalization
    from speedtrap.manifest import Manifest

diff_app = typer.Typer(
    help="Compare a patched configuration with the baseline, module by module.", no_args_is_help=True
)
app.add_typer(diff_app, name="diff")

TargetOpt = Annotated[
    str,
    typer.Option("--target", "-t", help="smol-moe, hf:<model type> (deepseek_v4, ...), hf:<dir> or hf:<file.gguf>."),
]
TokensOpt = Annotated[int, typer.Option("--tokens", help="Input length in tokens (fixed prose, or seeded ids).")]
ManifestOpt = Annotated[
    Path | None,
    typer.Option("--manifest", "-m", help="Measure inside the stack this speedtrap.toml launches (live localize)."),
]
RunDirOpt = Annotated[
    Path | None,
    typer.Option("--run-dir", help="With --manifest: where the captures go; the base's is reused from there."),
]


def _overrides(pairs: list[str] | None) -> dict[str, str]:
    from speedtrap.targets import parse_overrides

    return parse_overrides(pairs or [])


def load_with_patches(target: str, patches: str | None, overrides: dict[str, str]) -> tuple[InProcessModel, list[str]]:
    """Load a target; user patches (``module:function``) join its catalogue. Returns the patch names."""
    from speedtrap.targets import load_target, patches_switched_on

    names = parse_patch_list(patches)
    model = load_target(target, overrides, names)
    if patches is None:
        names = patches_switched_on(model)
    return model, names


@diff_app.command("layers")
@user_errors
def diff_layers_cmd(
    target: TargetOpt = "smol-moe",
    patches: PatchesOpt = None,
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="Patches on in both runs (the reference configuration).")
    ] = None,
    threshold: Annotated[
        float | None, typer.Option("--threshold", help="rel_diff above which a module has diverged (default 1e-8).")
    ] = None,
    tokens: TokensOpt = 128,
    decode: Annotated[
        int, typer.Option("--decode", help="Feed the last N tokens one by one through the KV cache.")
    ] = 0,
    dump: Annotated[
        Path | None, typer.Option("--dump", help="Write every compared tensor pair here (safetensors).")
    ] = None,
    set_: SetOpt = None,
    manifest: ManifestOpt = None,
    run_dir: RunDirOpt = None,
    json: JsonOpt = False,
) -> None:
    """Run baseline and patched on the same tokens; name the first module whose output diverges.

    With --manifest, inside the stack the manifest launches (the base, then the patches; one stack at a time)."""
    from speedtrap.localize import DEFAULT_THRESHOLD, default_ids, layer_diff

    if manifest is not None:
        live = _live(manifest, patches, baseline, tokens, decode, threshold, None, None, run_dir)
        if json:
            emit_json({**live.shown.layers.to_json(), "live": live.extra()})
            return
        out_console.print(f"measured {live.measured_on()}", highlight=False, soft_wrap=True)
        _print_layers(live.shown.layers)
        return
    with err_console.status(f"loading {target}"):
        model, names = load_with_patches(target, patches, _overrides(set_))
    if not names:
        raise UsageError("no patches to compare", "pass --patches a,b (or switch a patch on by its env var)")
    base = parse_patch_list(baseline)
    ids = default_ids(model, tokens)
    with err_console.status(f"comparing {len(ids)} tokens module by module: {', '.join(names)}"):
        result = layer_diff(
            model, names, ids, baseline=base, threshold=threshold or DEFAULT_THRESHOLD, decode_tokens=decode, dump=dump
        )
    if json:
        emit_json(result.to_json())
        return
    _print_layers(result)


def _print_layers(result: LayerDiffResult) -> None:
    if result.first_divergent is None:
        out_console.print(
            f"[green]no module over rel_diff {result.threshold:g}[/] ({len(result.modules)} modules, "
            f"{result.tokens} tokens, patches {list(result.patches)})",
            soft_wrap=True,
        )
    else:
        first = result.module(result.first_divergent)
        out_console.print(
            f"[red]first divergent module:[/] {first.name}  rel_diff {first.rel_diff:.3g}, "
            f"max |diff| {first.max_abs_diff:.3g}, cosine {first.cosine:.9f} (threshold {result.threshold:g})",
            soft_wrap=True,
        )
    table = Table(
        Column("module", overflow="fold"), "status", "rel_diff", "max |diff|", "cosine", title="over the threshold"
    )
    for m in result.over_threshold()[:20]:
        table.add_row(m.name, m.status, f"{m.rel_diff:.3g}", f"{m.max_abs_diff:.3g}", f"{m.cosine:.9f}")
    if result.over_threshold():
        out_console.print(table)
    growth = Table("layer", "block output rel_diff", "largest inside", title="error growth across layers")
    for g in result.growth:
        growth.add_row(str(g.layer), "-" if g.rel_diff is None else f"{g.rel_diff:.3g}", f"{g.max_rel_diff:.3g}")
    out_console.print(growth)
    skipped = [m for m in result.modules if m.status != "compared"]
    if skipped:
        out_console.print(
            f"{len(skipped)} modules not compared (other shapes or no counterpart); see --json", markup=False
        )


@check_app.command("scale")
@user_errors
def check_scale_cmd(
    target: TargetOpt = "smol-moe",
    param: Annotated[str, typer.Option("--param", help="The config scalar to check.")] = "routed_scaling_factor",
    patches: PatchesOpt = None,
    values: Annotated[
        str | None, typer.Option("--values", help="Comma-separated values of the scalar (default: 0.5x..4x nominal).")
    ] = None,
    tokens: TokensOpt = 64,
    set_: SetOpt = None,
    manifest: ManifestOpt = None,
    run_dir: RunDirOpt = None,
    json: JsonOpt = False,
) -> None:
    """How many times is a config scalar applied? The exponent of each consumer's output in it.

    With --manifest, measured in the worker of the stack the manifest launches, in the base and with --patches."""
    from speedtrap.localize import check_scale, default_ids

    chosen = _floats(values)
    if manifest is not None:
        live = _live(manifest, patches, None, tokens, 0, None, param, chosen, run_dir)
        shown = live.shown
        if shown.scale is None:
            raise UsageError(
                f"no role of the stack measured {param!r} (no module holds it at its config value)",
                "check --param; the files of the live localize are in --run-dir",
            )
        if json:
            base = None if shown.base_scale is None else shown.base_scale.to_json()
            emit_json({**shown.scale.to_json(), "base": base, "live": live.extra()})
            return
        out_console.print(f"measured {live.measured_on()}", highlight=False, soft_wrap=True)
        if shown.base_scale is not None:
            out_console.print("[bold]the base configuration[/]")
            _print_scale(shown.base_scale)
            out_console.print(f"[bold]with {', '.join(shown.scale.patches)}[/]")
        _print_scale(shown.scale)
        return
    with err_console.status(f"loading {target}"):
        model, names = load_with_patches(target, patches, _overrides(set_))
    ids = default_ids(model, tokens)
    with err_console.status(f"re-parametrizing {param} with patches {names or 'none'}"):
        result = check_scale(model, ids, param, patches=names, values=chosen)
    if json:
        emit_json(result.to_json())
        return
    _print_scale(result)


def _print_scale(result: ScaleCheckResult) -> None:
    param = result.param
    table = Table(
        Column("module", overflow="fold"), "exponent", "fit residual", "shape residual", "verdict", "consumers"
    )
    for u in result.units:
        table.add_row(
            u.module,
            "-" if u.exponent is None else f"{u.exponent:.4f}",
            "-" if u.fit_residual is None else f"{u.fit_residual:.1e}",
            "-" if u.shape_residual is None else f"{u.shape_residual:.1e}",
            u.verdict,
            ", ".join(c.module.rsplit(".", 1)[-1] for c in u.consumers) or "(pinned)",
        )
    out_console.print(table)
    verdict = "[green]applied exactly once everywhere[/]" if result.exactly_once else "[red]NOT applied exactly once[/]"
    out_console.print(
        f"{param} = {result.nominal:g}: {verdict} (values {list(result.values)}, patches {list(result.patches)})",
        soft_wrap=True,
    )
    if any(u.sites is not None for u in result.units):
        from speedtrap.localize import scale_words

        out_console.print(f"where: {scale_words(result.units)}", highlight=False, markup=False, soft_wrap=True)
    if result.provenance:
        cost = result.provenance
        out_console.print(
            f"(sites: {cost['seconds']:.2f} s under the recorders, one more replay per candidate site; "
            f"{int(cost['bytes']):,} bytes of JSON)",
            highlight=False,
        )


def _live(
    manifest: Path,
    patches: str | None,
    baseline: str | None,
    tokens: int,
    decode: int,
    threshold: float | None,
    param: str | None,
    values: list[float] | None,
    run_dir: Path | None,
) -> StackLocalization:
    """The base and ``patches`` launched from ``manifest`` one at a time, captured inside the stack, compared."""
    from speedtrap.localize import DEFAULT_THRESHOLD, localize_manifest
    from speedtrap.manifest import load_manifest

    loaded = load_manifest(manifest)
    folder = run_dir or Path("speedtrap-runs") / "live-localize"
    names = parse_patch_list(patches)
    with err_console.status(f"launching the base, then {', '.join(names) or '?'}, one stack at a time (in {folder})"):
        [result] = localize_manifest(
            loaded, [names], folder, tokens=tokens, decode=decode, param=param, values=values,
            threshold=threshold or DEFAULT_THRESHOLD, baseline=parse_patch_list(baseline),
        )  # fmt: skip
    return result


def _floats(text: str | None) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(v) for v in parse_patch_list(text)]
    except ValueError:
        raise UsageError(f"--values {text!r} is not a comma-separated list of numbers", "e.g. --values 1,2,4") from None


def localize_culprits(manifest: Manifest, culprits: list[tuple[str, ...]], folder: Path) -> list[dict[str, object]]:
    """``--localize`` of bisect: each culprit set localized inside the stack; printed, and as JSON."""
    from speedtrap.localize import localize_manifest

    if not culprits:
        err_console.print("--localize: no culprit to localize", highlight=False)
        return []
    err_console.print(f"localizing {len(culprits)} culprit set(s) inside the stack (one launch at a time)")
    return print_localized(localize_manifest(manifest, culprits, folder))


def print_localized(found: Sequence[StackLocalization]) -> list[dict[str, object]]:
    """Each culprit's live localize on one line (and as JSON): first divergent module, exponents, where measured."""
    from speedtrap.localize import scale_words

    if not found:
        err_console.print("--localize: no culprit to localize", highlight=False)
    out: list[dict[str, object]] = []
    for live in found:
        shown = live.shown
        first = shown.layers.first_divergent
        line = f"localize {'+'.join(live.culprit)}: first divergent module {first or 'none'}"
        if shown.scale is not None:
            line += f"; {shown.scale.param}: {scale_words(shown.scale.units)}"
        if shown.base_scale is not None:
            line += f"; in the base: {scale_words(shown.base_scale.units)}"
        out_console.print(f"{line} (measured {live.measured_on()})", highlight=False, markup=False, soft_wrap=True)
        out.append({"culprit": list(live.culprit), "layers": shown.layers.to_json(),
                    "scale": None if shown.scale is None else shown.scale.to_json(), "live": live.extra()})  # fmt: skip
    return out
