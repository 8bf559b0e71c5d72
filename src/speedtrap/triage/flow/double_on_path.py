"""Double application judged on paths: a patch that lets a factor reach a multiply under conditions
where another multiply already applies it, where before the two were exclusive.

Two kinds of "other" multiply are checked: the ones the same function's other uses of the factor
reach (``router(scale=f if not on_output else 1.0)`` next to ``runner(scale=f if on_output else 1.0)``),
and the multiplies of the factor in units on the same execution path (``Units.relation``).

Catches::

    runner(scale=f if on_output else 1.0)   ->   runner(scale=f)   (router(scale=f) still applies it)

"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping

from speedtrap.triage.flow.identity_by_statement import ADDED
from speedtrap.triage.flow.sites import (
    MULTIPLY,
    PASS,
    CountWarning,
    DoubleApplication,
    Site,
    aliases_of,
    clash,
    make_site,
)
from speedtrap.triage.flow.units import Units
from speedtrap.triage.flow.values import Flow, IdentityChange, Reach
from speedtrap.triage.source import Module, SourceIndex

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_REACH = "lets the factor reach"


def _words(literals: Iterable[tuple[str, bool]]) -> str:
    parts = [f"{atom} is {'set' if on else 'not set'}" for atom, on in literals]
    return " and ".join(dict.fromkeys(parts)) or "always"


def _uses(mod: Module, func: ast.AST, factor: str, skip: ast.AST) -> list[ast.AST]:
    inside = {id(n) for n in ast.walk(skip)}
    out: list[ast.AST] = []
    for n in ast.walk(func):
        if id(n) in inside:
            continue
        if (isinstance(n, ast.Name) and n.id == factor and isinstance(n.ctx, ast.Load)) or (
            isinstance(n, ast.Attribute) and n.attr == factor and isinstance(n.ctx, ast.Load)
        ):
            out.append(n)
    return out


def _passed(mod: Module, node: ast.AST) -> bool:
    """Whether a value is passed as a call argument (through a conditional expression)."""
    cur, parent = node, mod.parent(node)
    while isinstance(parent, ast.IfExp) and parent.test is not cur:
        cur, parent = parent, mod.parent(parent)
    return isinstance(parent, ast.keyword) or (isinstance(parent, ast.Call) and cur in parent.args)


def sibling_doubles(
    change: IdentityChange, new: Module, flow: Flow, patch: str, aliases: Mapping[str, set[str]]
) -> list[DoubleApplication]:
    """Other uses of the factor in the same function whose multiplies now run together with the changed one's."""
    func = next((a for a in new.ancestors(change.new_node) if isinstance(a, _FUNCS)), None)
    if func is None:
        return []
    # Where the factor now goes: the multiplies it reaches, or (a callee not read here) the argument itself.
    here = change.reaches[0] if change.reaches else Reach(make_site(new, change.new_node, PASS, "argument", ""), ())
    slot_root: ast.AST = change.new_node
    parent = new.parent(slot_root)
    while isinstance(parent, (ast.IfExp, ast.keyword)):
        slot_root, parent = parent, new.parent(parent)
    out: list[DoubleApplication] = []
    mine = {r.site.where for r in change.reaches}
    for use in _uses(new, func, change.factor, slot_root):
        lits = tuple(lit for g in new.guards(use) for lit in g.literals())
        if new.exclusive(change.new_node, use) or clash(change.new_literals, lits, aliases):
            continue
        newly = list(lits) if change.unconditional else clash(change.old_literals, lits, aliases)
        if not newly and not change.unconditional:
            continue
        theirs = [r for r in flow.reaches(new, use) if r.site.where not in mine]
        if not theirs and not change.reaches and _passed(new, use):
            theirs = [Reach(make_site(new, use, PASS, "argument", ""), ())]
        if not theirs:
            continue
        a, b = here, theirs[0]
        code = new.line(getattr(use, "lineno", 0))
        start = f"`{change.after}` ({change.file}:{change.new_line})"
        path = f"both reached from {change.function} ({change.file})"
        if b.hops:  # the other use's own route, when it is not the multiply itself
            path += f"; `{code}` ({change.file}:{getattr(use, 'lineno', 0)}) reaches it via {' -> '.join(b.hops)}"
        before = f"`{change.when}` selected {change.identity} there"
        relation = f"same path: {path}; both multiplies run when {_words(newly)} (before the patch {before})"
        also = tuple(
            r.site for r in [*change.reaches[1:], *theirs[1:]] if r.site.where not in (a.site.where, b.site.where)
        )
        route = (start, *a.hops, a.site.where) if a.hops else ()
        out.append(
            DoubleApplication(
                change.factor, patch, a.site, b.site, relation, _REACH, path, route, _words(newly), before, also
            )
        )
    return out


