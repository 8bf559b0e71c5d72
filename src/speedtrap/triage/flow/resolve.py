"""Names resolved to their definitions across a tree: imports, package ``__init__`` re-exports, aliases.

``from pkg import f`` where ``pkg/__init__.py`` itself does ``from pkg.mod import f as g`` resolves
to the ``def`` in ``pkg/mod.py``. Module paths are matched against the tree's files with any leading
directories stripped (a wheel unpacks to ``vllm/...``, a checkout to ``python/sglang/...``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from speedtrap.triage.flow.dispatch import Unread, methods
from speedtrap.triage.source import Module, SourceIndex

_MAX_HOPS = 6
Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@dataclass(frozen=True)
class Resolved:
    file: str
    node: Definition
    via: tuple[str, ...] = ()  # the files passed through (re-exports), outermost first
    bound: bool = False  # a method called on an instance: its first parameter is the instance


@dataclass
class Resolver:
    index: SourceIndex
    _modules: dict[str, list[str]] | None = None
    _memo: dict[tuple[str, str], Resolved | None] = field(default_factory=dict)
    _imports: dict[str, dict[str, tuple[str, int, str | None]]] = field(default_factory=dict)
    _defs: dict[str, dict[tuple[int, str], Definition]] = field(default_factory=dict)
    unread: dict[str, list[Unread]] = field(default_factory=dict)  # call site -> what its dispatch cannot read
    unread_calls: dict[str, str] = field(default_factory=dict)  # call site -> the call's code

    def unresolved_on(self, hops: tuple[str, ...]) -> list[str]:
        """What the dispatch of the calls on a route (``f(x=) at FILE:LINE`` hops) could not read, in words."""
        out: list[str] = []
        for hop in hops:
            where = hop.rsplit(" at ", 1)[-1]
            out += [t for t in self.unresolved_at(where, hop.split("(", 1)[0]) if t not in out]
        return out

    def unresolved_at(self, where: str, callee: str) -> list[str]:
        """What the dispatch of the call ``callee`` at ``where`` could not read, with the candidates."""
        return [
            u.describe(self) if u.where == where else f"{callee}(...) at {where}: {u.describe(self)}"
            for u in self.unread.get(where, [])
        ]

    def unresolved_passing(self, name: str) -> list[str]:
        """What the dispatch of the calls met so far that pass ``name`` (``name=``, or the name as an argument)
        could not read: where a factor's route stops, when the route itself is not known."""
        out: list[str] = []
        for where, code in self.unread_calls.items():
            if re.search(rf"\b{re.escape(name)}\b", code.split("(", 1)[-1]):
                callee = code.split("(", 1)[0].rsplit(".", 1)[-1]
                out += [t for t in self.unresolved_at(where, callee) if t not in out]
        return out

    def bound(self, file: str, node: Definition) -> Resolved:
        """A method as called on an instance (the tree's own node for it: the caller may hold another parse)."""
        if file not in self._defs:
            mod = self.index.module(file)
            self._defs[file] = {
                (n.lineno, n.name): n
                for n in (mod.nodes if mod is not None else [])
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            }
        return Resolved(file, self._defs[file].get((node.lineno, node.name), node), bound=True)

    def module_file(self, dotted: str) -> str | None:
        """The tree file of a dotted module name (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``)."""
        if self._modules is None:
            table: dict[str, list[str]] = {}
            for rel in self.index.python_files:
                parts = rel[:-3].split("/")
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                for i in range(len(parts)):
                    table.setdefault(".".join(parts[i:]), []).append(rel)
            self._modules = table
        found = self._modules.get(dotted, [])
        return min(found, key=len) if found else None

    def _relative(self, file: str, level: int, module: str | None) -> str | None:
        parts = file[:-3].split("/")[:-1]  # the package holding ``file``
        if level > 1:
            parts = parts[: len(parts) - (level - 1)]
        dotted = ".".join([*parts, *(module.split(".") if module else [])])
        return self.module_file(dotted) if dotted else None

    def imports(self, file: str) -> dict[str, tuple[str, int, str | None]]:
        """Local name -> (module, level, imported name or None for a module import)."""
        if file not in self._imports:
            mod = self.index.module(file)
            table: dict[str, tuple[str, int, str | None]] = {}
            for node in mod.nodes if mod is not None else []:
                if isinstance(node, ast.ImportFrom):
                    for a in node.names:
                        if a.name != "*":
                            table.setdefault(a.asname or a.name, (node.module or "", node.level, a.name))
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        if a.asname:
                            table.setdefault(a.asname, (a.name, 0, None))
            self._imports[file] = table
        return self._imports[file]

    def _target_file(self, file: str, module: str, level: int) -> str | None:
        return self._relative(file, level, module) if level else self.module_file(module)

    def resolve(self, file: str, name: str, hops: int = 0) -> Resolved | None:
        """Where ``name`` as seen in ``file`` is defined: here, or through imports and re-exports."""
        key = (file, name)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = None  # cycle guard
        result = self._resolve(file, name, hops)
        self._memo[key] = result
        return result

    def _resolve(self, file: str, name: str, hops: int) -> Resolved | None:
        mod = self.index.module(file)
        if mod is None or hops > _MAX_HOPS:
            return None
        for node in mod.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return Resolved(file, node)
        for node in mod.tree.body:  # ``Alias = Name`` at module level
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name
                and isinstance(node.value, ast.Name)
            ):
                inner = self.resolve(file, node.value.id, hops + 1)
                return inner
        entry = self.imports(file).get(name)
        if entry is None:
            return None
        module, level, imported = entry
        if imported is None:
            return None
        target = self._target_file(file, module, level)
        if target is None:
            # ``from pkg import submodule`` is not a definition
            return None
        inner = self.resolve(target, imported, hops + 1)
        if inner is None:
            return None
        return Resolved(inner.file, inner.node, (target, *inner.via))

    def callee(self, mod: Module, call: ast.Call) -> Resolved | None:
        """The function or class a call runs: a name (or a local bound once to a name) or ``module.name``."""
        func = call.func
        if isinstance(func, ast.Name):
            found = self.resolve(mod.path, func.id)
            if found is None:
                value = mod.local_definition(func.id, call)
                if isinstance(value, ast.Name):
                    found = self.resolve(mod.path, value.id)
            return found
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            entry = self.imports(mod.path).get(func.value.id)
            if entry is None:
                return None
            module, level, imported = entry
            dotted = f"{module}.{imported}" if imported else module
            target = self._target_file(mod.path, dotted, level) if imported or level else self.module_file(module)
            return self.resolve(target, func.attr) if target else None
        return None

    def callees(self, mod: Module, call: ast.Call) -> list[Resolved]:
        """Every definition a call may run: :meth:`callee`, or, for a local bound to a class or function in
        several places (``cls = Default`` / ``cls = Substitute``), each of them."""
        found = self.callee(mod, call)
        if found is None and isinstance(call.func, ast.Attribute):  # a method: the tree's own dispatch
            runs, unread = methods(self, mod, call)
            if unread:
                self.unread[f"{mod.path}:{call.lineno}"] = unread
                self.unread_calls[f"{mod.path}:{call.lineno}"] = ast.unparse(call)
            return runs
        if found is not None or not isinstance(call.func, ast.Name):
            return [found] if found is not None else []
        func = next((a for a in mod.ancestors(call) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        out: list[Resolved] = []
        for node in ast.walk(func) if func is not None else []:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == call.func.id
                and isinstance(node.value, ast.Name)
            ):
                target = self.resolve(mod.path, node.value.id)
                if target is not None and all(t.node is not target.node for t in out):
                    out.append(target)
        return out

    def exporters(self, file: str, name: str) -> list[tuple[str, str]]:
        """Package ``__init__`` files that re-export ``name`` as defined in ``file``, with the name they
        export it under (``from .mod import f as g`` exports ``g``)."""
        out: list[tuple[str, str]] = []
        for rel in self.index.containing([name]):
            if rel == file or not rel.endswith("__init__.py"):
                continue
            for local, (_module, _level, imported) in self.imports(rel).items():
                if imported != name:
                    continue
                found = self.resolve(rel, local)
                if found is not None and found.file == file:
                    out.append((rel, local))
        return out
