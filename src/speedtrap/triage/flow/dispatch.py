"""Method calls resolved through the dispatch the tree itself defines, for ``Resolver.callees``:

- ``self.m(...)``: ``m`` on the class holding the call, else on its bases (resolved by name, depth first);
- ``self.attr.m(...)``: ``m`` on each class whose instance the class stores in ``self.attr``
  (``self.quant_method = UnquantizedFusedMoEMethod()``), directly or through a factory function the tree
  defines (``return Fp8MoEMethod(self)``);
- ``self.attr(...)``: a module held in ``self.attr`` is called: its ``forward`` (or ``__call__``);
- ``local.m(...)``: the class a local is built from in the same function (``runner = MoeRunner(...)``).

What cannot be read (a factory called on a parameter, ``quant_config.get_quant_method(self)``; a registry
lookup) is said, with the methods of that name the tree defines as candidates (``unread``, ``candidates``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Protocol

from speedtrap.triage.source import Module, SourceIndex, short


class Resolver(Protocol):
    """What dispatch needs of ``resolve.Resolver`` (which calls into this module)."""

    index: SourceIndex

    def resolve(self, file: str, name: str, hops: int = 0) -> Any: ...

    def callee(self, mod: Module, call: ast.Call) -> Any: ...

    def bound(self, file: str, node: Any) -> Any: ...


Resolved = Any  # resolve.Resolved: a definition, its file, and whether it is called on an instance

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_MAX_DEPTH = 5
_MAX_CANDIDATES = 6
_MAX_CANDIDATE_FILES = 200  # more files than this defining the name: counted, not read


@dataclass(frozen=True)
class Unread:
    """A value a method call's dispatch depends on that is not read off the code: its code, where, the method
    it calls (to list the tree's candidates for it), and why it is not read."""

    code: str
    where: str
    method: str | None
    why: str

    def describe(self, resolver: Resolver) -> str:
        found, total = candidates(resolver, self.method, None) if self.method else ([], 0)
        if found:
            more = f" and {total - len(found)} more" if total > len(found) else ""
            options = f"; candidates: {', '.join(found)}{more}"
        else:
            options = f"; {total} definitions of {self.method} in the tree, too many to list" if total else ""
        return f"`{self.code}` ({self.where}): {self.why}{options}"


def _why(mod: Module, expr: ast.expr) -> str:
    """Why the class of what ``expr`` calls is not read off the code."""
    func = expr.func if isinstance(expr, ast.Call) else expr
    recv = func.value if isinstance(func, ast.Attribute) else None
    owner = next((a for a in mod.ancestors(expr) if isinstance(a, _FUNCS)), None)
    params = {a.arg for a in [*owner.args.posonlyargs, *owner.args.args, *owner.args.kwonlyargs]} if owner else set()
    if short(func, 200).startswith("torch.ops."):
        return "a registered op (`torch.ops`): the kernel it runs is not Python read here"
    if isinstance(recv, ast.Name) and recv.id in params:
        return f"`{recv.id}` is a parameter, so which class's method runs is chosen by the caller"
    if isinstance(recv, ast.Subscript) or isinstance(func, ast.Subscript):
        return "a lookup in a table (a registry), not read here"
    return "it is not built from a class the tree defines where it is read"


def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Name):
        return base.id
    if isinstance(base, ast.Attribute):
        return base.attr
    return None


def method_of(resolver: Resolver, file: str, cls: ast.ClassDef, name: str, depth: int = 0) -> Resolved | None:
    """``name`` defined on ``cls`` or, depth first, on its bases (the tree's classes only)."""
    for node in cls.body:
        if isinstance(node, _FUNCS) and node.name == name:
            return resolver.bound(file, node)
    if depth >= _MAX_DEPTH:
        return None
    for base in cls.bases:
        base_name = _base_name(base)
        found = resolver.resolve(file, base_name) if base_name else None
        if found is not None and isinstance(found.node, ast.ClassDef) and found.node is not cls:
            inherited = method_of(resolver, found.file, found.node, name, depth + 1)
            if inherited is not None:
                return inherited
    return None


