"""``speedtrap triage`` (rank patches, trace a factor, write a plan) and ``speedtrap inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from speedtrap._errors import UsageError
from speedtrap.cli._app import app, emit_json, err_console, out_console, user_errors
from speedtrap.cli._options import JsonOpt

PatchOpt = Annotated[
    list[Path] | None, typer.Option("--patch", help="A unified diff file; repeat for several patches.")
]
RangeOpt = Annotated[str | None, typer.Option("--range", help="A git range A..B in --repo: one patch per commit.")]
RepoOpt = Annotated[Path | None, typer.Option("--repo", help="The git repository for --range.")]
ManifestOpt = Annotated[
    Path | None, typer.Option("--manifest", help="A speedtrap.toml manifest that lists the patches and their switches.")
]
TargetOpt = Annotated[str | None, typer.Option("--target", "-t", help="A built-in target's patches: smol-moe.")]
TreeOpt = Annotated[Path | None, typer.Option("--tree", help="The source tree the patches apply to.")]
SymbolOpt = Annotated[
    str | None, typer.Option("--symbol", help="List every site of this name, e.g. routed_scaling_factor.")
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="The served model: its class, a config.json or its folder; ranks what it runs first "
        "(default with --manifest: its [target] model folder, where it holds a config.json).",
    ),
]
PlatformOpt = Annotated[
    str | None,
    typer.Option(
        "--platform",
        help="The hardware served on: cuda, rocm, cpu, xpu, tpu or npu; ranks code it cannot select "
        "(under `if _is_hip:` on cuda) one tier lower (default with --manifest: its [target] platform).",
    ),
]
PlanOpt = Annotated[
    Path | None, typer.Option("--plan", help="Write the diagnostic plan (Markdown) here; '-' for stdout.")
]


@app.command("triage")
@user_errors
def triage_cmd(
    more: Annotated[
        list[Path] | None, typer.Argument(help="More diff files after --patch (--patch a.diff b.diff).", hidden=True)
    ] = None,
    patch: PatchOpt = None,
    range_: RangeOpt = None,
    repo: RepoOpt = None,
    manifest: ManifestOpt = None,
    target: TargetOpt = None,
    tree: TreeOpt = None,
    symbol: SymbolOpt = None,
    plan: PlanOpt = None,
    model: ModelOpt = None,
    platform: PlatformOpt = None,
    json: JsonOpt = False,
) -> None:
    """Rank patches from their diffs (tiers with reasons), trace a factor, write a diagnostic plan."""
    from speedtrap.manifest import load_manifest
    from speedtrap.spec import Platform
    from speedtrap.triage import from_diff_files, from_git_range, from_manifest, from_target, render_plan, trace_symbol
    from speedtrap.triage import triage as run_triage

    served = Platform.parse(platform, "--platform") if platform is not None else None
    if more:
        if not patch:
            raise UsageError(f"unexpected argument {str(more[0])!r}", "pass diff files with --patch FILE...")
        patch = [*patch, *more]
    chosen = [
        n for n, v in (("--patch", patch), ("--range", range_), ("--manifest", manifest), ("--target", target)) if v
    ]
    if len(chosen) > 1:
        raise UsageError(
            f"choose one patch source, not {' and '.join(chosen)}",
            "pass --patch FILE..., --range A..B --repo PATH, --manifest FILE or --target smol-moe",
        )
    if repo is not None and range_ is None:
        raise UsageError("--repo needs --range", "pass --range A..B with --repo PATH")
    if not chosen:
        if symbol and tree:
            result = trace_symbol(tree, symbol)
            if json:
                emit_json({"trace": result.to_json()})
            else:
                _print_sites(result)
            return
        raise UsageError(
            "no patches given",
            "pass --patch FILE..., --range A..B --repo PATH, --manifest FILE or "
            "--target smol-moe (or --tree with --symbol to trace only)",
        )
    if range_ is not None:
        if repo is None:
            raise UsageError("--range needs --repo", "pass --repo with the path of the git checkout")
        patch_set = from_git_range(repo, range_, tree)
    elif manifest is not None:
        patch_set = from_manifest(load_manifest(manifest), tree)
    elif target is not None:
        with err_console.status(f"loading {target}'s patches"):
            patch_set = from_target(target, tree)
    else:
        patch_set = from_diff_files(list(patch or []), tree)
    try:
        report = run_triage(patch_set, symbol, model, served)
        markdown = render_plan(report, patch_set.cli_args)
    finally:
        patch_set.close()
    if plan is not None and str(plan) != "-":
        try:
            plan.write_text(markdown, encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"cannot write the plan to {str(plan)!r}: {exc.strerror}", "pass a writable path"
            ) from None
    if json:
        emit_json({**report.to_json(), "plan_path": str(plan) if plan is not None and str(plan) != "-" else None})
        return
    if plan is not None and str(plan) == "-":
        typer.echo(markdown, nl=False)
        return
    _print_report(report)
    if plan is not None:
        err_console.print(f"plan written to {plan}", markup=False)


def _print_report(report: object) -> None:
    from speedtrap.triage import TriageReport

    assert isinstance(report, TriageReport)
    out_console.print(
        f"[bold]{report.label}[/]: {len(report.patches)} patches read in {report.elapsed_s:.1f} s", highlight=False
    )
    for tier in (1, 2, 3):
        out_console.print(f"\n[bold]Tier {tier}[/]", highlight=False)
        for p in report.tier(tier):
            best = p.signals.best_hot_path
            signal = "" if p.ranking.signal else "no static signal | "
            facts = escape(
                f"[{signal}{p.gate.describe()} | runs {best.level if best else 'unknown'} | "
                f"phases {p.signals.phases} (guess)]"
            )
            out_console.print(f"  [bold]{escape(p.name)}[/]  {facts}", highlight=False, soft_wrap=True)
            for i, reason in enumerate(p.ranking.reasons):
                out_console.print(f"    - {reason}", highlight=False, soft_wrap=True, markup=False)
                _print_lines(p.ranking.lines(i), "        ")
    for p in report.patches:
        for d in p.doubles[:1]:
            out_console.print(f"[bold red]warning:[/] {escape(d.message)}", highlight=False, soft_wrap=True)
            _print_lines(d.lines, "    ")
        for c in p.counts[:2]:
            out_console.print(
                f"[bold red]warning:[/] {escape(p.name)}: {escape(c.headline)}", highlight=False, soft_wrap=True
            )
            _print_lines(c.lines, "    ")
    for w in report.warnings:
        err_console.print(f"[yellow]note:[/] {escape(w)}", highlight=False)
    if report.trace is not None:
        _print_sites(report.trace, warn=False)


def _print_sites(trace: object, warn: bool = True) -> None:
    from speedtrap.triage import TraceResult

    assert isinstance(trace, TraceResult)
    table = Table(title=f"{len(trace.sites)} sites of {trace.symbol}")
    table.add_column("site", overflow="fold", min_width=24)  # wrap a long path, never cut it
    table.add_column("function", overflow="fold")
    table.add_column("role")
    table.add_column("guarded by", overflow="fold")
    for s in trace.sites:
        role = s.role if s.method == "ast" else f"{s.role} ({s.method})"
        table.add_row(s.where, s.function, role, "\n".join(s.guards) or "-")
    out_console.print(table)
    for d in trace.double_applications if warn else []:
        out_console.print(f"[bold red]warning:[/] {escape(d.message)}", highlight=False, soft_wrap=True)
        _print_lines(d.lines, "    ")


def _print_lines(lines: tuple[str, ...], indent: str) -> None:
    """A reason's or a warning's evidence, one line each, indented below it."""
    for line in lines:
        out_console.print(f"{indent}{line}", highlight=False, soft_wrap=True, markup=False)


@app.command("inspect")
@user_errors
def inspect_cmd(
    pid: Annotated[
        int | None, typer.Option("--pid", help="The server's process id (left out with --manifest: every role).")
    ] = None,
    manifest: ManifestOpt = None,
    target: TargetOpt = None,
    ssh: Annotated[str | None, typer.Option("--ssh", help="Read /proc on this host through the ssh client.")] = None,
    json: JsonOpt = False,
) -> None:
    """Which patch gates are on in a running server (its argv and environment; secrets redacted)."""
    from speedtrap.manifest import load_manifest
    from speedtrap.stack import inspect_process
    from speedtrap.triage import from_manifest, target_patch_inputs

    if manifest is not None and target is not None:
        raise UsageError("choose --manifest or --target, not both", "pass one of them")
    if pid is None:
        if manifest is None:
            raise UsageError("inspect needs --pid, or --manifest of a stack of roles", "pass --pid PID")
        _inspect_stack(manifest, json)
        return
    patches = (
        from_manifest(load_manifest(manifest), None).patches
        if manifest is not None
        else target_patch_inputs(target or "smol-moe")[0]
    )
    report = inspect_process(pid, patches, ssh)
    note = ""
    catalogue_env = {key for p in patches if p.gate is not None for key, _ in p.gate.env}
    if manifest is None and target is None and catalogue_env.isdisjoint(report.env):
        # No patch list was named and the process carries none of smol-moe's env gates: listing smol-moe's
        # patches as "off" would be a claim about a catalogue this server never had.
        report.gates = []
        note = "no --manifest or --target given and no smol-moe gate in its environment: no patch list compared"
    if json:
        emit_json({**report.to_json(), **({"note": note} if note else {})})
        return
    if note:
        out_console.print(f"{note} (fix: pass --manifest F to name your stack's patches)", highlight=False)
    table = Table("patch", "gate", "state", "evidence", title=f"pid {pid} on {ssh or 'this machine'}")
    for g in report.gates:
        table.add_row(g.patch, g.gate.describe(), g.state, g.evidence)
    out_console.print(table)
    _print_launch(report.argv, {})  # PYTHONPATH and the engine switches: "other switch-like variables" below
    out_console.print(f"patches on: {', '.join(report.patches_on) or 'none'}", highlight=False, markup=False)
    for p in report.plugins:
        line = f"plugin {p.name} ({p.group}: {p.target}, {p.distribution}): {p.state}"
        out_console.print(line, highlight=False, soft_wrap=True, markup=False)
    if report.other_switches:
        out_console.print(
            "other switch-like variables: " + ", ".join(f"{k}={v}" for k, v in report.other_switches.items()),
            highlight=False,
            soft_wrap=True,
        )
    if report.redacted:
        out_console.print(f"redacted: {', '.join(report.redacted)}", highlight=False, markup=False)


def _print_launch(argv: list[str], variables: dict[str, str]) -> None:
    """The launch line and the variables that change what runs (secrets already redacted)."""
    if argv:
        out_console.print("launch: " + " ".join(argv), highlight=False, markup=False, soft_wrap=True)
    for key, value in sorted(variables.items()):
        out_console.print(f"  {key}={value}", highlight=False, markup=False, soft_wrap=True)


def _inspect_stack(manifest: Path, as_json: bool) -> None:
    from speedtrap.manifest import load_manifest
    from speedtrap.stack import inspect_stack

    loaded = load_manifest(manifest, resolve_commits=False)
    report = inspect_stack(manifest, loaded.target, loaded.patches)
    if as_json:
        emit_json(report.to_json())
        return
    for role in report.roles:
        pids = ", ".join(f"{p.pid} {p.name}" for p in role.processes) or "none (the role is not running)"
        where = f"on {role.node}, {role.ranks} rank{'s' if role.ranks != 1 else ''}"
        line = f"role {role.role} {where} (port {role.port}; log {role.log}): {pids}"
        out_console.print(line, highlight=False, markup=False)
        table = Table("patch", "gate", "state", "evidence", title=f"role {role.role}: gates from {role.gates_from}")
        for g in role.gates:
            table.add_row(g.patch, g.gate.describe(), g.state, g.evidence)
        out_console.print(table)
        _print_launch(role.argv, role.switches)
        for p in role.unreadable:
            line = f"  pid {p.pid} ({p.name}): environment unreadable: {p.evidence}"
            out_console.print(line, highlight=False, markup=False, soft_wrap=True)
