"""Call arguments in C-family code, read on the token stream (``_ctokens``): an identity literal
(``1.0f``, ``1.0``, ``1``) replacing a scale-like expression at a call argument, or the reverse::

    build_attn(inp, wo, NULL, Q, K, V, NULL, NULL, 1.0f/sqrtf(float(d)), il)
    build_attn(inp, wo, NULL, Q, K, V, NULL, NULL, 1.0f, il)

Statements are token runs ended by ``;``, ``{`` or ``}`` outside brackets (and by a directive's line
end). The statements the diff touches in the old and the new file are paired in order; inside a
pair, calls are matched by callee name, occurrence and number of arguments, and compared argument
by argument. Only a change between an identity literal and a scale-like expression (a product or
quotient, a root, a power, an exponential, or a name such as ``kq_scale``) is reported: other
argument changes stay "changes computation" without a pattern.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from speedtrap.triage.cfamily.tokens import tokens_at

Token = tuple[str, int]  # (text, line)

_IDENTITY = re.compile(r"^(?:1|1[uU]?[lL]{0,2}|1\.0*[fFlL]?|1\.0*e[+-]?0+[fFlL]?)$")
_SCALE_WORD = re.compile(r"scal|factor|coef|multiplier|gamma|alpha|temperature", re.I)
_SCALE_CALL = {"sqrt", "sqrtf", "rsqrt", "rsqrtf", "pow", "powf", "exp", "expf", "exp2f", "ldexpf", "ldexp"}
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
        if stmt[i + 1][0] != "(" or not _is_name(name) or name in NOT_CALLS:
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


def _is_name(text: str) -> bool:
    return bool(text) and (text[0].isalpha() or text[0] == "_") and "." not in text


def _text(arg: tuple[Token, ...]) -> str:
    out = ""
    for t, _ in arg:
        joined = out and (_is_name(out[-1]) or out[-1].isdigit()) and (_is_name(t) or t[0].isdigit())
        out += (" " if joined else "") + t + (" " if t == "," else "")
    return out


def _strip(arg: tuple[Token, ...]) -> tuple[Token, ...]:
    while len(arg) >= 2 and arg[0][0] == "(" and arg[-1][0] == ")" and _balanced(arg[1:-1]):
        arg = arg[1:-1]
    return arg


def _balanced(arg: tuple[Token, ...]) -> bool:
    depth = 0
    for t, _ in arg:
        depth += t in _OPEN
        depth -= t in _CLOSE
        if depth < 0:
            return False
    return depth == 0


def is_identity(arg: tuple[Token, ...]) -> bool:
    inner = _strip(arg)
    return len(inner) == 1 and bool(_IDENTITY.match(inner[0][0]))


def is_scale_like(arg: tuple[Token, ...]) -> bool:
    inner = _strip(arg)
    texts = [t for t, _ in inner]
    if any(t in ("*", "/") for t in texts[1:]):  # a product or quotient (not a leading dereference)
        return True
    words = [t for t in texts if t[:1].isalpha() or t[:1] == "_"]  # names, members (``hp.f_scale``) too
    return any(t in _SCALE_CALL or _SCALE_WORD.search(t) for t in words)


def _touching(stmts: list[list[Token]], lines: frozenset[int]) -> list[list[Token]]:
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
    return _pairs(_touching(statements(old_toks), removed), _touching(statements(new_toks), added))


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
                out.append(ArgChange(oc.name, i, _text(x), _text(y), x[0][1], y[0][1], change))
    return out


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
            stack.append(_text(tuple(s)))
    return out


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
        code = _text(tuple(s)).rstrip(";")
        if match is None:
            out.append(PrecisionChange(code, s[0][1], None))
        elif match[1] != headers:
            newly = tuple(h for h in match[1] if h not in headers)
            if newly:
                out.append(PrecisionChange(code, s[0][1], match[0][0][1], newly))
    return out
