"""The packages meet only through their public ``__init__``: no module imports another package's private module."""

from __future__ import annotations

import ast
from pathlib import Path

import speedtrap

ROOT = Path(speedtrap.__file__).parent


def _package_of(path: Path) -> str:
    """``speedtrap.probe`` for src/speedtrap/probe/_http.py; ``speedtrap`` for top-level modules."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts[:-1])  # a module's package is its folder (an __init__'s too)


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
    return out


def private_cross_imports() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        own = _package_of(path)
        for line, name in _imported(ast.parse(path.read_text(), str(path))):
            parts = name.split(".")
            if parts[0] != "speedtrap":
                continue
            for i, part in enumerate(parts[1:], start=1):
                if not part.startswith("_"):
                    continue
                owner = ".".join(parts[:i])  # the package whose private module this is
                if owner != "speedtrap" and not own.startswith(owner):
                    found.append(f"{path.relative_to(ROOT.parent)}:{line} imports {name}")
                break
    return found


def test_no_module_imports_another_packages_private_module() -> None:
    assert private_cross_imports() == []


def test_the_walker_sees_a_private_import(tmp_path: Path) -> None:
    tree = ast.parse("from speedtrap.probe._http import HttpBackend\nimport speedtrap.isolate._search\n")
    names = [n for _, n in _imported(tree)]
    assert "speedtrap.probe._http" in names and "speedtrap.isolate._search" in names
