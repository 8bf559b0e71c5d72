"""Factors at call sites and in returned values: an identity literal (``1.0``, ``None``) in an argument
replaced by a factor (``FusedMoE(routed_scaling_factor=1.0)`` -> ``=self.routed_scaling_factor``), the reverse, and a
factor newly passed to a call (``quant_method.apply(layer, x, scale=layer.scale)``). A returned value
(``return q * k, v_scale`` -> ``return q * k, 1.0``) is a slot too: the callers receive the identity.

Each is an :class:`IdentityChange` with ``unconditional`` set: before the patch the factor did not
flow through that argument at all, so every multiply it now reaches is a new application (and the
reverse removes one). The value is followed with :class:`Flow` to the callee's multiplies.

Catches::

    FusedMoE(routed_scaling_factor=1.0)   ->   FusedMoE(routed_scaling_factor=self.routed_scaling_factor)

"""

from __future__ import annotations

import ast
import re

from speedtrap.triage.flow.values import (
    Flow,
    IdentityChange,
    Reach,
    argument_slots,
    identity_literal,
    returned_words,
    value_literals,
)
from speedtrap.triage.source import Module, last_name, short

_FACTOR = re.compile(r"scal|factor|coef|multiplier|gamma|alpha", re.I)


def _factor_of(node: ast.AST) -> str | None:
    """The factor-like name an expression reads (``self.routed_scaling_factor`` -> that name)."""
    names = [last_name(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))]
    return next((n for n in names if n and _FACTOR.search(n)), None)


def _spans(node: ast.AST, lines: frozenset[int]) -> bool:
    start = getattr(node, "lineno", 0)
    end = getattr(node, "end_lineno", start) or start
    return any(start <= ln <= end for ln in lines)


def literal_changes(
    path: str, old: Module, new: Module, added: frozenset[int], removed: frozenset[int], flow: Flow
) -> list[IdentityChange]:
    out: list[IdentityChange] = []
    old_slots, new_slots = argument_slots(old), argument_slots(new)
    for key, news in new_slots.items():
        if key[0] == "assign":
            continue  # call arguments only: a local's value is read by the scale detector
        olds = old_slots.get(key)
        if olds is None:
            if key[0] == "kw":
                out.extend(_newly_passed(path, new, key, news, added, flow))
            continue
        if len(olds) != len(news):
            continue
        for before, after in zip(olds, news, strict=True):
            if not (_spans(after, added) or _spans(before, removed)) or ast.dump(before) == ast.dump(after):
                continue
            ident_before, ident_after = identity_literal(before), identity_literal(after)
            if isinstance(before, ast.IfExp) or isinstance(after, ast.IfExp):
                continue  # conditional identities are the flow module's
            if ident_before and not ident_after:
                factor = _factor_of(after) or (key[3] if key[0] == "kw" and _FACTOR.search(key[3]) else None)
                reaches = tuple(flow.reaches(new, after))
                if factor is None or not (reaches or _factor_of(after)):
                    continue
                out.append(
                    _change(
                        path, new, key, before, after, ident_before, factor, "identity literal replaced", reaches, after
                    )
                )
            elif ident_after and not ident_before:
                factor = _factor_of(before)
                if factor is None:
                    continue
                reaches = tuple(flow.reaches(old, before))
                out.append(
                    _change(
                        path,
                        new,
                        key,
                        before,
                        after,
                        ident_after,
                        factor,
                        "factor replaced by identity",
                        reaches,
                        after,
                    )
                )
    return out


def _newly_passed(
    path: str, new: Module, key: tuple[str, ...], news: list[ast.expr], added: frozenset[int], flow: Flow
) -> list[IdentityChange]:
    out: list[IdentityChange] = []
    for after in news:
        if not _spans(after, added) or identity_literal(after):
            continue
        factor = _factor_of(after)
        if factor is None:
            continue
        reaches = tuple(flow.reaches(new, after))
        out.append(_change(path, new, key, None, after, "no argument", factor, "factor newly passed", reaches, after))
    return out


def _change(
    path: str,
    new: Module,
    key: tuple[str, ...],
    before: ast.expr | None,
    after: ast.expr,
    identity: str,
    factor: str,
    change: str,
    reaches: tuple[Reach, ...],
    node: ast.expr,
    old_line: int | None = None,
) -> IdentityChange:
    if key[0] == "ret":
        slot = returned_words(key)
    else:
        slot = f"{key[2]}({key[3]}=)" if key[0] == "kw" else f"{key[2]}(argument {key[3]})"
    return IdentityChange(
        path,
        new.qualname(after),
        slot,
        factor,
        short(before, 100) if before is not None else "(not passed)",
        short(after, 100),
        identity,
        "always",
        (),
        change,
        old_line if old_line is not None else (before.lineno if before is not None else after.lineno),
        after.lineno,
        (),
        value_literals(new, node),
        reaches,
        node,
        new,
        True,
        returned=key[0] == "ret",
    )
