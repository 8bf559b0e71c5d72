"""Where a value goes: through keyword and positional arguments into callees (across modules and
re-exports), through locals and ``self.attr`` set in one method and read in another, to a multiply.

Also: conditional expressions that select an identity (``x if c else 1.0``, ``0``, ``None``) and a
patch that removes or changes that condition, and the paths on which the factor then reaches a
second multiply.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from speedtrap.triage.flow.dispatch import Unread
from speedtrap.triage.flow.resolve import Resolved, Resolver
from speedtrap.triage.flow.sites import ALPHA_CALLS, MUL_CALLS, MULTIPLY, TRANSPARENT, Site, make_site
from speedtrap.triage.source import Module, condition_names, last_name, short

_MAX_DEPTH = 7
_MAX_REACHES = 24
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Reach:
    """A multiply that a value reaches, and the hops that carry it there."""

    site: Site
    hops: tuple[str, ...]

    def describe(self) -> str:
        via = f" via {' -> '.join(self.hops)}" if self.hops else ""
        return f"the multiply at {self.site.where} (`{self.site.code}`){via}"

    def to_json(self) -> dict[str, Any]:
        return {"multiply": self.site.to_json(), "hops": list(self.hops)}


def _callee_words(call: ast.Call) -> str:
    return last_name(call.func) or "a call"


@dataclass
class Flow:
    """Follows values to the multiplies they reach (memoised per callee parameter)."""

    resolver: Resolver
    _memo: dict[tuple[str, int, str], list[Reach]] = field(default_factory=dict)

    def reaches(self, mod: Module, node: ast.AST, depth: int = 0) -> list[Reach]:
        """The multiplies the value of expression ``node`` reaches (at most ``_MAX_REACHES``)."""
        out: list[Reach] = []
        seen: set[str] = set()
        for r in self._from(mod, node, depth):
            if r.site.where not in seen:
                seen.add(r.site.where)
                out.append(r)
        return out[:_MAX_REACHES]

    def _from(self, mod: Module, node: ast.AST, depth: int) -> list[Reach]:
        if depth > _MAX_DEPTH:
            return []
        cur, parent = node, mod.parent(node)
        while (isinstance(parent, ast.IfExp) and parent.test is not cur) or (
            isinstance(parent, ast.Call) and last_name(parent.func) in TRANSPARENT and cur in parent.args
        ):
            cur, parent = parent, mod.parent(parent)
        here = self._multiply(mod, cur, parent)
        if here is not None:
            return [Reach(make_site(mod, here[0], MULTIPLY, here[1], ""), ())]
        if isinstance(parent, ast.keyword) and parent.arg:
            call = mod.parent(parent)
            if isinstance(call, ast.Call):
                return self._into(mod, call, parent.arg, None, depth)
        if isinstance(parent, ast.Call) and cur in parent.args:
            i = parent.args.index(cur)  # type: ignore[arg-type]
            if not any(isinstance(a, ast.Starred) for a in parent.args[:i]):
                return self._into(mod, parent, None, i, depth)
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and parent.value is cur:
            return self._assigned(mod, parent, parent.targets[0], depth)
        return []

    @staticmethod
    def _multiply(mod: Module, cur: ast.AST, parent: ast.AST | None) -> tuple[ast.AST, str] | None:
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mult):
            return parent, "operand of *"
        if isinstance(parent, ast.AugAssign) and parent.value is cur and isinstance(parent.op, ast.Mult):
            return parent, "*="
        if isinstance(parent, ast.keyword) and parent.arg == "alpha":
            call = mod.parent(parent)
            if isinstance(call, ast.Call) and last_name(call.func) in ALPHA_CALLS:
                return call, f"scaled {last_name(call.func)}(alpha=)"
        if isinstance(parent, ast.Call) and cur in parent.args and last_name(parent.func) in MUL_CALLS:
            return parent, f"{last_name(parent.func)}()"
        return None

    def resolves(self, mod: Module, node: ast.AST) -> bool:
        """Whether the call that ``node`` is an argument of resolves to a definition in the tree (a value
        passed to a callee that cannot be read is not known to reach nothing)."""
        cur, parent = node, mod.parent(node)
        while isinstance(parent, ast.IfExp) and parent.test is not cur:
            cur, parent = parent, mod.parent(parent)
        call = mod.parent(parent) if isinstance(parent, ast.keyword) else parent
        if not isinstance(call, ast.Call):
            return True
        targets = self.resolver.callees(mod, call)
        if not targets:
            return False
        if isinstance(parent, ast.keyword) and parent.arg:
            for target in targets:
                func, _ = _entry(target)
                if func is None:
                    return False
                named = {a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]}
                if parent.arg not in named and func.args.kwarg is not None:
                    return False  # taken by **kwargs: where it goes is not read here
        return True

    def _into(self, mod: Module, call: ast.Call, kw: str | None, pos: int | None, depth: int) -> list[Reach]:
        out: list[Reach] = []
        targets = self.resolver.callees(mod, call)
        if not targets:  # where the value's route stops: said with the tree's candidates when a warning needs it
            self._stops(mod, call, "it is not defined in the tree (an import from outside it, or bound at run time)")
        for target in targets:
            out.extend(self._into_one(mod, call, target, kw, pos, depth))
        return out

    def _stops(self, mod: Module, call: ast.Call, why: str) -> None:
        """Record that a value's route stops at ``call`` (unless the dispatch already said why)."""
        where = f"{mod.path}:{call.lineno}"
        if where not in self.resolver.unread:
            name = last_name(call.func)
            self.resolver.unread[where] = [Unread(f"{short(call.func, 60)}(...)", where, name, why)]
            self.resolver.unread_calls[where] = ast.unparse(call)

    def _into_one(
        self, mod: Module, call: ast.Call, target: Resolved, kw: str | None, pos: int | None, depth: int
    ) -> list[Reach]:
        func, is_method = _entry(target)
        if func is None:
            return []
        params = [*func.args.posonlyargs, *func.args.args]
        if kw is not None:
            names = [a.arg for a in params + func.args.kwonlyargs]
            param = kw if kw in names else None
        else:
            assert pos is not None
            index = pos + (1 if is_method else 0)
            param = params[index].arg if index < len(params) else None
        if param is None:
            if kw is not None and func.args.kwarg is not None:
                taken = f"`{kw}` is taken by `**{func.args.kwarg.arg}` of {func.name} ({target.file}:{func.lineno})"
                self._stops(mod, call, f"{taken}: where it goes is not read")
            return []
        key = (target.file, func.lineno, param)
        if key not in self._memo:
            self._memo[key] = []  # cycle guard
            callee_mod = self.resolver.index.module(target.file)
            found: list[Reach] = []
            if callee_mod is not None:
                for use in _loads(func, param):
                    found.extend(self._from(callee_mod, use, depth + 1))
            self._memo[key] = found[:_MAX_REACHES]
        where = f"{mod.path}:{call.lineno}"
        hop = f"{_callee_words(call)}({kw + '=' if kw else f'arg {pos}'}) at {where}"
        return [Reach(r.site, (hop, *r.hops)) for r in self._memo[key]]

    def _assigned(self, mod: Module, assign: ast.Assign, target: ast.expr, depth: int) -> list[Reach]:
        out: list[Reach] = []
        if isinstance(target, ast.Name):
            func = next((a for a in mod.ancestors(assign) if isinstance(a, _FUNCS)), None)
            if func is None:
                return []
            for use in _loads(func, target.id):
                if use.lineno >= assign.lineno:
                    out.extend(self._from(mod, use, depth))
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            cls = next((a for a in mod.ancestors(assign) if isinstance(a, ast.ClassDef)), None)
            if cls is None:
                return []
            key = (mod.path, cls.lineno, "self." + target.attr)
            if key in self._memo:
                return self._memo[key]
            self._memo[key] = []
            for node in ast.walk(cls):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == target.attr
                    and isinstance(node.ctx, ast.Load)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    out.extend(self._from(mod, node, depth + 1))
            self._memo[key] = out[:_MAX_REACHES]
        return out


