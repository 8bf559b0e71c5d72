"""A guard removed: an ``assert``, ``raise NotImplementedError`` or ``if ...: raise`` taken out, more
when its names now drive new code::

    assert not use_hash_topk, "not implemented"   ->   if use_hash_topk: topk = hash_topk(...)
"""

from __future__ import annotations

import ast

from speedtrap.triage.evidence import (
    GUARD,
    Signal,
    line_evidence,
    spans,
)
from speedtrap.triage.source import ChangedFile, Module, condition_names, last_name, short


def guards_removed(cf: ChangedFile, old: Module, new: Module | None) -> list[Signal]:
    out: list[Signal] = []
    covered: set[int] = set()
    added_names: dict[str, set[int]] = {}
    if new is not None:
        for node in new.nodes_on_lines(cf.added):
            if isinstance(node, ast.arg):
                added_names.setdefault(node.arg, set()).add(node.lineno)
            elif isinstance(node, (ast.Name, ast.Attribute)):
                added_names.setdefault(last_name(node) or "", set()).add(node.lineno)
    for node in old.nodes:
        if not isinstance(node, ast.stmt):
            continue
        kind: str | None = None
        test: ast.AST = node
        if isinstance(node, ast.If) and node.body and all(isinstance(s, ast.Raise) for s in node.body):
            kind, test = "if ...: raise", node.test
            covered.update(id(s) for s in node.body)
        elif isinstance(node, ast.Assert):
            kind, test = "assert", node.test
        elif isinstance(node, ast.Raise) and id(node) not in covered:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if exc is None or last_name(exc) != "NotImplementedError":
                continue
            kind = "raise NotImplementedError"
        if kind is None or not (node.lineno in cf.removed or (kind == "assert" and spans(node, cf.removed))):
            continue
        stmt_text = (
            short(node, 160) if not isinstance(node, ast.If) else f"if {short(node.test)}: {short(node.body[0], 80)}"
        )
        not_impl = "not implemented" in stmt_text.lower() or "notimplemented" in stmt_text.lower()
        names = (
            [n for n in condition_names(test) if n not in {"NotImplementedError"}] if isinstance(test, ast.expr) else []
        )
        used = [n for n in names if n in added_names]
        uses = sorted({ln for n in used for ln in added_names[n]})[:4]
        evidence = [
            line_evidence(cf, ln, "-")
            for ln in sorted(cf.removed)
            if node.lineno <= ln <= (node.end_lineno or node.lineno)
        ]
        evidence += [line_evidence(cf, ln, "+") for ln in uses]
        where = old.qualname(node).replace("<module>", "module level")
        label = "'not implemented' guard" if not_impl else f"guard ({kind})"
        if uses:
            text = (
                f"replaces the {label} `{stmt_text}` ({where}) with real logic: {', '.join(used)} now drives "
                f"new code at {', '.join(f'{cf.path}:{ln}' for ln in uses)}"
            )
        elif cf.added:
            text = f"removes the {label} `{stmt_text}` ({where}) and adds code"
        else:
            text = f"removes the {label} `{stmt_text}` ({where})"
        out.append(
            Signal(
                GUARD,
                text,
                tuple(evidence),
                data={"kind": kind, "not_implemented": not_impl, "replaced": bool(uses), "names": names},
            )
        )
    return out
