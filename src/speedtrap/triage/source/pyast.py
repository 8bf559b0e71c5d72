"""Python source read with ``ast``: parents, enclosing functions, and the conditions guarding a node."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_MAX_GUARD_TEXT = 140


def short(node: ast.AST, limit: int = _MAX_GUARD_TEXT) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def last_name(node: ast.AST) -> str | None:
    """``self.a.b`` -> ``b``; ``x`` -> ``x``; ``envs.X.get()`` -> ``X``; anything else -> None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
        if node.func.attr in {"get", "value"}:
            return last_name(node.func.value)
        return node.func.attr
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def callee(node: ast.AST) -> str | None:
    """The name a call calls: ``torch.empty(...)`` -> ``empty``, ``f(...)`` -> ``f``; else None."""
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            return node.func.attr
        if isinstance(node.func, ast.Name):
            return node.func.id
    return None


def position(node: ast.AST) -> tuple[int, int]:
    """Where a node starts: (line, column)."""
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def condition_names(expr: ast.expr) -> list[str]:
    """Flag-like names an expression reads: chain ends, no-argument predicates, env-var strings."""
    inner: set[int] = set()
    for n in ast.walk(expr):
        if isinstance(n, ast.Attribute):
            inner.add(id(n.value))
        elif isinstance(n, ast.Call):
            inner.add(id(n.func))
    out: list[str] = []
    for n in ast.walk(expr):
        name: str | None = None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and not n.args:
            name = last_name(n)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isupper() and n.value.isidentifier():
            name = n.value
        elif isinstance(n, (ast.Attribute, ast.Name)) and id(n) not in inner:
            name = last_name(n)
        if name and name != "self" and name not in out:
            out.append(name)
    return out


@dataclass(frozen=True)
class Guard:
    """One condition a node runs under: ``test`` must be ``holds`` for the node to run."""

    test: ast.expr
    holds: bool
    how: str  # "if", "else", "ifexp", "while", "early exit", "and"
    line: int

    @property
    def text(self) -> str:
        body = short(self.test)
        if self.holds:
            return f"if {body}"
        return f"not ({body})" + (" [early exit]" if self.how == "early exit" else " [else]")

    def flags(self) -> list[str]:
        """The names the condition reads, one per attribute chain (``self.a.flag`` -> ``flag``)."""
        return condition_names(self.test)

    def literals(self) -> list[tuple[str, bool]]:
        """The condition as a conjunction of (atom, polarity); [] when it is not a conjunction."""
        return _literals(self.test, self.holds)

    def to_json(self) -> dict[str, Any]:
        return {"condition": self.text, "line": self.line, "flags": self.flags()}


def _literals(expr: ast.expr, holds: bool) -> list[tuple[str, bool]]:
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return _literals(expr.operand, not holds)
    if isinstance(expr, ast.BoolOp):
        conj = isinstance(expr.op, ast.And) == holds  # a and b holds / a or b fails: all parts fixed
        if not conj:
            return []
        out: list[tuple[str, bool]] = []
        for value in expr.values:
            out.extend(_literals(value, holds))
        return out
    compared = _compared(expr)
    if compared is not None:
        atom, positive = compared
        return [(atom, holds == positive)]
    name = last_name(expr)
    return [(name, holds)] if name else []


_EQ_NEG = {ast.Is: True, ast.Eq: True, ast.IsNot: False, ast.NotEq: False}


def _compared(expr: ast.expr) -> tuple[str, bool] | None:
    """``x is None`` -> ("x is None", True); ``x != 1.0`` -> ("x == 1.0", False); else None."""
    if not (isinstance(expr, ast.Compare) and len(expr.ops) == 1 and type(expr.ops[0]) in _EQ_NEG):
        return None
    right = expr.comparators[0]
    name = last_name(expr.left)
    if name is None or not isinstance(right, ast.Constant) or isinstance(right.value, str):
        return None
    return f"{name} == {right.value!r}", _EQ_NEG[type(expr.ops[0])]


