"""Following a factor through calls on a small tree written here: a router built through a package
re-export under another name, a runner given the factor positionally, attributes set in __init__ and
read in forward. Each patch's effect (factor applied twice under a flag, moved, or not reaching a
multiply) is known by construction."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from _triage_one import lay_tree

from speedtrap.triage import from_diff_files, render_plan, triage

FILES = {
    "pkg/__init__.py": "from pkg.router.impl import make_router as build_router\n",
    "pkg/router/__init__.py": "",
    "pkg/router/impl.py": """\
        class Router:
            def __init__(self, top_k, scale=1.0):
                self.top_k = top_k
                self.scale = scale

            def forward(self, w):
                if self.scale != 1.0:
                    w = w * self.scale
                return w


        def make_router(top_k, scale=1.0):
            return Router(top_k, scale=scale)
        """,
    "pkg/runner.py": """\
        class Runner:
            def __init__(self, factor, bias=None):
                self.factor = factor
                self.bias = bias

            def forward(self, out):
                out *= self.factor
                if self.bias is not None:
                    out = out + self.bias
                return out
        """,
    "pkg/layer.py": """\
        from pkg import build_router
        from pkg.runner import Runner


        def build(factor, on_output, shift):
            router = build_router(4, scale=factor if not on_output else 1.0)
            runner = Runner(factor if on_output else 1.0, bias=shift if on_output else None)
            return router, runner
        """,
    "pkg/model.py": """\
        from torch import nn

        from pkg.layer import build


        class Block(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.router, self.runner = build(config.factor, config.on_output, config.shift)

            def forward(self, x):
                return self.runner.forward(self.router.forward(x))


        class Model(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.layers = nn.ModuleList([Block(config) for _ in range(config.n)])
        """,
}
ROUTER_ARG = "scale=factor if not on_output else 1.0"
RUNNER_ARG = "Runner(factor if on_output else 1.0,"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return lay_tree(tmp_path / "tree", FILES)


def patched(tree: Path, edits: list[tuple[str, str]], out: Path, rel: str = "pkg/layer.py") -> Path:
    before = (tree / rel).read_text()
    after = before
    for old, new in edits:
        assert after.count(old) == 1
        after = after.replace(old, new)
    out.write_text(
        "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    )
    return out


def test_identity_removed_reaches_the_router_multiply_and_doubles_the_runner(tree: Path, tmp_path: Path) -> None:
    diff = patched(tree, [(ROUTER_ARG, "scale=factor")], tmp_path / "p.diff")
    report = triage(from_diff_files([diff], tree), "factor")
    [p] = report.patches
    assert p.tier == 1
    assert "lets the factor reach `w = w * self.scale` at pkg/router/impl.py:8" in render_plan(report)
    [sig] = [s for s in p.signals.signals if s.data.get("change") == "identity removed"]
    assert "condition `on_output` that selected 1.0" in sig.summary
    [reach] = sig.data["reaches"]
    assert (reach["multiply"]["file"], reach["multiply"]["code"]) == ("pkg/router/impl.py", "w = w * self.scale")
    assert reach["hops"][0].startswith("build_router(scale=) at pkg/layer.py:")  # through the re-export alias
    [double] = [d for d in p.doubles if d.verb != "adds"]
    assert double.added.where == "pkg/router/impl.py:8" and double.other.where == "pkg/runner.py:7"
    assert "on_output is set" in double.in_full and "Runner(arg 0)" in double.in_full
    # make_router's caller is found through the alias; build is called in Block.__init__, built per layer.
    assert p.signals.best_hot_path is not None and p.signals.best_hot_path.level == "every layer"


def test_identity_condition_changed(tree: Path, tmp_path: Path) -> None:
    diff = patched(tree, [(ROUTER_ARG, "scale=factor if on_output else 1.0")], tmp_path / "p.diff")
    [p] = triage(from_diff_files([diff], tree)).patches
    [sig] = [s for s in p.signals.signals if s.data.get("change") == "identity condition changed"]
    assert sig.data["factor"] == "factor" and sig.data["flags"] == ["on_output"]
    assert any("on_output is set" in d.in_full for d in p.doubles)


def test_factor_moved_from_runner_to_router_is_not_a_double_application(tree: Path, tmp_path: Path) -> None:
    diff = patched(tree, [(ROUTER_ARG, "scale=factor"), (RUNNER_ARG, "Runner(1.0,")], tmp_path / "p.diff")
    [p] = triage(from_diff_files([diff], tree), "factor").patches
    assert any(s.data.get("change") == "identity removed" for s in p.signals.signals)
    assert p.doubles == []


def test_identity_whose_value_reaches_no_multiply_is_not_a_scale_change(tree: Path, tmp_path: Path) -> None:
    # `shift` (None = skip) reaches an add only.
    diff = patched(tree, [("bias=shift if on_output else None", "bias=shift")], tmp_path / "p.diff")
    [p] = triage(from_diff_files([diff], tree)).patches
    assert not any(s.kind == "scale" for s in p.signals.signals) and p.doubles == []
    # not a scale change; the selection itself is gone, and that is said (a collapsed selection, not a scale)
    assert "scale" not in p.ranking.points and "collapses the selection on `on_output`" in p.ranking.reasons[0]


def test_a_rewritten_multiply_under_the_same_guard_is_not_a_double_application(tree: Path, tmp_path: Path) -> None:
    diff = patched(
        tree,
        [("w = w * self.scale", "w = (w.float() * self.scale).to(w.dtype)")],
        tmp_path / "p.diff",
        "pkg/router/impl.py",
    )
    [p] = triage(from_diff_files([diff], tree), "scale").patches
    assert p.doubles == [] and p.tier > 1


def test_comment_and_docstring_only_change_is_tier_3(tree: Path, tmp_path: Path) -> None:
    diff = patched(
        tree,
        [
            (
                "def build(factor, on_output, shift):\n",
                'def build(factor, on_output, shift):\n    """Router and runner."""  # doc\n',
            )
        ],
        tmp_path / "p.diff",
    )
    [p] = triage(from_diff_files([diff], tree)).patches
    assert p.tier == 3 and p.signals.hot_paths == []
