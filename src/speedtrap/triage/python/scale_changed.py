"""A multiply or divide by a factor-like name or a normaliser added, removed, moved, re-guarded, or
moved into a loop::

    residual + out * (scale_depth / n)   ->   residual + out
"""

from __future__ import annotations

import ast
import re

from speedtrap.triage.evidence import (
    SCALE,
    Signal,
    line_evidence,
)
from speedtrap.triage.flow import ALPHA_CALLS, DIV_CALLS, MUL_CALLS
from speedtrap.triage.source import ChangedFile, Module, last_name, short

_FACTOR = re.compile(r"scal|factor|coef|multiplier|temperature|gamma|alpha", re.I)


_ROOTS = {"sqrt", "rsqrt", "isqrt"}


def _factor_names(operand: ast.AST, symbol: str | None) -> list[str]:
    """Factor-like names an operand reads: ``self.scale``, or inside ``(self.scale_depth / sqrt(n))``; and
    a normaliser it computes, named by its text: a root or inverse power (``hidden_size**-0.5``,
    ``d ** 0.5``, ``math.sqrt(d)``, ``torch.rsqrt(v)``)."""
    out: list[str] = []
    for n in ast.walk(operand):
        if isinstance(n, (ast.Name, ast.Attribute)):
            name = last_name(n)
            if name and (name == symbol or _FACTOR.search(name)) and name not in out:
                out.append(name)
    for n in ast.walk(operand):
        label = _normaliser(n)
        if label is not None and label not in out:
            out.append(label)
    return out


def _normaliser(node: ast.AST) -> str | None:
    """``x ** e`` with a fractional or negative constant ``e``, or a (reciprocal) square root, as text."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        e = node.right
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub) and isinstance(e.operand, ast.Constant):
            value = e.operand.value
            return short(node, 80) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if isinstance(e, ast.Constant) and isinstance(e.value, float) and not e.value.is_integer():
            return short(node, 80)
    if isinstance(node, ast.Call) and last_name(node.func) in _ROOTS:
        return short(node, 80)
    return None


def _factor_ops(mod: Module, lines: frozenset[int], symbol: str | None) -> dict[str, list[tuple[ast.AST, str]]]:
    out: dict[str, list[tuple[ast.AST, str]]] = {}
    for node in mod.nodes_on_lines(lines):
        operands: list[ast.AST] = []
        op = ""
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
            operands, op = (
                ([node.left, node.right] if isinstance(node.op, ast.Mult) else [node.right]),
                "multiply" if isinstance(node.op, ast.Mult) else "divide",
            )
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Mult, ast.Div)):
            operands, op = [node.value], "multiply" if isinstance(node.op, ast.Mult) else "divide"
        elif isinstance(node, ast.Call):
            callee = last_name(node.func) if isinstance(node.func, (ast.Name, ast.Attribute)) else None
            if callee in MUL_CALLS:
                operands, op = list(node.args), "multiply"
            elif callee in DIV_CALLS:
                operands, op = list(node.args[-1:]), "divide"
            elif callee in ALPHA_CALLS:
                operands, op = [k.value for k in node.keywords if k.arg == "alpha"], "multiply"
        for operand in operands:
            for name in _factor_names(operand, symbol):
                out.setdefault(name, []).append((node, op))
    return out


def _in_loop(mod: Module, node: ast.AST) -> str | None:
    """The loop (``for layer in self.layers``) that repeats ``node`` within its function, if any."""
    for anc in mod.ancestors(node):
        if isinstance(anc, (ast.For, ast.AsyncFor)):
            return f"for {short(anc.target, 30)} in {short(anc.iter, 50)}"
        if isinstance(anc, ast.While):
            return f"while {short(anc.test, 50)}"
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return None
    return None


def scale(cf: ChangedFile, new: Module | None, old: Module | None, symbol: str | None) -> list[Signal]:
    added = _factor_ops(new, cf.added, symbol) if new else {}
    removed = _factor_ops(old, cf.removed, symbol) if old else {}
    out: list[Signal] = []
    for name in sorted(set(added) | set(removed)):
        a, r = added.get(name, []), removed.get(name, [])
        ev = [line_evidence(cf, n, "-") for n, _ in r] + [line_evidence(cf, n, "+") for n, _ in a]
        a_funcs = sorted({new.qualname(n) for n, _ in a}) if new else []
        r_funcs = sorted({old.qualname(n) for n, _ in r}) if old else []
        op = (a or r)[0][1]
        if a and not r:
            guards = (
                [" and ".join(new.describe_guard(g) for g in new.guards(n)) or "unconditionally" for n, _ in a]
                if new
                else []
            )
            text = f"adds a {op} by {name} in {', '.join(a_funcs)} ({'; '.join(sorted(set(guards)))})"
            change = "added"
        elif r and not a:
            text = f"removes a {op} by {name} from {', '.join(r_funcs)}"
            change = "removed"
        elif a_funcs != r_funcs:
            text = f"moves a {op} by {name} from {', '.join(r_funcs)} to {', '.join(a_funcs)}"
            change = "moved"
        else:
            assert new is not None and old is not None
            before = {" and ".join(old.describe_guard(g) for g in old.guards(n)) or "unconditional" for n, _ in r}
            after = {" and ".join(new.describe_guard(g) for g in new.guards(n)) or "unconditional" for n, _ in a}
            loops_before = {_in_loop(old, n) for n, _ in r}
            loops_after = {_in_loop(new, n) for n, _ in a}
            if before == after and loops_before != loops_after:
                was = " / ".join(sorted(x or "once" for x in loops_before))
                now = " / ".join(sorted(f"once per iteration of `{x}`" if x else "once" for x in loops_after))
                text = f"changes how many times the {op} by {name} in {', '.join(a_funcs)} runs: was {was}, now {now}"
                change = "repeat changed"
            elif before == after:
                text, change = f"rewrites a {op} by {name} in {', '.join(a_funcs)}", "rewritten"
            else:
                text = (
                    f"changes when the {op} by {name} in {', '.join(a_funcs)} applies: was "
                    f"{' / '.join(sorted(before))}, now {' / '.join(sorted(after))}"
                )
                change = "guard changed"
        out.append(Signal(SCALE, text, tuple(ev), data={"factor": name, "change": change}))
    return out
