"""C-family code read on the token stream (``tokens``) as statements and calls, for the C-family rules.

Statements are token runs ended by ``;``, ``{`` or ``}`` outside brackets (and by a directive's line
end). The statements the diff touches in the old and the new file are paired in order; inside a
pair, calls are matched by callee name, occurrence and number of arguments, so the rules compare them
argument by argument (``scale_argument``) or statement by statement (``precision_request``,
``case_moved``, ``switch_unset``)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from speedtrap.triage.cfamily.tokens import tokens_at

Token = tuple[str, int]  # (text, line)


NOT_CALLS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "catch", "static_assert"}


_OPEN, _CLOSE = {"(", "[", "{"}, {")", "]", "}"}


@dataclass(frozen=True)
class Call:
    name: str
    nth: int  # occurrence of this callee name in its statement
    args: tuple[tuple[Token, ...], ...]

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.name, self.nth, len(self.args))


def statements(toks: list[Token]) -> list[list[Token]]:
    """``toks`` cut into statements at ``;``, ``{``, ``}`` outside parentheses and brackets, and at a
    directive's line end."""
    out: list[list[Token]] = []
    cur: list[Token] = []
    depth = 0
    for tok in toks:
        text = tok[0]
        if text == "\n":
            if cur:
                out.append(cur)
            cur = []
            depth = 0
            continue
        cur.append(tok)
        if text in ("(", "["):
            depth += 1
        elif text in (")", "]"):
            depth = max(0, depth - 1)
        elif depth == 0 and text in (";", "{", "}"):
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def calls(stmt: list[Token]) -> list[Call]:
    """Every call ``name(args)`` in a statement (nested ones too), arguments split at top-level commas."""
    out: list[Call] = []
    seen: dict[str, int] = {}
    for i in range(len(stmt) - 1):
        name = stmt[i][0]
        if stmt[i + 1][0] != "(" or not is_name(name) or name in NOT_CALLS:
            continue
        args: list[tuple[Token, ...]] = []
        cur: list[Token] = []
        depth = 0
        closed = False
        for tok in stmt[i + 2 :]:
            if tok[0] in _OPEN:
                depth += 1
            elif tok[0] in _CLOSE:
                if depth == 0:
                    closed = True
                    break
                depth -= 1
            if depth == 0 and tok[0] == ",":
                args.append(tuple(cur))
                cur = []
                continue
            cur.append(tok)
        if not closed:
            continue
        if cur or args:
            args.append(tuple(cur))
        nth = seen.get(name, 0)
        seen[name] = nth + 1
        out.append(Call(name, nth, tuple(args)))
    return out


def is_name(text: str) -> bool:
    return bool(text) and (text[0].isalpha() or text[0] == "_") and "." not in text


def token_text(arg: tuple[Token, ...]) -> str:
    out = ""
    for t, _ in arg:
        joined = out and (is_name(out[-1]) or out[-1].isdigit()) and (is_name(t) or t[0].isdigit())
        out += (" " if joined else "") + t + (" " if t == "," else "")
    return out


def strip_outer(arg: tuple[Token, ...]) -> tuple[Token, ...]:
    while len(arg) >= 2 and arg[0][0] == "(" and arg[-1][0] == ")" and balanced(arg[1:-1]):
        arg = arg[1:-1]
    return arg


def balanced(arg: tuple[Token, ...]) -> bool:
    depth = 0
    for t, _ in arg:
        depth += t in _OPEN
        depth -= t in _CLOSE
        if depth < 0:
            return False
    return depth == 0


def touching(stmts: list[list[Token]], lines: frozenset[int]) -> list[list[Token]]:
    return [s for s in stmts if any(s[0][1] <= ln <= s[-1][1] for ln in lines)]


def _pairs(old: list[list[Token]], new: list[list[Token]]) -> list[tuple[list[Token], list[Token]]]:
    a = [tuple(t for t, _ in s) for s in old]
    b = [tuple(t for t, _ in s) for s in new]
    out: list[tuple[list[Token], list[Token]]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "replace":
            if i2 - i1 == j2 - j1:
                out.extend(zip(old[i1:i2], new[j1:j2], strict=True))
            else:  # each old statement with the most similar new one
                for s in old[i1:i2]:
                    sa = tuple(t for t, _ in s)
                    best = max(
                        new[j1:j2], key=lambda n: difflib.SequenceMatcher(None, sa, tuple(t for t, _ in n)).ratio()
                    )
                    out.append((s, best))
    return out


def changed_pairs(
    old_text: str, new_text: str, removed: frozenset[int], added: frozenset[int]
) -> list[tuple[list[Token], list[Token]]]:
    """The statements on changed lines, each old one with its new counterpart (none when a text has a raw string)."""
    old_toks, new_toks = tokens_at(old_text), tokens_at(new_text)
    if old_toks is None or new_toks is None:
        return []
    return _pairs(touching(statements(old_toks), removed), touching(statements(new_toks), added))


def with_headers(stmts: list[list[Token]]) -> list[tuple[list[Token], tuple[str, ...]]]:
    """Each statement with the headers (``if (...) {``, ``} else {``) of the blocks around it."""
    out: list[tuple[list[Token], tuple[str, ...]]] = []
    stack: list[str] = []
    for s in stmts:
        last = s[-1][0]
        out.append((s, tuple(stack)))
        if last == "}" and stack:
            stack.pop()
        elif last == "{":
            stack.append(token_text(tuple(s)))
    return out
