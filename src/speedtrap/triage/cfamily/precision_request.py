"""A C-family precision request removed, or put under block conditions it did not have, on the statements
of ``statements``: the operation then runs at the backend's default precision.

Catches::

    ggml_mul_mat_set_prec(kq, GGML_PREC_F32);   ->   (removed)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from speedtrap.triage.cfamily.statements import (
    Token,
    statements,
    token_text,
    with_headers,
)
from speedtrap.triage.cfamily.tokens import tokens_at

_PREC = re.compile(r"set_prec|PREC_F32|COMPUTE_32F", re.I)


@dataclass(frozen=True)
class PrecisionChange:
    """A statement that asks for higher precision (``ggml_mul_mat_set_prec(kq, GGML_PREC_F32)``) removed, or
    put under conditions it did not have."""

    code: str
    old_line: int
    new_line: int | None  # None: removed
    conditions: tuple[str, ...] = ()  # the block headers it is newly under

    @property
    def summary(self) -> str:
        if self.new_line is None:
            return f"removes the precision request `{self.code}`: the operation runs at the backend's default precision"
        under = "; ".join(f"`{c}`" for c in self.conditions)
        return (
            f"puts the precision request `{self.code}` under {under}: in the other cases the operation runs at "
            "the backend's default precision"
        )


def precision_changes(
    old_text: str, new_text: str, removed: frozenset[int], added: frozenset[int]
) -> list[PrecisionChange]:
    """Precision requests the changed statements drop or newly condition."""
    old_toks, new_toks = tokens_at(old_text), tokens_at(new_text)
    if old_toks is None or new_toks is None:
        return []

    def requests(toks: list[Token], lines: frozenset[int]) -> list[tuple[list[Token], tuple[str, ...]]]:
        return [
            (s, h)
            for s, h in with_headers(statements(toks))
            if any(s[0][1] <= ln <= s[-1][1] for ln in lines) and any(_PREC.search(t) for t, _ in s)
        ]

    news = requests(new_toks, added)
    out: list[PrecisionChange] = []
    for s, headers in requests(old_toks, removed):
        key = [t for t, _ in s]
        match = next(((n, h) for n, h in news if [t for t, _ in n] == key), None)
        code = token_text(tuple(s)).rstrip(";")
        if match is None:
            out.append(PrecisionChange(code, s[0][1], None))
        elif match[1] != headers:
            newly = tuple(h for h in match[1] if h not in headers)
            if newly:
                out.append(PrecisionChange(code, s[0][1], match[0][0][1], newly))
    return out