def related_doubles(
    change: IdentityChange,
    base_sites: list[Site],
    units: Units,
    patch: str,
    aliases: Mapping[str, set[str]],
) -> list[DoubleApplication]:
    """Multiplies of the factor in units on the same path that the change's multiply now runs with."""
    out: list[DoubleApplication] = []
    seen: set[tuple[str, str]] = set()
    for reach in change.reaches[:4]:
        a = reach.site
        new_lits = (*change.new_literals, *a.literals)
        old_lits = (*change.old_literals, *a.literals)
        for b in base_sites:
            if b.role != MULTIPLY or b.method != "ast" or b.where == a.where or (a.where, b.where) in seen:
                continue
            if clash(new_lits, b.literals, aliases):
                continue
            newly = list(b.literals) if change.unconditional else clash(old_lits, b.literals, aliases)
            if not newly and not change.unconditional:
                continue
            rel = units.relation(a.file, a.unit, b.file, b.unit)
            if rel is None:
                continue
            seen.add((a.where, b.where))
            before = f"`{change.when}` selected {change.identity} there"
            relation = f"same path: {rel[0]}; {b.function} applies it when {_words(newly)} (before the patch {before})"
            start = f"`{change.after}` ({change.file}:{change.new_line})"
            flow = (start, *reach.hops, a.where) if reach.hops else ()
            out.append(
                DoubleApplication(change.factor, patch, a, b, relation, _REACH, rel[0], flow, _words(newly), before)
            )
    return out


def missing_applications(
    changes: list[IdentityChange], units: Units, base_sites: Mapping[str, list[Site]]
) -> list[CountWarning]:
    """For each change that stops the factor reaching a multiply: the multiplies that still apply it on
    that path (applied once), or none (applied nowhere now), named."""
    out: list[CountWarning] = []
    for change in changes:
        if change.removes_application and change.returned and not change.reaches:
            text = (
                f"{change.factor} replaced by {change.identity} in {change.slot} "
                f"(`{change.before}` -> `{change.after}` at {change.file}:{change.new_line}): its callers now "
                f"receive the identity where they received the factor; check that {change.factor} is still applied"
            )
            out.append(CountWarning(change.factor, text))
            continue
        if not change.removes_application or not change.reaches:
            continue
        gone = change.reaches[0].site
        gone_at = {r.site.where for r in change.reaches}
        still = [
            b
            for b in base_sites.get(change.factor, [])
            if b.role == MULTIPLY
            and b.method == "ast"
            and b.where not in gone_at
            and units.relation(gone.file, gone.unit, b.file, b.unit) is not None
        ]
        head = (
            f"{change.factor} no longer reaches `{gone.code}` at {gone.where} "
            f"(`{change.before}` -> `{change.after}` at {change.file}:{change.new_line})"
        )
        if still:
            names = ", ".join(f"{b.where} ({b.function})" for b in still[:4])
            text = f"{head}; still applied on that path at {names}: check that it is applied exactly once"
        else:
            text = f"{head}; no other multiply of {change.factor} on that path: the factor is applied nowhere now"
        out.append(CountWarning(change.factor, text))
    return out


def path_doubles(
    changes: list[IdentityChange],
    post: SourceIndex,
    flow: Flow,
    units: Units,
    base_sites: Mapping[str, list[Site]],
    patch: str,
) -> list[DoubleApplication]:
    """Every double application the identity changes of one patch make possible."""
    out: list[DoubleApplication] = []
    for change in changes:
        if change.removes_application or change.change == ADDED:
            continue  # fewer applications: no new pair of multiplies
        new = change.module or post.module(change.file)
        if new is None:
            continue
        files = {change.file, *(r.site.file for r in change.reaches)}
        files |= {s.file for r in change.reaches[:4] for s in units.callers(r.site.unit or "", r.site.file)}
        files |= {s.file for s in base_sites.get(change.factor, []) if s.role == MULTIPLY and s.method == "ast"}
        aliases = aliases_of(m for m in (post.module(f) for f in sorted(files)) if m is not None)
        found = sibling_doubles(change, new, flow, patch, aliases)
        if not found:
            found = related_doubles(change, base_sites.get(change.factor, []), units, patch, aliases)
        out.extend(found)
    return out
