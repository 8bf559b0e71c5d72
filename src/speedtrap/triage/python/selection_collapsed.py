"""A selection collapsed into one of its arms, Python (on the AST): ``A if c else B`` replaced by ``B`` alone, the
rest of the statement unchanged. The cases where ``c`` held used to get ``A``; now every case gets ``B``. A
selection change, named with both arms (the reverse, an arm that became a selection, is not claimed here: it
adds a case rather than removing one). Its kin: a condition forced to a constant (``get("k", n > 32768)``, or
a local bound to that comparison and deleted)::

    get("k", max_model_len > 32768)   ->   get("k", False)

The C-family form (``c ? A : B`` -> ``B``) is ``cfamily.selection_collapsed``; both give a ``Collapse``."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from speedtrap.triage.source import Module


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
