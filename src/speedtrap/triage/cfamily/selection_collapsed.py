"""A selection collapsed into one of its arms, C-family (on the statements of ``statements``): ``c ? A : B``
replaced by ``B`` alone, the rest of the statement unchanged::

    rope_type == LLAMA_ROPE_TYPE_MROPE ? LLAMA_ROPE_TYPE_NEOX : rope_type   ->   rope_type
"""

from __future__ import annotations

from speedtrap.triage.cfamily.statements import Token, changed_pairs
from speedtrap.triage.python import Collapse

_OPEN = {"(": ")", "[": "]", "{": "}"}


_STARTS = {"=", "+=", "-=", "*=", "/=", "(", ",", "return", "{", "[", "?", ":"}


def _text(toks: list[Token]) -> str:
    out = " ".join(t for t, _ in toks)
    for a, b in ((" . ", "."), (" -> ", "->"), ("( ", "("), (" )", ")"), (" ,", ","), (" :: ", "::")):
        out = out.replace(a, b)
    return out if len(out) <= 80 else out[:77] + "..."


def _conditionals(stmt: list[Token]) -> list[tuple[int, int, int, int]]:
    """Each ``c ? a : b`` in a statement: (start of c, index of ?, index of its :, end of b, exclusive)."""
    levels: list[int] = []
    d = 0
    for tok, _line in stmt:  # a bracket pair sits on the level of what it holds
        if tok in _OPEN:
            d += 1
        levels.append(d)
        if tok in _OPEN.values():
            d = max(0, d - 1)
    out: list[tuple[int, int, int, int]] = []
    for q, (tok, _line) in enumerate(stmt):
        if tok != "?":
            continue
        lvl = levels[q]
        nested = 0
        colon = None
        for j in range(q + 1, len(stmt)):
            if levels[j] < lvl or (levels[j] == lvl and stmt[j][0] in (")", "]", "}", ",", ";")):
                break
            if levels[j] == lvl and stmt[j][0] == "?":
                nested += 1
            elif levels[j] == lvl and stmt[j][0] == ":":
                if nested == 0:
                    colon = j
                    break
                nested -= 1
        if colon is None:
            continue
        start = q
        while start > 0 and not (levels[start - 1] == lvl and stmt[start - 1][0] in _STARTS):
            if levels[start - 1] < lvl:
                break
            start -= 1
        end = colon + 1
        while end < len(stmt) and not (
            levels[end] < lvl or (levels[end] == lvl and stmt[end][0] in (")", "]", "}", ",", ";", ":"))
        ):
            end += 1
        if start < q and colon > q + 1 and end > colon + 1:
            out.append((start, q, colon, end))
    return out


def c_collapses(old_text: str, new_text: str, removed: frozenset[int], added: frozenset[int]) -> list[Collapse]:
    """C-family: changed statements that are an old one with a conditional replaced by one of its arms."""
    out: list[Collapse] = []
    for before, after in changed_pairs(old_text, new_text, removed, added):
        want = [t for t, _ in after]
        for start, q, colon, end in _conditionals(before):
            yes, no = before[q + 1 : colon], before[colon + 1 : end]
            for taken, dropped in ((no, yes), (yes, no)):
                if [t for t, _ in before[:start] + taken + before[end:]] == want:
                    cond = _text(before[start:q])
                    out.append(Collapse(cond, _text(taken), _text(dropped), before[q][1], after[0][1]))
                    break
    return out
