"""The diagnostic plan in Markdown: suspects in order, what to check first (with the command that
answers each question), and which suspects a switch can A/B and which need a rebuild."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from speedtrap.triage.flow import SOME_LAYERS
from speedtrap.triage.ranking.signals import GUARD, PRECISION, SCALE
from speedtrap.triage.source import CONFIG, ENV, FLAG

if TYPE_CHECKING:
    from speedtrap.triage.ranking.run import PatchReport, TriageReport

_MAX_SITES = 40


def _cmd(*parts: str) -> str:
    return " ".join(shlex.quote(p) for p in parts)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _switch(p: PatchReport) -> tuple[str, str]:
    """(how to turn it off, what kind of A/B that is); a change under a runtime phase says what a user can switch."""
    off, kind = _gate_switch(p)
    phase = p.signals.runtime_phase
    if phase is not None:
        off += f"; {phase.words()}"
    return off, kind


def _gate_switch(p: PatchReport) -> tuple[str, str]:
    g = p.gate
    if g.kind == ENV:
        return f"relaunch without `{' '.join(f'{k}={v}' for k, v in g.env)}`", "switch (env var)"
    if g.kind == FLAG:
        return f"relaunch without `{' '.join(g.args)}`", "switch (launch flag)"
    if g.kind == CONFIG:
        key, value = g.config[0]
        return f"set `{key}` to the opposite of `{value}` in the model config and relaunch", "config edit + relaunch"
    if p.patch.commits:
        sha = p.patch.commits[0][:12]
        return f"leave commit `{sha}` out of the trial's worktree (`speedtrap bisect --manifest`)", "switch (commit)"
    origin = p.patch.origin
    how = f"`git revert {origin.split()[1]}`" if origin.startswith("commit ") else "revert the diff"
    return f"{how} and rebuild", "rebuild"


def _inspect_args(source: list[str]) -> list[str]:
    return source[:2] if source[:1] in (["--manifest"], ["--target"]) else []


def _questions(p: PatchReport, source: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    sig = p.signals
    for d in p.doubles[:1]:
        other = " and ".join(d.other.guards) or "unconditionally"
        out.append(
            (
                f"Is `{d.symbol}` applied exactly once? The patch {d.verb} `{d.added.code}` at {d.added.where}, "
                f"while `{d.other.code}` at {d.other.where} ({d.other.function}) still applies it "
                f"{other}. List every site and the flags that select it:",
                _cmd("speedtrap", "triage", *source, "--symbol", d.symbol),
            )
        )
    for c in p.counts[:2]:
        out.append(
            (
                f"Is `{c.factor}` still applied exactly once? {c.message}.",
                _cmd("speedtrap", "triage", *source, "--symbol", c.factor),
            )
        )
    for s in sig.of(SCALE):
        factor = s.data.get("factor", "")
        if any(d.symbol == factor for d in p.doubles):
            continue
        out.append(
            (
                f"The patch {s.summary}. Is `{factor}` still applied exactly once on every path "
                "(top-k, combine, fused kernels)?",
                _cmd("speedtrap", "triage", *source, "--symbol", factor),
            )
        )
    for s in sig.of(GUARD):
        names = [n for n in s.data.get("names", []) if n.isidentifier()]
        q = (
            f"It {s.summary}. What did upstream know that made it refuse this case? Read the code the guard "
            "protected and everything that already handles it:"
        )
        out.append(
            (q, _cmd("speedtrap", "triage", *source, "--symbol", names[0]) if names else _cmd("git", "log", "-p"))
        )
    if p.gate.kind == CONFIG:
        key = p.gate.config[0][0]
        out.append(
            (
                f"Is `{key}` set in the deployed model's config (the switch of this patch)?",
                _cmd("grep", "-n", f'"{key}"', "MODEL_DIR/config.json"),
            )
        )
    elif p.gate.kind in (ENV, FLAG):
        out.append(
            (
                "Is this patch switched on in the running server?",
                _cmd("speedtrap", "inspect", "--pid", "PID", *_inspect_args(source)),
            )
        )
    if sig.of(PRECISION):
        dtypes = ", ".join(sig.of(PRECISION)[0].data.get("dtypes", []))
        off, _ = _switch(p)
        out.append(
            (
                f"How far does the {dtypes} result drift from fp32, and does the drift grow with context length? "
                f"A/B it ({off}) and compare next-token distributions by position, not only short-prompt accuracy.",
                _cmd("speedtrap", "check", "equivalence", "--target", "smol-moe", "--patches", p.name)
                if "--target" in source
                else (
                    f"A/B by the switch above ({off}); compare logprobs at long context"
                    if p.gate.kind in (ENV, FLAG, CONFIG)
                    else f"ungated: A/B needs two builds ({off}); compare logprobs at long context"
                ),
            )
        )
    best = sig.best_hot_path
    if best is not None and best.level == SOME_LAYERS:
        out.append(
            (
                f"Which layers take this path? It is built only where {'; '.join(best.conditions)}.",
                _cmd("grep", "-rn", best.function.split(":")[-1].split(".")[0], p.files[0].path if p.files else "."),
            )
        )
    if sig.phases != "both":
        out.append(
            (
                f"Is the damage confined to {sig.phases}? (a guess from names) In a disaggregated deployment, "
                f"check which servers run this patch.",
                _cmd("speedtrap", "inspect", "--pid", "PID", *_inspect_args(source)),
            )
        )
    return out


def _suspect(n: int, p: PatchReport, source: list[str]) -> list[str]:
    lines = [f"### {n}. `{p.name}` (Tier {p.ranking.tier_words})", ""]
    if p.patch.summary:
        lines += [p.patch.summary, ""]
    lines += [f"Source: {p.patch.origin}; gate: {p.gate.describe()} ({p.gate_source}).", "", "Why it ranks here:", ""]
    lines += [f"- {r}" for r in p.ranking.reasons]
    evidence = [e for s in p.signals.signals if s.kind in (GUARD, SCALE, PRECISION) for e in s.evidence][:6]
    if evidence:
        lines += ["", "Lines that raised it:", "", "```diff"] + [e.render() for e in evidence] + ["```"]
    questions = _questions(p, source)
    if questions:
        lines += ["", "Check first:", ""]
        for i, (q, cmd) in enumerate(questions, 1):
            lines += [f"{i}. {q}", f"   `{cmd}`" if not cmd.startswith("A/B") else f"   {cmd}"]
    off, kind = _switch(p)
    lines += ["", f"A/B: {off} ({kind}).", ""]
    lines += [f"Note: {note}" for note in p.notes]
    return lines


def render_plan(report: TriageReport, source_args: list[str] | None = None) -> str:
    """The plan a senior engineer would write before relaunching anything."""
    source = source_args or []
    t1, t2, t3 = (report.tier(t) for t in (1, 2, 3))
    names = lambda ps: (  # noqa: E731
        ", ".join(f"`{p.name}`" + ("" if p.ranking.signal else " (no static signal)") for p in ps) or "none"
    )
    lines = [
        f"# Triage plan: {report.label}",
        "",
        f"{len(report.patches)} patches read in {report.elapsed_s:.1f} s"
        + (f" against `{report.tree}`" if report.tree else "")
        + ".",
        f"Tier 1 (read and test first): {names(t1)}. Tier 2: {names(t2)}. Tier 3: {names(t3)}.",
        "",
    ]
    lines += [f"> {w}" for w in report.warnings]
    lines += [
        "## Ranking",
        "",
        "| # | Tier | Patch | Main reason | Runs | Phases (guess) | Switch |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(report.patches, 1):
        best = p.signals.best_hot_path
        main = p.ranking.reasons[0] if p.ranking.reasons else ""
        lines.append(
            f"| {i} | {p.ranking.tier_words} | `{p.name}` | {_md(main[:160])} | {best.level if best else 'unknown'} | "
            f"{p.signals.phases} | {_md(_switch(p)[1])} |"
        )
    lines += ["", "## Suspects, in order", ""]
    for i, p in enumerate(report.patches, 1):
        lines += _suspect(i, p, source)
    lines += [
        "## A/B: by a switch, or only by a rebuild",
        "",
        "| Patch | Tier | How to turn it off | Kind |",
        "|---|---|---|---|",
    ]
    for p in report.patches:
        off, kind = _switch(p)
        lines.append(f"| `{p.name}` | {p.tier} | {_md(off)} | {kind} |")
    switchable = [p for p in t1 if p.gate.kind in (ENV, FLAG) or p.patch.commits]
    static = [p for p in t1 if p not in switchable]
    lines += ["", "## Order of work", ""]
    step = 1
    if static:
        lines.append(
            f"{step}. Read the Tier-1 patches no env var can switch off ({names(static)}) and settle their "
            "questions above by reading: a config edit or rebuild costs a relaunch."
        )
        step += 1
    if switchable:
        lines.append(
            f"{step}. A/B the switchable Tier-1 patches ({names(switchable)}) one at a time against the "
            "baseline, on long multi-turn prompts (short prompts often hide the damage)."
        )
        step += 1
    lines.append(f"{step}. Then Tier 2 ({names(t2)}); Tier 3 ({names(t3)}) only if nothing above explains the failure.")
    if report.trace is not None:
        lines += ["", *_trace_section(report)]
    return "\n".join(lines).rstrip() + "\n"


def _trace_section(report: TriageReport) -> list[str]:
    trace = report.trace
    assert trace is not None
    involved = {x.file for d in trace.double_applications for x in (d.added, d.other)} | {s.file for s in trace.added}
    rank = {"multiply": 0, "divide": 1}
    shown = sorted(trace.sites, key=lambda s: (s.file not in involved, rank.get(s.role, 2), s.file, s.line))
    lines = [
        f"## Every site of `{trace.symbol}`",
        "",
        f"{len(trace.sites)} sites in the tree's {trace.files_scanned} files (Python read as AST; rows marked text "
        "are a line search), and the sites the patches add.",
    ]
    if len(trace.sites) > _MAX_SITES:
        lines.append(
            f"Shown first: the files the patches touch or warn about, then multiplies and divides; all "
            f"{len(trace.sites)} are in the JSON output (`--json`)."
        )
    lines += ["", "| Site | Function | Role | Guarded by |", "|---|---|---|---|"]
    for s in trace.added:
        guards = _md("; ".join(s.guards) or "unconditional")
        lines.append(f"| `{s.where}` (after {s.patch}) | {_md(s.function)} | **{s.role}** (added) | {guards} |")
    for s in shown[:_MAX_SITES]:
        role = s.role if s.method == "ast" else f"{s.role} ({s.method})"
        lines.append(f"| `{s.where}` | {_md(s.function)} | {role} | {_md('; '.join(s.guards) or '-')} |")
    if len(trace.sites) > _MAX_SITES:
        lines.append(f"| ... | {len(trace.sites) - _MAX_SITES} more in the JSON output | | |")
    for d in trace.double_applications:
        lines += ["", f"**Warning**: {d.message}", "", *(f"- {_md(line)}" for line in d.lines)]
    return lines