@dataclass
class Module:
    """One parsed Python file."""

    path: str  # relative to the tree root, with "/" separators
    source: str
    tree: ast.Module
    _parents: dict[int, ast.AST] = field(default_factory=dict)
    _locals: dict[tuple[int, str], ast.expr | None] = field(default_factory=dict)

    @cached_property
    def lines(self) -> list[str]:
        return self.source.split("\n")

    def line(self, no: int) -> str:
        return self.lines[no - 1].strip() if 0 < no <= len(self.lines) else ""

    @cached_property
    def nodes(self) -> list[ast.AST]:
        """Every node of the module (expression contexts left out), parents recorded on the way.

        A hand-rolled traversal: ``ast.walk`` costs several times more on large trees.
        """
        out: list[ast.AST] = [self.tree]
        parents = self._parents
        stack: list[ast.AST] = [self.tree]
        node_type, ctx_type = ast.AST, ast.expr_context
        while stack:
            node = stack.pop()
            for name in node._fields:
                value = getattr(node, name, None)
                if isinstance(value, list):
                    for item in value:
                        if isinstance(item, node_type) and not isinstance(item, ctx_type):
                            parents[id(item)] = node
                            stack.append(item)
                            out.append(item)
                elif isinstance(value, node_type) and not isinstance(value, ctx_type):
                    parents[id(value)] = node
                    stack.append(value)
                    out.append(value)
        return out

    def parent(self, node: ast.AST) -> ast.AST | None:
        if not self._parents:
            _ = self.nodes
        return self._parents.get(id(node))

    def ancestors(self, node: ast.AST) -> list[ast.AST]:
        out: list[ast.AST] = []
        cur = self.parent(node)
        while cur is not None:
            out.append(cur)
            cur = self.parent(cur)
        return out

    def scope_of(self, node: ast.AST) -> tuple[str | None, str | None]:
        """(top-level class or function name, innermost function name) that hold ``node``."""
        unit = func = None
        for anc in self.ancestors(node):
            if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)) and func is None:
                func = anc.name
            if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                parent = self.parent(anc)
                if isinstance(parent, ast.Module):
                    unit = anc.name
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if isinstance(self.parent(node), ast.Module):
                unit = node.name
            if func is None and not isinstance(node, ast.ClassDef):
                func = node.name
        return unit, func

    def qualname(self, node: ast.AST) -> str:
        names = [
            a.name
            for a in reversed(self.ancestors(node))
            if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
        return ".".join(names) or "<module>"

    def guards(self, node: ast.AST) -> list[Guard]:
        """The conditions, innermost first, under which ``node`` runs within its function."""
        out: list[Guard] = []
        child: ast.AST = node
        for anc in self.ancestors(node):
            if isinstance(anc, ast.If):
                if any(s is child for s in anc.body):
                    out.append(Guard(anc.test, True, "if", anc.lineno))
                elif any(s is child for s in anc.orelse):
                    out.append(Guard(anc.test, False, "else", anc.lineno))
            elif isinstance(anc, ast.IfExp):
                if anc.body is child:
                    out.append(Guard(anc.test, True, "ifexp", anc.lineno))
                elif anc.orelse is child:
                    out.append(Guard(anc.test, False, "else", anc.lineno))
            elif isinstance(anc, ast.While) and any(s is child for s in anc.body):
                out.append(Guard(anc.test, True, "while", anc.lineno))
            elif isinstance(anc, ast.BoolOp) and isinstance(anc.op, ast.And):
                for value in anc.values:
                    if value is child:
                        break
                    out.append(Guard(value, True, "and", value.lineno))
            if isinstance(child, ast.stmt):
                out.extend(self._early_exits(anc, child))
            if isinstance(anc, _SCOPES):
                break
            child = anc
        return out

    def exclusive(self, a: ast.AST, b: ast.AST) -> bool:
        """Whether one run of their function executes at most one of ``a`` and ``b``: they sit in opposite
        arms of one ``if``/``else``, conditional expression or ``match``, or one sits in an ``if`` whose
        body ends by returning or raising and the other after that ``if`` in the same block; and no loop
        inside that function repeats the choice (a loop could run one arm, then the other)."""
        path_a = [a, *self.ancestors(a)]
        ids_a = {id(n): i for i, n in enumerate(path_a)}
        child_b: ast.AST = b
        common: ast.AST | None = None
        for anc in [b, *self.ancestors(b)]:
            if id(anc) in ids_a:
                common = anc
                break
            child_b = anc
        if common is None or common is a or common is b:
            return False
        child_a = path_a[ids_a[id(common)] - 1]
        if not self._arms_differ(common, (child_a, a), (child_b, b)):
            return False
        for anc in [common, *self.ancestors(common)]:
            if isinstance(anc, _SCOPES):
                return True
            if isinstance(anc, (ast.For, ast.AsyncFor, ast.While, ast.comprehension)) and anc is not common:
                return False
        return False  # module level: not a function's run

    def _arms_differ(self, owner: ast.AST, x: tuple[ast.AST, ast.AST], y: tuple[ast.AST, ast.AST]) -> bool:
        """``x`` and ``y`` are (the child of ``owner`` on the way, the node itself)."""

        def field_of(child: ast.AST) -> tuple[str, int]:
            for name in owner._fields:
                value = getattr(owner, name, None)
                if value is child:
                    return name, 0
                if isinstance(value, list):
                    for i, item in enumerate(value):
                        if item is child:
                            return name, i
            return "", 0

        (fx, ix), (fy, iy) = field_of(x[0]), field_of(y[0])
        if isinstance(owner, (ast.If, ast.IfExp)):
            return {fx, fy} == {"body", "orelse"}
        if isinstance(owner, ast.Match):
            return fx == fy == "cases" and ix != iy
        # One statement of a block is an ``if`` whose body always leaves the function, holding one node in
        # that body; the other node comes after it in the same block.
        if fx != fy or ix == iy or not isinstance(getattr(owner, fx, None), list):
            return False
        if isinstance(owner, (ast.For, ast.AsyncFor, ast.While)):
            return False
        first, node = x if ix < iy else y
        if not (isinstance(first, ast.If) and first.body and not first.orelse):
            return False
        if not isinstance(first.body[-1], (ast.Return, ast.Raise)):
            return False
        inside = {id(n) for n in [node, *self.ancestors(node)]}
        return any(id(s) in inside for s in first.body)

    def statement_at(self, line: int) -> ast.stmt | None:
        """The innermost simple statement whose span includes ``line``."""
        best: ast.stmt | None = None
        for n in self.statements_touching({line}):
            if hasattr(n, "body"):
                continue
            if best is None or (n.end_lineno or n.lineno) - n.lineno < (best.end_lineno or best.lineno) - best.lineno:
                best = n
        return best

    def exclusive_lines(self, a: int, b: int) -> bool:
        """``exclusive`` for the simple statements on two lines."""
        sa, sb = self.statement_at(a), self.statement_at(b)
        return sa is not None and sb is not None and sa is not sb and self.exclusive(sa, sb)

    def _early_exits(self, block_owner: ast.AST, stmt: ast.stmt) -> list[Guard]:
        out: list[Guard] = []
        for fname in ("body", "orelse", "finalbody"):
            block = getattr(block_owner, fname, None)
            if not isinstance(block, list) or not any(s is stmt for s in block):
                continue
            for prev in block:
                if prev is stmt:
                    break
                if isinstance(prev, ast.If) and not prev.orelse and prev.body and isinstance(prev.body[-1], _EXITS):
                    out.append(Guard(prev.test, False, "early exit", prev.lineno))
        return out

    def local_definition(self, name: str, at: ast.AST) -> ast.expr | None:
        """The value of the single ``name = value`` in the function holding ``at``, if there is one."""
        func = next((a for a in self.ancestors(at) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        if func is None:
            return None
        key = (id(func), name)
        if key not in self._locals:
            values = [
                n.value
                for n in ast.walk(func)
                if isinstance(n, ast.Assign)
                and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Name)
                and n.targets[0].id == name
            ]
            self._locals[key] = values[0] if len(values) == 1 else None
        return self._locals[key]

    def describe_guard(self, guard: Guard) -> str:
        """The guard's text, with a local flag's definition spelled out (``is_hash (= i < n)``)."""
        text = guard.text
        if isinstance(guard.test, ast.Name):
            value = self.local_definition(guard.test.id, guard.test)
            if value is not None:
                text += f" (where {guard.test.id} = {short(value, 80)})"
        return text

    def nodes_on_lines(self, lines: frozenset[int] | set[int]) -> list[ast.AST]:
        """Every node that starts on one of ``lines``."""
        return [n for n in self.nodes if getattr(n, "lineno", None) in lines]

    def statements_touching(self, lines: frozenset[int] | set[int]) -> list[ast.stmt]:
        """The innermost statements whose line span includes one of ``lines``."""
        out: list[ast.stmt] = []
        for n in self.nodes:
            if isinstance(n, ast.stmt) and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                end = getattr(n, "end_lineno", n.lineno) or n.lineno
                if any(n.lineno <= ln <= end for ln in lines):
                    out.append(n)
        return out

    def functions_touching(self, lines: frozenset[int] | set[int]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """The innermost functions whose span includes one of ``lines``."""
        found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        for n in self.nodes:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([n.lineno, *(d.lineno for d in n.decorator_list)])
                end = n.end_lineno or n.lineno
                if any(start <= ln <= end for ln in lines):
                    found.append(n)
        inner = [
            f
            for f in found
            if not any(
                g is not f and f.lineno <= g.lineno and (g.end_lineno or 0) <= (f.end_lineno or 0) for g in found
            )
        ]
        return inner


def parse_module(path: str, source: str) -> Module | None:
    """The parsed module, or None when the text is not valid Python 3 (callers fall back to text)."""
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return Module(path, source, tree)
