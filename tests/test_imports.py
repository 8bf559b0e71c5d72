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


# -- one concept, one type: the spec's concepts are defined in speedtrap/spec only ---------------

SPEC_CONCEPTS = {"Bound", "Metric", "Verdict", "VerdictSpec", "Probe", "Gate", "GateKind", "Polarity"}


def second_definitions(root: Path = ROOT) -> list[str]:
    """Classes or aliases named like a spec concept, defined outside ``speedtrap/spec``; and name guesses."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        if rel.startswith("speedtrap/spec/"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call | ast.Dict):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            for name in names:
                if name in SPEC_CONCEPTS or name.endswith("Probe"):
                    found.append(f"{rel}:{node.lineno} defines {name}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "endswith"
                and any(isinstance(c, ast.Constant) and c.value in ("accuracy", "same_top1") for c in ast.walk(node))
            ):
                found.append(f"{rel}:{node.lineno} guesses a metric's polarity from its name")
    return found


def test_the_spec_concepts_are_defined_once() -> None:
    assert second_definitions() == []


def test_the_walker_sees_a_second_bound(tmp_path: Path) -> None:
    pkg = tmp_path / "speedtrap" / "regress"
    pkg.mkdir(parents=True)
    (pkg / "_check.py").write_text(
        "class Bound:\n    pass\n\nif metric.endswith(('accuracy', 'same_top1')):\n    pass\n"
    )
    found = second_definitions(tmp_path / "speedtrap")
    assert found == [
        "speedtrap/regress/_check.py:1 defines Bound",
        "speedtrap/regress/_check.py:4 guesses a metric's polarity from its name",
    ]
