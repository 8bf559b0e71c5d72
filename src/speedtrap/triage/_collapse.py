"""A selection collapsed into one of its arms: ``c ? A : B`` (C-family, on ``_cargs``' statements) or ``A if c
else B`` (Python, on the AST) replaced by ``B`` alone, the rest of the statement unchanged. The cases where ``c``
held used to get ``A``; now every case gets ``B``. A selection change, named with both arms (and the reverse,
an arm that became a selection, is not claimed here: it adds a case rather than removing one).

Its Python kin: a condition forced to a constant (``get("k", n > 32768)``, or a local bound to that comparison
and deleted, replaced by ``get("k", False)``): the selection is made one way for every case.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from speedtrap.triage._cargs import Token, changed_pairs
from speedtrap.triage._pyast import Module

_OPEN = {"(": ")", "[": "]", "{": "}"}
_STARTS = {"=", "+=", "-=", "*=", "/=", "(", ",", "return", "{", "[", "?", ":"}


@dataclass(frozen=True)
class Collapse:
    condition: str
    taken: str  # the arm every case gets now
    dropped: str  # the arm the condition used to select
    old_line: int
    new_line: int

    @property
    def summary(self) -> str:
        if self.dropped == "what it selected":
            return (
                f"forces the condition `{self.condition}` to `{self.taken}`: the cases it selected are no longer "
                "told apart"
            )
        return (
            f"collapses the selection on `{self.condition}` into one arm: the cases where it held got "
            f"`{self.dropped}`, every case now gets `{self.taken}`"
        )


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


def py_collapses(old: Module, new: Module, removed: frozenset[int], added: frozenset[int]) -> list[Collapse]:
    """Python: a changed statement that is an old one with ``a if c else b`` replaced by ``a`` or ``b``."""
    out: list[Collapse] = []
    after = {ast.dump(s): s for s in new.statements_touching(added)}
    for stmt in old.statements_touching(removed):
        whole = ast.dump(stmt)
        for exp in [n for n in ast.walk(stmt) if isinstance(n, ast.IfExp)]:
            part = ast.dump(exp)
            if whole.count(part) != 1:
                continue
            for taken, dropped in ((exp.orelse, exp.body), (exp.body, exp.orelse)):
                hit = after.get(whole.replace(part, ast.dump(taken)))
                if hit is not None:
                    out.append(
                        Collapse(
                            ast.unparse(exp.test), ast.unparse(taken), ast.unparse(dropped), exp.lineno, hit.lineno
                        )
                    )
                    break
    return out


def _is_condition(node: ast.AST) -> bool:
    return isinstance(node, (ast.Compare, ast.BoolOp)) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
    )


def _removed_conditions(old: Module, removed: frozenset[int]) -> dict[str, ast.expr]:
    """Locals the patch stops binding to a condition (``flag = n > 32768`` deleted), by name."""
    out: dict[str, ast.expr] = {}
    for stmt in old.statements_touching(removed):
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and _is_condition(stmt.value)
            and stmt.lineno in removed
        ):
            out[stmt.targets[0].id] = stmt.value
    return out


def py_forced(old: Module, new: Module, removed: frozenset[int], added: frozenset[int]) -> list[Collapse]:
    """Python: a condition (a comparison or boolean expression, or a local the patch stops binding to one) replaced
    by ``True`` or ``False`` in a statement otherwise unchanged: the selection it made is forced one way."""
    out: list[Collapse] = []
    after = {ast.dump(s): s for s in new.statements_touching(added)}
    bound = _removed_conditions(old, removed)
    for stmt in old.statements_touching(removed):
        whole = ast.dump(stmt)
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in bound:
                cond: ast.expr = bound[node.id]
            elif _is_condition(node) and isinstance(node, ast.expr):
                cond = node
            else:
                continue
            part = ast.dump(node)
            if whole.count(part) != 1:
                continue
            for value in (False, True):
                hit = after.get(whole.replace(part, ast.dump(ast.Constant(value=value))))
                if hit is not None:
                    shown = ast.unparse(cond) + (f" ({node.id})" if isinstance(node, ast.Name) else "")
                    out.append(Collapse(shown, repr(value), "what it selected", node.lineno, hit.lineno))
                    break
    return out