def _entry(target: Resolved) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef | None, bool]:
    node = target.node
    if isinstance(node, ast.ClassDef):
        init = next((n for n in node.body if isinstance(n, _FUNCS) and n.name == "__init__"), None)
        return init, True
    return node, target.bound


def _loads(func: ast.AST, name: str) -> list[ast.Name]:
    return [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]


def identity_literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
        if node.value is None:
            return "None (skip)"
        if isinstance(node.value, (int, float)) and node.value in (0, 1):
            return f"{node.value!r} ({'a multiplier' if node.value == 1 else 'an addend'}'s identity)"
    return None


@dataclass(frozen=True)
class IdentityChange:
    """A conditional expression that selected an identity, removed or with its condition changed."""

    file: str
    function: str
    slot: str  # in words: "create_fused_moe_router(routed_scaling_factor=)", "alpha = ..."
    factor: str
    before: str  # the old expression
    after: str  # the new one
    identity: str
    when: str  # the condition under which the identity was selected
    flags: tuple[str, ...]
    change: str  # "identity removed" or "identity condition changed"
    old_line: int
    new_line: int
    old_literals: tuple[tuple[str, bool], ...]  # the conditions under which the factor flowed before
    new_literals: tuple[tuple[str, bool], ...]  # ... and after
    reaches: tuple[Reach, ...]
    new_node: ast.expr = field(compare=False, hash=False, repr=False)
    module: Module | None = field(default=None, compare=False, hash=False, repr=False)  # holds new_node
    unconditional: bool = False  # a literal identity (or no argument) before: the factor never flowed there
    returned: bool = False  # the slot is a returned value: the factor reaches the callers, not followed here
    statement: bool = False  # selected by an ``if`` statement around assignments (``_stmtident``)

    @property
    def removes_application(self) -> bool:
        return self.change == "factor replaced by identity"

    @property
    def summary(self) -> str:
        if self.unconditional:
            where = f"{self.slot} in {self.function}, {self.file}:{self.new_line}: `{self.before}` -> `{self.after}`"
            if self.returned:
                where = f"{self.slot}, {self.file}:{self.new_line}: `{self.before}` -> `{self.after}`"
            if self.removes_application:
                unread = "its callers (not followed here)" if self.returned else "no multiply found"
                first = self.reaches[0].describe() if self.reaches else unread
                return f"replaces {self.factor} by {self.identity} ({where}); the factor reached {first}"
            first = self.reaches[0].describe() if self.reaches else "a callee not resolved here"
            more = f" (and {len(self.reaches) - 1} more)" if len(self.reaches) > 1 else ""
            into = (
                f"{self.slot}, {self.file}:{self.new_line}"
                if self.returned
                else f"{self.slot} at {self.file}:{self.new_line}"
            )
            return f"{self.change}: {self.factor} now flows into {into}; {where}; it reaches {first}{more}"
        verb = "removes" if self.change == "identity removed" else "changes"
        first = self.reaches[0].describe() if self.reaches else "a callee not read here (unresolved or **kwargs)"
        more = f" (and {len(self.reaches) - 1} more)" if len(self.reaches) > 1 else ""
        return (
            f"{verb} the condition `{self.when}` that selected {self.identity} for {self.factor} at "
            f"{self.file}:{self.new_line}; {self.slot} in {self.function}: `{self.before}` -> `{self.after}`; "
            f"this value reaches {first}{more}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "factor": self.factor,
            "change": self.change,
            "condition": self.when,
            "flags": list(self.flags),
            "slot": self.slot,
            "before": self.before,
            "after": self.after,
            "reaches": [r.to_json() for r in self.reaches],
        }


