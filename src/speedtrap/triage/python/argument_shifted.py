"""An argument shifted: a call that stays whose arguments now bind to other parameters of the callee
(a keyword turned positional, one inserted before the others), read against the callee's signature::

    rotary(q, k, positions)   ->   rotary(positions, q, k)
"""

from __future__ import annotations

import ast

from speedtrap.triage.evidence import GUARD, Signal, line_evidence, spans
from speedtrap.triage.flow import Resolver
from speedtrap.triage.python.argument_dropped import calls_that_stay
from speedtrap.triage.source import ChangedFile, Module, short


def _parameters(resolver: Resolver, mod: Module, call: ast.Call) -> list[str] | None:
    """The positional parameter names of the plain function a call runs (``kernel[grid](...)``, a Triton launch,
    runs ``kernel``), or None when it cannot be read (a method, a class, ``*args`` first, not found)."""
    func = call.func.value if isinstance(call.func, ast.Subscript) else call.func
    found = resolver.callee(mod, ast.copy_location(ast.Call(func=func, args=[], keywords=[]), call))
    if found is None or not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    names = [a.arg for a in (*found.node.args.posonlyargs, *found.node.args.args)]
    return None if names[:1] in (["self"], ["cls"]) else names


def shifted_arguments(cf: ChangedFile, old: Module, new: Module, resolver: Resolver) -> list[Signal]:
    """A keyword argument turned positional at a call that stays (same function, same callee): bound against the
    callee's signature, the new positional argument lands in another parameter (one inserted before the keyword's,
    say), and the keyword's parameter takes its default."""
    out: list[Signal] = []
    for key, o, n in calls_that_stay(cf, old, new):
        if len(n.args) <= len(o.args):
            continue
        if any(isinstance(a, ast.Starred) for a in n.args) or any(k.arg is None for k in n.keywords):
            continue
        kept = {k.arg for k in n.keywords}
        dropped = [k for k in o.keywords if k.arg is not None and k.arg not in kept and spans(k, cf.removed)]
        params = _parameters(resolver, new, n) if dropped else None
        if not params:
            continue
        bound = {j: params[j] for j in range(len(o.args), len(n.args)) if j < len(params)}
        for kw in dropped:
            if kw.arg not in params or kw.arg in bound.values() or not bound:
                continue
            j, name = next(iter(bound.items()))
            out.append(
                Signal(
                    GUARD,
                    f"passes `{short(n.args[j], 60)}` positionally to `{key[1]}(...)` in "
                    f"{key[0].replace('<module>', 'module level')} instead of `{kw.arg}=`: bound against the "
                    f"callee's signature it lands in `{name}` (argument {j + 1}), and `{kw.arg}` takes its default",
                    (line_evidence(cf, kw.lineno, "-"), line_evidence(cf, n.args[j].lineno, "+")),
                    data={"kind": "argument shifted", "argument": True, "names": [kw.arg, name]},
                )
            )
    return out
