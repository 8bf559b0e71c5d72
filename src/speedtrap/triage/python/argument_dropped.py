"""An argument dropped: a keyword argument deleted from a call that stays (same function, same callee,
no positional argument gained, no ``**mapping``), so the callee computes with its default::

    moe_fused_gate(..., num_fused_shared_experts=n)   ->   moe_fused_gate(...)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from speedtrap.triage.evidence import GUARD, Signal, line_evidence, spans
from speedtrap.triage.source import ChangedFile, Module, position, short


def _calls_in(mod: Module, funcs: set[str]) -> dict[tuple[str, str], list[ast.Call]]:
    out: dict[tuple[str, str], list[ast.Call]] = {}
    for node in sorted((n for n in mod.nodes if isinstance(n, ast.Call)), key=position):
        where = mod.qualname(node)
        if where in funcs:
            out.setdefault((where, short(node.func, 80)), []).append(node)
    return out


def calls_that_stay(cf: ChangedFile, old: Module, new: Module) -> Iterator[tuple[tuple[str, str], ast.Call, ast.Call]]:
    """Each call on a removed line of a changed function with its counterpart in the new version (same function,
    same callee, same count of such calls there): (function and callee, old call, new call)."""
    funcs = {old.qualname(n) for n in old.statements_touching(cf.removed)}
    before, after = _calls_in(old, funcs), _calls_in(new, funcs)
    for key, olds in before.items():
        news = after.get(key, [])
        if len(news) == len(olds):
            yield from ((key, o, n) for o, n in zip(olds, news, strict=True) if spans(o, cf.removed))


def dropped_arguments(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """A keyword argument deleted from a call that stays (same function, same callee, the positional
    arguments not grown to take it): the callee now computes with its default for that parameter."""
    out: list[Signal] = []
    for key, o, n in calls_that_stay(cf, old, new):
        if len(n.args) > len(o.args):
            continue
        if any(k.arg is None for k in n.keywords):
            continue  # a **mapping may pass it now
        kept = {k.arg for k in n.keywords}
        for kw in o.keywords:
            if kw.arg is None or kw.arg in kept or not spans(kw, cf.removed):
                continue
            out.append(
                Signal(
                    GUARD,
                    f"drops `{kw.arg}={short(kw.value, 60)}` from the call `{key[1]}(...)` in "
                    f"{key[0].replace('<module>', 'module level')}: the callee now uses its default for "
                    f"`{kw.arg}`",
                    (line_evidence(cf, kw.lineno, "-"),),
                    data={"kind": "argument dropped", "argument": True, "names": [kw.arg]},
                )
            )
    return out
