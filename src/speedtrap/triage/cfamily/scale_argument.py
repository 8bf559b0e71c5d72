"""A C-family scale argument, on the calls of ``statements``: an identity literal (``1.0f``, ``1.0``, ``1``)
replacing a scale-like expression at a call argument, or the reverse. Only a change between an identity
literal and a scale-like expression (a product or quotient, a root, a power, an exponential, or a name such
as ``kq_scale``) is reported: other argument changes stay "changes computation" without a pattern.

Catches::

    build_attn(..., 1.0f/sqrtf(float(d)), il)   ->   build_attn(..., 1.0f, il)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from speedtrap.triage.cfamily.statements import (
    Token,
    calls,
    changed_pairs,
    strip_outer,
    token_text,
)

_IDENTITY = re.compile(r"^(?:1|1[uU]?[lL]{0,2}|1\.0*[fFlL]?|1\.0*e[+-]?0+[fFlL]?)$")


_SCALE_WORD = re.compile(r"scal|factor|coef|multiplier|gamma|alpha|temperature", re.I)


_SCALE_CALL = {"sqrt", "sqrtf", "rsqrt", "rsqrtf", "pow", "powf", "exp", "expf", "exp2f", "ldexpf", "ldexp"}


@dataclass(frozen=True)
class ArgChange:
    callee: str
    index: int  # 0-based argument position
    before: str
    after: str
    old_line: int
    new_line: int
    change: str  # "factor replaced by identity" or "identity literal replaced"

    @property
    def summary(self) -> str:
        slot = f"{self.callee}(argument {self.index + 1})"
        if self.change == "factor replaced by identity":
            return (
                f"replaces the scale-like argument `{self.before}` by the identity `{self.after}` at {slot}: "
                "if that argument scales, the scale is no longer applied there"
            )
        return (
            f"replaces the identity `{self.before}` by the scale-like `{self.after}` at {slot}: "
            "if that argument scales, a scale is now applied there (check it is applied exactly once)"
        )


def is_identity(arg: tuple[Token, ...]) -> bool:
    inner = strip_outer(arg)
    return len(inner) == 1 and bool(_IDENTITY.match(inner[0][0]))


def is_scale_like(arg: tuple[Token, ...]) -> bool:
    inner = strip_outer(arg)
    texts = [t for t, _ in inner]
    if any(t in ("*", "/") for t in texts[1:]):  # a product or quotient (not a leading dereference)
        return True
    words = [t for t in texts if t[:1].isalpha() or t[:1] == "_"]  # names, members (``hp.f_scale``) too
    return any(t in _SCALE_CALL or _SCALE_WORD.search(t) for t in words)


def argument_changes(old_text: str, new_text: str, removed: frozenset[int], added: frozenset[int]) -> list[ArgChange]:
    """Identity literals swapped with scale-like expressions at call arguments in the changed statements."""
    out: list[ArgChange] = []
    for before, after in changed_pairs(old_text, new_text, removed, added):
        new_calls = {c.key: c for c in calls(after)}
        for oc in calls(before):
            nc = new_calls.get(oc.key)
            if nc is None:
                continue
            for i, (x, y) in enumerate(zip(oc.args, nc.args, strict=True)):
                if [t for t, _ in x] == [t for t, _ in y] or not x or not y:
                    continue
                if is_identity(y) and is_scale_like(x):
                    change = "factor replaced by identity"
                elif is_identity(x) and is_scale_like(y):
                    change = "identity literal replaced"
                else:
                    continue
                out.append(ArgChange(oc.name, i, token_text(x), token_text(y), x[0][1], y[0][1], change))
    return out