def _slot(mod: Module, node: ast.AST) -> tuple[tuple[str, ...], str] | None:
    """Where a value goes, as a key comparable across the old and new file, and in words."""
    cur, parent = node, mod.parent(node)
    while isinstance(parent, ast.Call) and last_name(parent.func) in TRANSPARENT:
        cur, parent = parent, mod.parent(parent)
    func = mod.qualname(cur)
    if isinstance(parent, ast.keyword) and parent.arg:
        call = mod.parent(parent)
        if isinstance(call, ast.Call):
            name = _callee_words(call)
            return ("kw", func, name, parent.arg), f"{name}({parent.arg}=)"
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        text = short(parent.targets[0], 60)
        return ("assign", func, text), f"{text} = ..."
    if isinstance(parent, ast.Call) and cur in parent.args:
        name = _callee_words(parent)
        i = parent.args.index(cur)  # type: ignore[arg-type]
        return ("pos", func, name, str(i)), f"{name}(argument {i})"
    return _returned(mod, cur, parent, func)


def _returned(mod: Module, cur: ast.AST, parent: ast.AST | None, func: str) -> tuple[tuple[str, ...], str] | None:
    """A value a function returns, whole or as one item of a returned tuple: its callers receive it."""
    if isinstance(parent, ast.Return) and parent.value is cur:
        return ("ret", func, ""), f"the value {func} returns"
    if isinstance(parent, ast.Tuple) and isinstance(ret := mod.parent(parent), ast.Return) and ret.value is parent:
        i = next(k for k, e in enumerate(parent.elts) if e is cur)
        return ("ret", func, str(i)), f"item {i + 1} of the tuple {func} returns"
    return None


