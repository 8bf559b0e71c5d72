"""An argument dropped: a keyword argument deleted from a call that stays (same function, same callee,
no positional argument gained, no ``**mapping``), so the callee computes with its default::

    moe_fused_gate(..., num_fused_shared_experts=n)   ->   moe_fused_gate(...)

What the dropped argument carried is read too, since the default is usually the identity or the low precision:

- a factor (the keyword or its value named like a scale: ``routed_scaling_factor=...``): the call no longer
  applies it, a scale signal (``factor dropped``), as a factor replaced by its identity would be;
- a float32 request (``out_dtype=torch.float32``, ``dtype=torch.float``, ``"fp32"``): the callee now computes or
  returns in its default precision, a precision signal.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

from speedtrap.triage.evidence import GUARD, PRECISION, SCALE, Signal, line_evidence, spans
from speedtrap.triage.source import ChangedFile, Module, position, short

_FACTOR = re.compile(r"scal|factor|coef|multiplier|gamma|alpha", re.I)
_FP32_ATTRS = {"float32", "float64", "float", "double"}
_FP32_STRINGS = {"float32", "fp32", "float64", "fp64", "float", "double", "highest"}


def _factor_named(kw: ast.keyword) -> str | None:
    """The factor a keyword argument carries: the keyword's name, else a name in its value, named like a scale."""
    if kw.arg and _FACTOR.search(kw.arg):
        return kw.arg
    names = [
        n.attr if isinstance(n, ast.Attribute) else n.id
        for n in ast.walk(kw.value)
        if isinstance(n, (ast.Attribute, ast.Name))
    ]
    return next((n for n in names if _FACTOR.search(n)), None)


def _requests_fp32(value: ast.expr) -> bool:
    """Whether a value asks for float32 or wider (``torch.float32``, ``torch.float``, ``"fp32"``, ``x.float()``)."""
    for n in ast.walk(value):
        if isinstance(n, ast.Attribute) and n.attr in _FP32_ATTRS:
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.lower() in _FP32_STRINGS:
            return True
    return False


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
            where = key[0].replace("<module>", "module level")
            dropped = f"drops `{kw.arg}={short(kw.value, 60)}` from the call `{key[1]}(...)` in {where}"
            evidence = (line_evidence(cf, kw.lineno, "-"),)
            out.append(
                Signal(
                    GUARD,
                    f"{dropped}: the callee now uses its default for `{kw.arg}`",
                    evidence,
                    data={"kind": "argument dropped", "argument": True, "names": [kw.arg]},
                )
            )
            factor = _factor_named(kw)
            if factor is not None:
                data = {"factor": factor, "change": "factor dropped", "slot": f"{key[1]}({kw.arg}=)"}
                out.append(
                    Signal(SCALE, f"{dropped}: the call no longer passes the factor `{factor}`", evidence, data=data)
                )
            if _requests_fp32(kw.value):
                requested: dict[str, Any] = {"kind": "precision request dropped", "dtypes": ["default"]}
                out.append(
                    Signal(
                        PRECISION,
                        f"{dropped}: the float32 request is gone, the callee's default precision",
                        evidence,
                        data=requested,
                    )
                )
    return out
