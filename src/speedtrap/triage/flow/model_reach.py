"""Which files the served model can run: its class's file and everything that file imports at module
level, transitively (read off the text; a model registry's lazy import by string is not an import, so
other models' files stay out). A changed model file (under a ``models/`` folder) outside that set is
code the served model never runs; other shared code outside it is only said to be so, not demoted.

The model is named by its class (``DeepseekV3ForCausalLM``), a ``config.json`` (its ``architectures``),
or a folder holding one.

Catches::

    models/deepseek_v2.py changed, NemotronHForCausalLM served   ->   not reachable from the served model

"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

from speedtrap._errors import UsageError
from speedtrap.triage.flow.resolve import Resolver
from speedtrap.triage.source import SourceIndex


@dataclass(frozen=True)
class Reachable:
    model: str  # the class name
    file: str  # the file defining it
    files: frozenset[str]  # every file its file imports, transitively (itself included)

    def verdict(self, paths: list[str]) -> tuple[bool, str]:
        """(reachable, in words) for a patch changing ``paths``."""
        py = [p for p in paths if p.endswith(".py")]
        hit = [p for p in py if p in self.files]
        if hit:
            return True, f"reachable from the served model {self.model} ({self.file} imports {hit[0]})"
        if not py:
            return True, f"not Python: whether the served model {self.model} runs it is not read here"
        if not any("/models/" in "/" + p for p in py):
            return True, (
                f"not imported by the served model's file {self.file} (nor by what it imports): shared code "
                "the engine may still run for it; not demoted"
            )
        return False, (
            f"not reachable from the served model {self.model}: {', '.join(py[:3])} "
            f"{'is' if len(py) == 1 else 'are'} not imported by {self.file}, even transitively"
        )


def model_class(spec: str) -> str:
    """The class name from ``--model``: a class name, a config.json, or a folder holding one."""
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.name == "config.json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the model config {str(path)!r}: {exc}", "pass a config.json") from None
        arch = data.get("architectures") if isinstance(data, dict) else None
        if not (isinstance(arch, list) and arch and isinstance(arch[0], str)):
            raise UsageError(f"{str(path)!r} has no architectures list", "pass --model with the model's class name")
        return arch[0]
    if not spec.isidentifier():
        raise UsageError(
            f"--model {spec!r} is not a class name, a config.json or a folder holding one",
            "pass e.g. --model DeepseekV3ForCausalLM",
        )
    return spec


_FROM = re.compile(r"^from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.M)
_IMPORT = re.compile(r"^import[ \t]+([^\n#]+)", re.M)


def _imported(resolver: Resolver, file: str) -> set[str]:
    """The files ``file``'s module-level imports bring in, read off the text (no parse: a model's closure
    is hundreds of files). ``from a import b``: the submodule ``a.b`` if there is one, else ``a``."""
    text = resolver.index.read(file) or ""
    out: set[str] = set()
    for m in _FROM.finditer(text):
        level, module = len(m.group(1)), m.group(2)
        names = [n.split(" as ")[0].strip() for n in m.group(3).strip("()").replace("\n", ",").split(",")]
        for name in [n for n in names if n.isidentifier()]:
            dotted = f"{module}.{name}" if module else name
            sub = resolver._relative(file, level, dotted) if level else resolver.module_file(dotted)
            base = (
                (resolver._relative(file, level, module) if level else resolver.module_file(module))
                if module or level
                else None
            )
            if sub is not None:
                out.add(sub)
            elif base is not None:
                out.add(base)
    for m in _IMPORT.finditer(text):
        for part in m.group(1).split(","):
            found = resolver.module_file(part.split(" as ")[0].strip())
            if found is not None:
                out.add(found)
    return out


def reachable(index: SourceIndex, spec: str) -> Reachable:
    name = model_class(spec)
    resolver = Resolver(index)
    home = None
    for rel in index.containing([name]):
        mod = index.module(rel)
        if mod is not None and any(isinstance(n, ast.ClassDef) and n.name == name for n in mod.tree.body):
            home = rel
            break
    if home is None:
        raise UsageError(f"no class {name} in the tree {index.root}", "check --model against the tree's model classes")
    seen = {home}
    todo = [home]
    while todo:
        for nxt in _imported(resolver, todo.pop()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return Reachable(name, home, frozenset(seen))
