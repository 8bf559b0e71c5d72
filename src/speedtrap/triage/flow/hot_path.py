"""How often a changed function runs: on every layer, on some layers, once per step, or at setup.

A module class is *per layer* when it is instantiated inside a loop, comprehension or lambda (the
``nn.ModuleList(Block(i) for i in ...)`` and ``make_layers(n, lambda ...)`` idioms), or by a
per-layer class. Its forward-reachable methods then run per layer and per token; functions they
call (kernels) inherit that. Conditions on an instantiation (``HashTopK(...) if is_hash``) make it
*some layers*.

A changed statement in a module's construction code (``__init__`` and the like) that sets an attribute
(``self.scaling = ...``, ``self.register_buffer("inv_freq", ...)``) runs once, but what it sets is read
wherever the class's forward-reachable methods read ``self.<attr>`` as a value: it is then exposed as
often as that forward runs (every layer, for a per-layer module), and the chain names the reader. A
submodule it builds (``self.mlp = MoE(...)``, read as ``self.mlp(x)``) is not such a read: the
submodule's own changed code is classified where it runs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from speedtrap.triage.flow.units import Units
from speedtrap.triage.source import Module

EVERY_LAYER, SOME_LAYERS, PER_STEP, SETUP, UNKNOWN = "every layer", "some layers", "once per step", "setup", "unknown"
_RANK = {EVERY_LAYER: 3, SOME_LAYERS: 2, PER_STEP: 1, SETUP: 0, UNKNOWN: 0}
_SETUP_NAMES = {
    "__init__",
    "__post_init__",
    "load_weights",
    "weight_loader",
    "create_weights",
    "extra_repr",
    "__repr__",
    "post_load_weights",
    "process_weights_after_loading",
    "from_pretrained",
    "from_config",
    "reset_parameters",
    "_init_weights",
}
_SETUP_PREFIXES = ("load_", "_load", "init_", "_init", "build_", "_build", "register_", "setup")
_LOOPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp, ast.For, ast.AsyncFor, ast.While, ast.Lambda)
_MAX_DEPTH = 6


@dataclass(frozen=True)
class HotPath:
    function: str  # file:Qual.name
    level: str
    chain: tuple[str, ...]  # how it was reached, outermost last
    conditions: tuple[str, ...]  # conditions on the instantiations along the chain
    reader: str = ""  # construction code: the forward method that reads what the change sets ("" otherwise)

    @property
    def rank(self) -> int:
        return _RANK[self.level]

    def describe(self) -> str:
        text = f"{self.function}: {self.level}"
        if self.conditions:
            text += f" (only where {'; '.join(self.conditions)})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "level": self.level,
            "chain": list(self.chain),
            "conditions": list(self.conditions),
            **({"reader": self.reader} if self.reader else {}),
        }


def _is_forward_like(name: str) -> bool:
    return name in {"forward", "__call__"} or name.startswith(("forward_", "_forward"))


def _is_setup(name: str) -> bool:
    return name in _SETUP_NAMES or name.startswith(_SETUP_PREFIXES)


def _forward_reachable(cls: ast.ClassDef) -> set[str]:
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    todo = [m for m in methods if _is_forward_like(m)]
    seen = set(todo)
    while todo:
        for node in ast.walk(methods[todo.pop()]):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr in methods
                and node.attr not in seen
            ):
                seen.add(node.attr)
                todo.append(node.attr)
    return seen


def _attributes_set(stmt: ast.stmt, lines: frozenset[int] | set[int]) -> set[str]:
    """``self.<attr>`` names a statement binds; for an ``if`` whose condition is on a changed line, what every
    statement in its arms binds: the condition selects those values."""
    if not isinstance(stmt, ast.If):
        return _bound_here(stmt)
    end = stmt.test.end_lineno or stmt.test.lineno
    if not any(stmt.test.lineno <= ln <= end for ln in lines):
        return set()  # only its body changed: those statements are read on their own
    return {a for sub in ast.walk(stmt) if isinstance(sub, ast.stmt) for a in _bound_here(sub)}


def _bound_here(stmt: ast.stmt) -> set[str]:
    """``self.<attr>`` names one statement binds (assignments, ``self.register_buffer("name", ...)``)."""
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = [t for target in stmt.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        targets = [stmt.target]
    found = {t.attr for t in targets if isinstance(t, ast.Attribute) and _is_self(t.value)}
    if (
        isinstance(stmt, ast.Expr)
        and isinstance(call := stmt.value, ast.Call)
        and (
            isinstance(call.func, ast.Attribute)
            and call.func.attr in ("register_buffer", "register_parameter")
            and _is_self(call.func.value)
            and call.args
            and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, str)
        )
    ):
        found.add(call.args[0].value)
    return found


def _attributes_read(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """``self.<attr>`` values a method reads; a submodule it calls (``self.mlp(x)``) runs its own forward,
    which is classified on its own, so a call target is not a read here."""
    called = {id(n.func) for n in ast.walk(func) if isinstance(n, ast.Call)}
    return {
        n.attr
        for n in ast.walk(func)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and _is_self(n.value) and id(n) not in called
    }


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


class HotPaths:
    def __init__(self, units: Units) -> None:
        self.units = units
        self._class_memo: dict[tuple[str, str], tuple[str, tuple[str, ...], tuple[str, ...]]] = {}

    def classify(
        self, mod: Module, func: ast.FunctionDef | ast.AsyncFunctionDef, lines: frozenset[int] | set[int] = frozenset()
    ) -> HotPath:
        """How often ``func`` runs; for construction code, how often what its changed ``lines`` set is read."""
        label = f"{mod.path}:{mod.qualname(func)}.{func.name}".replace(":<module>.", ":")
        level, chain, conds = self._function(mod, func, depth=0, seen=set())
        if level == SETUP and lines:
            read = self._read_in_forward(mod, func, lines)
            if read is not None:
                reader, (level, chain, conds) = read
                return HotPath(label, level, chain, conds, reader)
        return HotPath(label, level, chain, conds)

    def _read_in_forward(
        self, mod: Module, func: ast.FunctionDef | ast.AsyncFunctionDef, lines: frozenset[int] | set[int]
    ) -> tuple[str, tuple[str, tuple[str, ...], tuple[str, ...]]] | None:
        """Where forward reads the attributes the changed construction statements set, and how often."""
        cls = mod.parent(func)
        if not isinstance(cls, ast.ClassDef):
            return None
        attrs = {a for stmt in mod.statements_touching(lines) for a in _attributes_set(stmt, lines)}
        if not attrs:
            return None
        methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for name in sorted(_forward_reachable(cls)):
            read = sorted(attrs & _attributes_read(methods[name]))
            if read:
                level, chain, conds = self._class(mod.path, cls.name, 0)
                why = f"{cls.name}.{func.name} sets self.{read[0]}, which {cls.name}.{name} reads"
                return f"self.{read[0]} in {cls.name}.{name}", (level, (why, *chain), conds)
        return None

    def _function(
        self, mod: Module, func: ast.FunctionDef | ast.AsyncFunctionDef, depth: int, seen: set[tuple[str, str]]
    ) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        # A nested function runs when the function around it does.
        outer = [a for a in mod.ancestors(func) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if outer:
            func = outer[-1]
        parent = mod.parent(func)
        if isinstance(parent, ast.ClassDef):
            if _is_setup(func.name):
                if func.name not in _SETUP_NAMES and depth == 0:
                    # Named like setup by a prefix only (``init_forward_metadata``): for the changed function itself,
                    # its callers decide. A method is called through an attribute (``self.backend.init_...``), so
                    # every file naming it is read (bounded by the caller search's file limit); one level only.
                    level, chain, conds = self._callers_of(mod.path, func.name, depth, seen, method=True)
                    if _RANK[level] >= _RANK[PER_STEP]:
                        return level, chain, conds
                return SETUP, (f"{parent.name}.{func.name} runs when the module is built or loaded",), ()
            if func.name not in _forward_reachable(parent):
                return UNKNOWN, (f"{parent.name}.{func.name} is not reached from {parent.name}.forward",), ()
            level, chain, conds = self._class(mod.path, parent.name, depth)
            return level, (f"{parent.name}.{func.name} runs in {parent.name}'s forward", *chain), conds
        if isinstance(parent, ast.Module):
            return self._callers_of(mod.path, func.name, depth, seen)
        return UNKNOWN, (), ()

    def _callers_of(
        self, file: str, name: str, depth: int, seen: set[tuple[str, str]], method: bool = False
    ) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        if depth >= _MAX_DEPTH or (file, name) in seen:
            return UNKNOWN, (), ()
        seen = seen | {(file, name)}
        best: tuple[str, tuple[str, ...], tuple[str, ...]] = (UNKNOWN, (f"{name} has no caller in the tree",), ())
        for site in self.units.callers(name, None if method else file):
            if method and not (isinstance(site.node, ast.Call) and isinstance(site.node.func, ast.Attribute)):
                continue  # a method runs when called on an object
            caller = next(
                (
                    a
                    for a in reversed(site.module.ancestors(site.node))
                    if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))
                ),
                None,
            )
            if caller is None:
                continue
            owner = site.module.parent(caller)
            if caller.name == "__init__" and isinstance(owner, ast.ClassDef):
                # A factory called in a constructor builds part of that module: it runs where the module runs.
                level, chain, conds = self._class(site.file, owner.name, depth + 1)
                chain = (f"{name} builds part of {owner.name} ({owner.name}.__init__ calls it)", *chain)
                if _RANK[level] > _RANK[best[0]]:
                    best = (level, (f"{name} is called at {site.file}:{site.node.lineno}", *chain), conds)
                    if level == EVERY_LAYER:
                        break
                continue
            level, chain, conds = self._function(site.module, caller, depth + 1, seen)
            if _RANK[level] > _RANK[best[0]]:
                where = f"{site.module.qualname(caller)}.{caller.name}".replace("<module>.", "")
                best = (level, (f"{name} is called from {where} ({site.file}:{site.node.lineno})", *chain), conds)
                if level == EVERY_LAYER:
                    break
        return best

    def _class(self, file: str, name: str, depth: int) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        key = (file, name)
        if key in self._class_memo:
            return self._class_memo[key]
        self._class_memo[key] = (UNKNOWN, (), ())  # cycle guard
        result: tuple[str, tuple[str, ...], tuple[str, ...]] = (
            PER_STEP,
            (f"{name} is not built by another module here: a top-level module, once per step",),
            (),
        )
        best_rank = -1
        cand: tuple[str, tuple[str, ...], tuple[str, ...]]
        for site in self.units.callers(name, file):
            if depth >= _MAX_DEPTH or (best_rank == _RANK[EVERY_LAYER] and not result[2]):
                break
            # Conditions that select where it is built; validation raises before it are left out.
            conds = tuple(site.module.describe_guard(g) for g in site.module.guards(site.node) if g.how != "early exit")
            where = f"{site.file}:{site.node.lineno}"
            if self._in_loop(site):
                level = SOME_LAYERS if conds else EVERY_LAYER
                cand = (level, (f"{name} is built once per layer ({where})",), conds)
            elif (
                site.unit is not None
                and site.unit in self.units.definitions(site.file)
                and isinstance(self.units.definitions(site.file)[site.unit], ast.ClassDef)
            ):
                p_level, p_chain, p_conds = self._class(site.file, site.unit, depth + 1)
                if p_level in (EVERY_LAYER, SOME_LAYERS):
                    level = SOME_LAYERS if (conds or p_level == SOME_LAYERS) else EVERY_LAYER
                elif p_level == PER_STEP:
                    level = PER_STEP
                else:
                    continue
                cand = (level, (f"{name} is built by {site.unit} ({where})", *p_chain), conds + p_conds)
            else:
                cand = (PER_STEP, (f"{name} is built by {site.unit or 'module code'} ({where})",), conds)
            if _RANK[cand[0]] > best_rank or (_RANK[cand[0]] == best_rank and not cand[2] and result[2]):
                best_rank, result = _RANK[cand[0]], cand
        self._class_memo[key] = result
        return result

    @staticmethod
    def _in_loop(site: Any) -> bool:
        for anc in site.module.ancestors(site.node):
            if isinstance(anc, _LOOPS):
                return True
            if isinstance(anc, ast.Call) and anc is not site.node:
                callee = anc.func.attr if isinstance(anc.func, ast.Attribute) else getattr(anc.func, "id", "")
                if "ModuleList" in callee or "make_layers" in callee:
                    return True
            if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                return False
        return False
