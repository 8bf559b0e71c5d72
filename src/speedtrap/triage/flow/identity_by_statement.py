"""Identity selections made by statements, not expressions: a local assigned an identity (``1.0``,
``0``, ``None``) in one arm of an ``if`` and a value in the other, then read by a multiply::

    if kv_is_fp8:                        k_scale = layer.k_scale
        k_scale = layer.k_scale    ->    return q_scale * k_scale * sm_scale
    else:
        k_scale = 1.0
    return q_scale * k_scale * sm_scale

Two shapes are read: ``if c: v = a`` / ``else: v = b`` (each arm's last top-level assignment), and
a default overridden under a condition (``v = a`` then ``if c: v = b`` in the same block). One of
``a``, ``b`` must be an identity literal and the other not. A patch that collapses the selection into
its non-identity arm applies the value in more cases ("identity removed"); one that changes the
condition changes the cases ("identity condition changed"); one that introduces the selection where
the value was always assigned stops applying it in some cases ("identity added"). Each is reported
only when the value reaches a multiply (``Flow``), with the sites named.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from speedtrap.triage.flow.sites import CountWarning
from speedtrap.triage.flow.values import Flow, IdentityChange, identity_literal, negated, value_literals
from speedtrap.triage.source import Module, condition_names, short

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
ADDED = "identity added"


@dataclass(frozen=True)
class Selection:
    var: str
    node: ast.If
    value: ast.expr  # the non-identity value
    identity: str  # the identity, in words
    when: str  # the condition under which the identity is selected
    test: ast.expr


def _assigned(stmts: list[ast.stmt], var: str) -> ast.expr | None:
    value = None
    for s in stmts:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
            value = s.value if s.targets[0].id == var else value
    return value


def _names_assigned(stmts: list[ast.stmt]) -> set[str]:
    return {
        s.targets[0].id
        for s in stmts
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
    }


def _blocks(func: ast.AST) -> list[list[ast.stmt]]:
    """Every statement list inside ``func`` (nested functions and classes left out)."""
    out: list[list[ast.stmt]] = []
    stack = [func]
    while stack:
        node = stack.pop()
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                out.append(block)
                stack.extend(s for s in block if not isinstance(s, (*_FUNCS, ast.ClassDef)))
        for h in getattr(node, "handlers", []) or []:
            out.append(h.body)
            stack.extend(h.body)
        for c in getattr(node, "cases", []) or []:
            out.append(c.body)
            stack.extend(c.body)
    return out


def selections(func: ast.AST) -> dict[str, list[Selection]]:
    """The statement-level identity selections in a function, by the local they assign."""
    out: dict[str, list[Selection]] = {}
    for block in _blocks(func):
        for i, stmt in enumerate(block):
            if not isinstance(stmt, ast.If):
                continue
            for var in sorted(_names_assigned(stmt.body)):
                a = _assigned(stmt.body, var)
                if stmt.orelse:
                    b = _assigned(stmt.orelse, var)
                    on_a = short(stmt.test)
                    on_b = negated(stmt.test)
                else:
                    b = _assigned(block[:i], var)  # the default the `if` overrides
                    on_a, on_b = short(stmt.test), negated(stmt.test)
                if a is None or b is None:
                    continue
                ia, ib = identity_literal(a), identity_literal(b)
                if (ia is None) == (ib is None):
                    continue
                value, ident, when = (b, ia, on_a) if ia else (a, ib, on_b)
                assert ident is not None
                out.setdefault(var, []).append(Selection(var, stmt, value, ident, when, stmt.test))
    return out


def _assigns(func: ast.AST, var: str) -> list[ast.expr]:
    return [
        n.value
        for n in ast.walk(func)
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
        if n.targets[0].id == var
    ]


def _touches(node: ast.AST, lines: frozenset[int]) -> bool:
    start = getattr(node, "lineno", 0)
    end = getattr(node, "end_lineno", start) or start
    return any(start <= ln <= end for ln in lines)


def _functions(mod: Module) -> dict[tuple[str, str], ast.FunctionDef | ast.AsyncFunctionDef]:
    return {(mod.qualname(n), n.name): n for n in mod.nodes if isinstance(n, _FUNCS)}


def statement_identity_changes(
    path: str, old: Module, new: Module, removed: frozenset[int], added: frozenset[int], flow: Flow
) -> list[IdentityChange]:
    """Statement-level identity selections the patch removes, re-conditions or introduces."""
    out: list[IdentityChange] = []
    keys = {(old.qualname(f), f.name) for f in old.functions_touching(removed)}
    keys |= {(new.qualname(f), f.name) for f in new.functions_touching(added)}
    if not keys:
        return out
    old_funcs, new_funcs = _functions(old), _functions(new)
    for key in sorted(keys):
        of, nf = old_funcs.get(key), new_funcs.get(key)
        if of is None or nf is None:
            continue
        before, after = selections(of), selections(nf)
        for var in sorted(set(before) | set(after)):
            olds = [s for s in before.get(var, []) if _touches(s.node, removed)]
            news = [s for s in after.get(var, []) if _touches(s.node, added)]
            if olds and not after.get(var):
                values = _assigns(nf, var)
                if not values or any(identity_literal(v) for v in values):
                    continue
                value = next((v for v in values if _touches(v, added)), values[0])
                out.append(_change(path, key, old, new, olds[0], value, "identity removed", flow))
            elif olds and news and len(before[var]) == len(after[var]):
                for o, n in zip(olds, news, strict=False):
                    if ast.dump(o.test) != ast.dump(n.test) or o.identity != n.identity:
                        out.append(_change(path, key, old, new, o, n.value, "identity condition changed", flow, n))
            elif news and not before.get(var):
                values = _assigns(of, var)
                if not values or any(identity_literal(v) for v in values):
                    continue
                out.append(_change(path, key, old, new, news[0], news[0].value, ADDED, flow, news[0], values[0]))
    return [c for c in out if c.reaches]


def _change(
    path: str,
    key: tuple[str, str],
    old: Module,
    new: Module,
    sel: Selection,
    value: ast.expr,
    change: str,
    flow: Flow,
    new_sel: Selection | None = None,
    old_value: ast.expr | None = None,
) -> IdentityChange:
    var = sel.var
    old_lits: tuple[tuple[str, bool], ...]
    shown = f"if {short(sel.test, 60)}: {var} = ... else: {var} = {sel.identity.split()[0]}"
    if change == ADDED:
        before, after = f"{var} = {short(old_value, 80) if old_value is not None else '...'}", shown
        old_line, old_lits = getattr(old_value, "lineno", sel.node.lineno), ()
    else:
        before = shown
        after = short(value, 100) if new_sel is None else f"if {short(new_sel.test, 60)}: ... ({new_sel.when})"
        old_line, old_lits = sel.node.lineno, value_literals(old, sel.value)
    return IdentityChange(
        path,
        ".".join(p for p in key if p != "<module>"),
        f"{var} = ... (an if statement)",
        var,
        before,
        after,
        sel.identity,
        sel.when,
        tuple(condition_names(sel.test)),
        change,
        old_line,
        value.lineno,
        old_lits,
        value_literals(new, value),
        tuple(flow.reaches(new, value)),
        value,
        new,
        statement=True,
    )


def statement_warnings(changes: list[IdentityChange], said: str) -> list[CountWarning]:
    """For each statement-level change: in which cases the value is applied now, with the sites named
    (``said``: the warnings already given, so a site pair is not said twice)."""
    out: list[CountWarning] = []
    for c in changes:
        if not c.statement or not c.reaches or f"{c.file}:{c.new_line}" in said:
            continue
        sites = ", ".join(f"{r.site.where} (`{r.site.code}`)" for r in c.reaches[:4])
        where = f"{c.file}:{c.new_line}"
        if c.change == "identity removed":
            text = (
                f"{c.factor} is applied in more cases now: before the patch `{c.when}` selected {c.identity} for "
                f"{c.factor} ({c.file}:{c.old_line}); now `{c.factor} = {c.after}` ({where}) reaches {sites} "
                f"in those cases too: check that {c.factor} belongs there"
            )
        elif c.change == ADDED:
            text = (
                f"{c.factor} is no longer applied when `{c.when}`: the new selection ({where}) gives {c.identity} "
                f"there, and the value reaches {sites}: check that nothing else applies it in those cases"
            )
        else:
            text = (
                f"{c.factor}: the condition that selects {c.identity} changed (before `{c.when}`, {c.file}:"
                f"{c.old_line}; now {c.after}, {where}); the value reaches {sites}: "
                "the cases where it is applied may differ"
            )
        out.append(CountWarning(c.factor, text))
    return out