def instances(
    resolver: Resolver, mod: Module, expr: ast.expr, depth: int = 0
) -> tuple[list[tuple[str, ast.ClassDef]], list[Unread]]:
    """The classes whose instances ``expr`` builds (``K(...)``, or a factory the tree defines that returns
    ``K(...)``), and what cannot be read."""
    where = f"{mod.path}:{getattr(expr, 'lineno', 0)}"
    method = expr.func.attr if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) else None
    if not isinstance(expr, ast.Call) or depth > 2:
        return [], [Unread(short(expr, 60), where, None, "not a call the tree defines")]
    target = resolver.callee(mod, expr)
    if target is None:
        return [], [Unread(short(expr, 60), where, method, _why(mod, expr))]
    if isinstance(target.node, ast.ClassDef):
        return [(target.file, target.node)], []
    inner = resolver.index.module(target.file)
    found: list[tuple[str, ast.ClassDef]] = []
    unread: list[Unread] = []
    for node in ast.walk(target.node) if inner is not None else []:
        if isinstance(node, ast.Return) and node.value is not None:
            assert inner is not None
            classes, missed = instances(resolver, inner, node.value, depth + 1)
            found += classes
            unread += missed
    return found, unread


def _stored(
    resolver: Resolver, mod: Module, cls: ast.ClassDef, attr: str
) -> tuple[list[tuple[str, ast.ClassDef]], list[Unread]]:
    """The classes whose instances ``cls`` stores in ``self.attr``, and the assignments it cannot read."""
    found: list[tuple[str, ast.ClassDef]] = []
    unread: list[Unread] = []
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) and t.value.id == "self"
            for t in node.targets
        ):
            classes, missed = instances(resolver, mod, node.value)
            found += classes
            unread += missed
    return found, unread


def methods(resolver: Resolver, mod: Module, call: ast.Call) -> tuple[list[Resolved], list[Unread]]:
    """The methods a call on an object may run, read off the tree's own dispatch; and what it cannot read."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return [], []
    recv, name = func.value, func.attr
    cls = next((a for a in mod.ancestors(call) if isinstance(a, ast.ClassDef)), None)
    classes: list[tuple[str, ast.ClassDef]] = []
    unread: list[Unread] = []
    wanted: tuple[str, ...] = (name,)
    if isinstance(recv, ast.Name) and recv.id == "self" and cls is not None:
        own = method_of(resolver, mod.path, cls, name)
        if own is not None:
            return [own], []
        classes, unread = _stored(resolver, mod, cls, name)  # a module held in self.<name>, called
        wanted = ("forward", "__call__")
    elif (
        isinstance(recv, ast.Attribute)
        and isinstance(recv.value, ast.Name)
        and recv.value.id == "self"
        and cls is not None
    ):
        classes, unread = _stored(resolver, mod, cls, recv.attr)
    elif isinstance(recv, ast.Name):
        value = mod.local_definition(recv.id, call)
        if value is None:
            return [], []
        classes, unread = instances(resolver, mod, value)
    out: list[Resolved] = []
    for file, klass in classes:
        for want in wanted:
            found = method_of(resolver, file, klass, want)
            if found is not None:
                if all(o.node is not found.node for o in out):
                    out.append(found)
                break
    if not out and not unread and not isinstance(recv, ast.Call):  # nothing read: the call itself is the question
        unread = [Unread(f"{short(func, 60)}(...)", f"{mod.path}:{call.lineno}", name, _why(mod, call))]
    return out, unread


def candidates(resolver: Resolver, name: str, keyword: str | None = None) -> tuple[list[str], int]:
    """Functions and methods named ``name`` that the tree defines at module or class level (taking ``keyword``,
    when given), as ``Class.name (file:line)``: the first few, and how many in all."""
    words = [f"def {name}("] + ([keyword] if keyword else [])
    files = resolver.index.containing(words)
    if len(files) > _MAX_CANDIDATE_FILES:
        return [], len(files)
    found: list[str] = []
    for rel in files:
        mod = resolver.index.module(rel)
        for owner in [mod.tree] if mod is not None else []:  # module-level functions, then classes' methods
            scopes = [(None, owner.body)] + [(c.name, c.body) for c in owner.body if isinstance(c, ast.ClassDef)]
            for cls, body in scopes:
                for node in body:
                    if not isinstance(node, _FUNCS) or node.name != name:
                        continue
                    params = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
                    if keyword is None or keyword in params or node.args.kwarg is not None:
                        found.append(f"{cls + '.' if cls else ''}{name} ({rel}:{node.lineno})")
    return found[:_MAX_CANDIDATES], len(found)
