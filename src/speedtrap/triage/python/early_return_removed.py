"""An early return of the unscaled value removed: ``if c: return base`` taken out of a function that, past it,
returns ``base`` multiplied or divided (``return base * mscale * mscale``). The cases ``c`` selected used to get
``base`` as it was; now they reach the scaled return, so the scale applies in more cases. A scale signal naming
the removed statement, the return the cases now reach, and the operands that scale them.

Catches::

    if not rope_scaling.get("apply_yarn_scaling", True): return base   ->   (removed)

"""

from __future__ import annotations

import ast

from speedtrap.triage.evidence import SCALE, Evidence, Signal
from speedtrap.triage.source import ChangedFile, Module

EARLY_RETURN_REMOVED = "early return removed"


def _early_returns(mod: Module, func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[ast.If, ast.expr]]:
    """``if c: return v`` statements (no else) directly in the function's body, with ``v`` a name or attribute."""
    out: list[tuple[ast.If, ast.expr]] = []
    for stmt in func.body:
        if (
            isinstance(stmt, ast.If)
            and not stmt.orelse
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], ast.Return)
            and isinstance(stmt.body[0].value, (ast.Name, ast.Attribute))
        ):
            out.append((stmt, stmt.body[0].value))
    return out


def _scaled_returns(func: ast.FunctionDef | ast.AsyncFunctionDef, value: ast.expr) -> list[tuple[ast.Return, str]]:
    """Returns of ``func`` whose value multiplies or divides ``value`` (as written), with the other operands."""
    key = ast.dump(value)
    out: list[tuple[ast.Return, str]] = []
    for node in ast.walk(func):
        if not (isinstance(node, ast.Return) and node.value is not None):
            continue
        ops = [n for n in ast.walk(node.value) if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mult, ast.Div))]
        if not any(ast.dump(side) == key for op in ops for side in (op.left, op.right)):
            continue
        others = sorted(
            {
                ast.unparse(side)
                for op in ops
                for side in (op.left, op.right)
                if ast.dump(side) != key and not isinstance(side, ast.BinOp)
            }
        )
        out.append((node, ", ".join(others)))
    return out


def early_returns_removed(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """Each ``if c: return v`` removed from a function that still returns ``v`` scaled."""
    out: list[Signal] = []
    after = {(new.qualname(f), f.name): f for f in new.functions_touching(cf.added | _near(cf))}
    for func in old.functions_touching(cf.removed):
        now = after.get((old.qualname(func), func.name))
        if now is None:
            continue
        kept = {ast.dump(s.test) for s, _v in _early_returns(new, now)}
        for stmt, value in _early_returns(old, func):
            if stmt.lineno not in cf.removed or ast.dump(stmt.test) in kept:
                continue
            for ret, scale in _scaled_returns(now, value):
                cond = ast.unparse(stmt.test)
                cond = cond if len(cond) <= 90 else cond[:87] + "..."
                evidence = [
                    Evidence(cf.path, ln, "-", cf.removed_text(ln))
                    for ln in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
                    if ln in cf.removed
                ]
                evidence.append(Evidence(cf.path, ret.lineno, " ", cf.added_text(ret.lineno)))
                out.append(
                    Signal(
                        SCALE,
                        f"removes the early return `if {cond}: return {ast.unparse(value)}` from {func.name}: those "
                        f"cases now reach `{ast.unparse(ret)}` ({cf.path}:{ret.lineno}), scaled by {scale} where "
                        f"{ast.unparse(value)} was returned as it was",
                        tuple(evidence),
                        data={"factor": scale.split(", ")[0], "change": EARLY_RETURN_REMOVED, "reaches": True},
                    )
                )
                break
    return out


def _near(cf: ChangedFile) -> frozenset[int]:
    """A pure deletion adds no line: the new file's functions around where the removed lines were."""
    if cf.added or not cf.removed:
        return frozenset()
    first = min(cf.removed)
    return frozenset({max(1, first - 1), first})