def returned_words(key: tuple[str, ...]) -> str:
    """The words of a ``("ret", function, item)`` slot key."""
    return f"item {int(key[2]) + 1} of the tuple {key[1]} returns" if key[2] else f"the value {key[1]} returns"


def argument_slots(mod: Module, only: set[int] | None = None) -> dict[tuple[str, ...], list[ast.expr]]:
    out: dict[tuple[str, ...], list[ast.expr]] = {}
    for node in mod.nodes:
        if isinstance(node, ast.keyword) and node.arg:
            value: ast.AST = node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            value = node.value
        elif isinstance(node, ast.Call):
            for a in node.args:
                s = _slot(mod, a)
                if s is not None and s[0][0] == "pos":
                    out.setdefault(s[0], []).append(a)
            continue
        elif isinstance(node, ast.Return) and node.value is not None:
            items = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for item in items:
                s = _slot(mod, item)
                if s is not None and s[0][0] == "ret":
                    out.setdefault(s[0], []).append(item)
            continue
        else:
            continue
        while isinstance(value, ast.Call) and last_name(value.func) in TRANSPARENT and len(value.args) == 1:
            value = value.args[0]
        s = _slot(mod, value)
        if s is not None and isinstance(value, ast.expr):
            out.setdefault(s[0], []).append(value)
    return out


def negated(test: ast.expr) -> str:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return short(test.operand)
    return f"not ({short(test)})" if isinstance(test, (ast.BoolOp, ast.Compare, ast.IfExp)) else f"not {short(test)}"


def value_literals(mod: Module, node: ast.AST) -> tuple[tuple[str, bool], ...]:
    return tuple(lit for g in mod.guards(node) for lit in g.literals())


def identity_changes(path: str, old: Module, new: Module, removed: frozenset[int], flow: Flow) -> list[IdentityChange]:
    """Identity selections the patch removes or whose condition it changes, with what they reach now."""
    out: list[IdentityChange] = []
    old_slots: dict[tuple[str, ...], list[ast.expr]] | None = None
    new_slots: dict[tuple[str, ...], list[ast.expr]] | None = None
    for node in old.nodes:
        if not isinstance(node, ast.IfExp):
            continue
        end = node.end_lineno or node.lineno
        if not any(node.lineno <= ln <= end for ln in removed):
            continue
        ident_body, ident_else = identity_literal(node.body), identity_literal(node.orelse)
        if (ident_body is None) == (ident_else is None):
            continue
        value = node.orelse if ident_body else node.body
        factor = next((last_name(n) for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute))), None)
        slot = _slot(old, node)
        if factor is None or slot is None:
            continue
        old_slots = old_slots if old_slots is not None else argument_slots(old)
        new_slots = new_slots if new_slots is not None else argument_slots(new)
        olds = old_slots.get(slot[0], [])
        news = new_slots.get(slot[0], [])
        k = next((i for i, v in enumerate(olds) if v is node), None)
        if k is None or k >= len(news) or len(olds) != len(news):
            continue
        after = news[k]
        if ast.dump(after) == ast.dump(node):
            continue
        if isinstance(after, ast.IfExp):
            if ast.dump(after.test) == ast.dump(node.test):
                continue
            change = "identity condition changed"
            new_value = after.orelse if identity_literal(after.body) else after.body
        else:
            change, new_value = "identity removed", after
        when = short(node.test) if ident_body else negated(node.test)
        factor_node = next(
            (n for n in ast.walk(new_value) if isinstance(n, (ast.Name, ast.Attribute)) and last_name(n) == factor),
            new_value,
        )
        old_factor = next(
            (n for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute)) and last_name(n) == factor), value
        )
        out.append(
            IdentityChange(
                path,
                new.qualname(after),
                slot[1],
                factor,
                short(node, 100),
                short(after, 100),
                (ident_body or ident_else or ""),
                when,
                tuple(condition_names(node.test)),
                change,
                node.lineno,
                after.lineno,
                value_literals(old, old_factor),
                value_literals(new, factor_node),
                tuple(flow.reaches(new, new_value)),
                new_value,
                new,
            )
        )
    return out
