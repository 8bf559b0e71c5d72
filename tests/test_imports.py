"""The packages meet only through their public ``__init__``: no module imports another package's private module."""

from __future__ import annotations

import ast
from pathlib import Path

import speedtrap

ROOT = Path(speedtrap.__file__).parent


def _package_of(path: Path, root: Path = ROOT) -> str:
    """``speedtrap.probe`` for src/speedtrap/probe/_http.py; ``speedtrap`` for top-level modules."""
    rel = path.relative_to(root.parent).with_suffix("")
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

SPEC_CONCEPTS = {"Bound", "Metric", "Verdict", "VerdictSpec", "Probe", "Gate", "GateKind", "Polarity", "Platform"}


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


# -- a curated public API: a package is used through the names its __init__'s __all__ lists ---------


def package_all(folder: Path) -> set[str] | None:
    """The names ``folder/__init__.py`` lists in ``__all__`` (read from the source), None without one."""
    tree = ast.parse((folder / "__init__.py").read_text(), str(folder))
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            return set(ast.literal_eval(node.value))
    return None


class _ForeignNames(ast.NodeVisitor):
    """Names one module takes from other packages: ``from speedtrap.pkg import name`` and, through a
    module bound by ``from speedtrap import pkg``, ``pkg.name`` (a parameter of the same name shadows it)."""

    def __init__(self, root: Path, own: str, where: str) -> None:
        self.root, self.own, self.where = root, own, where
        self.found: list[str] = []
        self.scopes: list[dict[str, str]] = [{}]

    def _package(self, module: str) -> Path | None:
        """The folder of ``module`` when it is another package than this module's own (or a parent of it)."""
        folder = self.root.parent / module.replace(".", "/")
        if module == "speedtrap" or self.own == module or self.own.startswith(module + "."):
            return None
        return folder if (folder / "__init__.py").exists() else None

    def _check(self, line: int, module: str, name: str) -> None:
        folder = self._package(module)
        if folder is not None and name not in (package_all(folder) or set()):
            self.found.append(f"{self.where}:{line} uses {module}.{name}, not in its __all__")

    def _bind(self, node: ast.AST, scope: dict[str, str]) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and sub.level == 0 and sub.module == "speedtrap":
                scope.update({a.asname or a.name: f"speedtrap.{a.name}" for a in sub.names})
            elif isinstance(sub, ast.Import):
                scope.update({a.asname: a.name for a in sub.names if a.asname and a.name.startswith("speedtrap.")})

    def visit_Module(self, node: ast.Module) -> None:
        top = [s for s in node.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        for stmt in top:
            self._bind(stmt, self.scopes[-1])
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
        scope = {k: v for k, v in self.scopes[-1].items() if k not in params}
        self._bind(node, scope)
        self.scopes.append(scope)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or not module.startswith("speedtrap."):
            return
        if (self.root.parent / module.replace(".", "/") / "__init__.py").exists():
            for a in node.names:
                self._check(node.lineno, module, a.name)
        else:  # a module of a package: only its own package (or a package inside it) reads it directly
            package = module.rpartition(".")[0]
            if self._package(package) is not None:
                self.found.append(f"{self.where}:{node.lineno} imports module {module}, not its package's __all__")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.scopes[-1]:
            self._check(node.lineno, self.scopes[-1][node.value.id], node.attr)
        self.generic_visit(node)


def foreign_names(root: Path = ROOT) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        visitor = _ForeignNames(root, _package_of(path, root), str(path.relative_to(root.parent)))
        visitor.visit(ast.parse(path.read_text(), str(path)))
        found += visitor.found
    return found


def test_every_package_lists_its_public_names() -> None:
    missing = [
        str(p.parent.relative_to(ROOT.parent)) for p in ROOT.rglob("__init__.py") if package_all(p.parent) is None
    ]
    assert missing == []


def test_packages_use_only_the_names_each_other_lists() -> None:
    assert foreign_names() == []


def test_the_walker_sees_a_name_outside_all(tmp_path: Path) -> None:
    root = tmp_path / "speedtrap"
    for pkg in ("a", "b"):
        (root / pkg).mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "a" / "__init__.py").write_text('from speedtrap.a._impl import x, hidden\n__all__ = ["x"]\n')
    (root / "a" / "_impl.py").write_text("x = hidden = 1\n")
    (root / "a" / "sub.py").write_text("q = 1\n")
    (root / "b" / "__init__.py").write_text("__all__: list[str] = []\n")
    (root / "b" / "_use.py").write_text(
        "from speedtrap.a import x, hidden\n"
        "from speedtrap.a.sub import q\n"
        "from speedtrap import a\n"
        "a.x, a.hidden\n"
        "def f(a: object) -> None:\n"
        "    a.shadowed\n"
        "def g() -> None:\n"
        "    from speedtrap import a as mine\n"
        "    mine.inner\n"
    )
    assert foreign_names(root) == [
        "speedtrap/b/_use.py:1 uses speedtrap.a.hidden, not in its __all__",
        "speedtrap/b/_use.py:2 imports module speedtrap.a.sub, not its package's __all__",
        "speedtrap/b/_use.py:4 uses speedtrap.a.hidden, not in its __all__",
        "speedtrap/b/_use.py:9 uses speedtrap.a.inner, not in its __all__",
    ]
    assert foreign_names(root / "a") == []  # a package reads its own modules freely


# -- packages that load their machinery on first use: every listed name resolves ----------------

LAZY_PACKAGES = ("speedtrap.isolate", "speedtrap.localize", "speedtrap.probe", "speedtrap.spec")


def test_every_name_a_lazy_package_lists_resolves() -> None:
    import importlib

    for package in LAZY_PACKAGES:
        module = importlib.import_module(package)
        assert [n for n in module.__all__ if not hasattr(module, n)] == [], package


def test_the_probes_result_types_load_neither_torch_nor_httpx() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from speedtrap.probe import KLStats, PhaseDivergence, RecallCell; "
        "print(sorted(m for m in sys.modules if m in ('torch', 'httpx') or m.startswith('speedtrap.probe')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(["speedtrap.probe", "speedtrap.probe._results", "speedtrap.probe._stats"])
    # a name a module exports under another name resolves through the lazy table too
    from speedtrap.probe import RECORDING_FORMAT

    assert RECORDING_FORMAT == "speedtrap-recording"
