"""Who calls or instantiates whom, by name, across a tree (read with ``ast``, searched lazily).

A *unit* is a top-level class or function of a module. A call ``Name(...)`` or ``mod.Name(...)``
in a file that defines or imports ``Name`` is a reference to it; ``self.name(...)`` is not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from speedtrap.triage.flow.resolve import Resolver
from speedtrap.triage.source import Module, SourceIndex


@dataclass(frozen=True)
class CallSite:
    file: str
    unit: str | None  # the top-level class or function holding the call
    function: str | None  # the innermost function holding it
    node: ast.Call
    module: Module


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id in ("self", "cls"):
            return None
        return func.attr
    return None


def _stem(file: str) -> str:
    path = Path(file)
    return path.stem if path.stem != "__init__" else path.parent.name


def _chain(path: list[str]) -> str:
    return f"{path[0]} is used by " + ", used by ".join(path[1:])


MAX_CALLER_FILES = 60


class Units:
    """Cached call/instantiation lookups over one :class:`SourceIndex`."""

    def __init__(self, index: SourceIndex) -> None:
        self.index = index
        self._callers: dict[tuple[str, str | None], list[CallSite]] = {}
        self.truncated: dict[str, int] = {}
        self._names: dict[str, set[str]] = {}
        self._refs: dict[tuple[str, str], set[str]] = {}
        self._defs: dict[str, dict[str, ast.AST]] = {}
        self.resolver = Resolver(index)

    def definitions(self, file: str) -> dict[str, ast.AST]:
        """Top-level classes and functions of a file, by name."""
        if file not in self._defs:
            mod = self.index.module(file)
            defs: dict[str, ast.AST] = {}
            if mod is not None:
                for node in mod.tree.body:
                    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                        defs[node.name] = node
            self._defs[file] = defs
        return self._defs[file]

    def known_names(self, file: str) -> set[str]:
        """Names a file defines at top level or imports."""
        if file not in self._names:
            mod = self.index.module(file)
            names: set[str] = set(self.definitions(file))
            if mod is not None:
                for node in mod.nodes:
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        names.update((a.asname or a.name).split(".")[0] for a in node.names)
                        names.update(a.name for a in node.names)
            self._names[file] = names
        return self._names[file]

    def callers(self, name: str, defined_in: str | None = None) -> list[CallSite]:
        """Calls of ``name`` (a class: its instantiations) in the tree.

        With ``defined_in``, only files that could import it (they name its module) are read. The
        files most likely to build modules come first (the defining file, its package, model
        files), and at most ``MAX_CALLER_FILES`` of them are parsed, so a name used in hundreds of
        files costs a bounded time; ``truncated`` records the names whose search was cut.
        """
        key = (name, defined_in)
        if key not in self._callers:
            names = {name}
            files = self.index.containing([name])
            if defined_in is not None:
                # A caller names the defining module, or a package whose __init__ re-exports the name
                # (perhaps under another name: ``from .mod import f as g``).
                exporters = self.resolver.exporters(defined_in, name)
                names |= {local for _f, local in exporters}
                for alias in names - {name}:
                    files = sorted(set(files) | set(self.index.containing([alias])))
                needles = {_stem(defined_in)} | {_stem(f) for f, _local in exporters}
                here = str(Path(defined_in).parent)
                files = [
                    f
                    for f in files
                    if f == defined_in or any(n.encode() in (self.index.raw(f) or b"") for n in needles)
                ]
                files.sort(key=lambda f: (f != defined_in, str(Path(f).parent) != here, "model" not in f, f))
            else:
                files.sort(key=lambda f: ("model" not in f, f))
            if len(files) > MAX_CALLER_FILES:
                self.truncated[name] = len(files) - MAX_CALLER_FILES
                files = files[:MAX_CALLER_FILES]
            found: list[CallSite] = []
            for file in files:
                mod = self.index.module(file)
                if mod is None:
                    continue
                known = self.known_names(file)
                for node in mod.nodes:
                    if isinstance(node, ast.Call) and (callee := _callee(node)) in names:
                        if callee not in known and not isinstance(node.func, ast.Attribute):
                            continue
                        unit, func = mod.scope_of(node)
                        found.append(CallSite(file, unit, func, node, mod))
            self._callers[key] = found
        return self._callers[key]

    def refs(self, file: str, unit: str) -> set[str]:
        """Names a unit calls or instantiates."""
        key = (file, unit)
        if key not in self._refs:
            node = self.definitions(file).get(unit)
            out: set[str] = set()
            if node is not None:
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Call):
                        callee = _callee(sub)
                        if callee:
                            out.add(callee)
            self._refs[key] = out
        return self._refs[key]

    def relation(
        self, a_file: str, a_unit: str | None, b_file: str, b_unit: str | None, depth: int = 3
    ) -> tuple[str, int] | None:
        """How unit B sits on the same execution path as unit A, in words, and how many hops apart."""
        if a_unit is None or b_unit is None:
            return ("same module", 1) if a_file == b_file else None
        if a_file == b_file and a_unit == b_unit:
            return f"both in {a_unit}", 0
        if b_unit in self.refs(a_file, a_unit) and b_unit in self.known_names(a_file):
            return f"{a_unit} calls {b_unit}", 1
        frontier: list[tuple[str, str, list[str]]] = [(a_file, a_unit, [a_unit])]
        seen = {(a_file, a_unit)}
        for hop in range(1, depth + 1):
            nxt: list[tuple[str, str, list[str]]] = []
            for file, unit, chain in frontier:
                for site in self.callers(unit, file):
                    if site.unit is None or (site.file, site.unit) in seen:
                        continue
                    seen.add((site.file, site.unit))
                    path = [*chain, site.unit]
                    if site.file == b_file and site.unit == b_unit:
                        return _chain(path), hop
                    if b_unit in self.refs(site.file, site.unit) and (
                        site.file == b_file or b_unit in self.known_names(site.file)
                    ):
                        return _chain(path) + f", which also calls {b_unit}", hop + 1
                    nxt.append((site.file, site.unit, path))
            frontier = nxt
            if not frontier:
                break
        return None
