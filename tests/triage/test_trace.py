"""The factor trace on a small tree written here: roles, guards, text fallback, double application."""

from __future__ import annotations

import difflib
import textwrap
from pathlib import Path

import pytest

from speedtrap._errors import UsageError
from speedtrap.triage import PatchSet, from_diff_files, trace_symbol, triage

MODEL = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class TopK(nn.Module):
        def __init__(self, k, routed_scaling_factor=2.5, apply_on_output=False):
            super().__init__()
            self.routed_scaling_factor = routed_scaling_factor
            self.apply_on_output = apply_on_output

        def forward(self, logits):
            w, i = logits.topk(2)
            if self.apply_on_output:
                w = w * self.routed_scaling_factor
            return w, i


    class MoE(nn.Module):
        def __init__(self, config, layer_id):
            super().__init__()
            self.routed_scaling_factor = config.routed_scaling_factor
            self.gate = TopK(2, routed_scaling_factor=self.routed_scaling_factor)
            self.fused = config.fused

        def forward(self, x):
            w, i = self.gate(x)
            out = x * w.sum(-1, keepdim=True)
            if not self.gate.apply_on_output:
                out *= self.routed_scaling_factor
            elif self.fused:
                return out
            else:
                out = out / self.routed_scaling_factor
            return out


    def combine(routed, shared, routed_scaling_factor):
        if shared is None:
            return routed
        return shared.add_(routed, alpha=routed_scaling_factor)


    class Model(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.layers = nn.ModuleList([MoE(config, i) for i in range(config.n)])
            self.cfg = {"routed_scaling_factor": 1.5}

        def forward(self, x):
            factor = getattr(self.cfg, "routed_scaling_factor", 1.0)
            for layer in self.layers:
                x = layer(x)
            return x * 1.0 if factor else x
    """
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "model.py").write_text(MODEL)
    (root / "pkg" / "kernel.cu").write_text("float y = x * routed_scaling_factor;\n// routed_scaling_factor_x no\n")
    (root / "pkg" / "old.py").write_text("print 'py2' routed_scaling_factor\n")
    (root / "pkg" / "weights.bin").write_bytes(b"\x00routed_scaling_factor\x00")
    return root


def diff_of(tree: Path, rel: str, old: str, new: str, out: Path) -> Path:
    before = (tree / rel).read_text()
    assert before.count(old) == 1
    after = before.replace(old, new)
    text = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    out.write_text(text)
    return out


def test_every_site_with_role_function_and_guards(tree: Path) -> None:
    result = trace_symbol(tree, "routed_scaling_factor")
    by_line = {(s.file, s.line): s for s in result.sites if s.file == "pkg/model.py"}
    lines = MODEL.splitlines()

    def site(code: str) -> object:
        no = next(i for i, line in enumerate(lines, 1) if code in line)
        return by_line[("pkg/model.py", no)]

    s = site("w = w * self.routed_scaling_factor")
    assert (s.role, s.function, s.guards, s.flags) == (
        "multiply",
        "TopK.forward",
        ("if self.apply_on_output",),
        ("apply_on_output",),
    )
    s = site("out *= self.routed_scaling_factor")
    assert s.role == "multiply" and s.guards == ("if not self.gate.apply_on_output",)
    s = site("out = out / self.routed_scaling_factor")
    assert s.role == "divide"
    assert s.guards == ("not (self.fused) [else]", "not (not self.gate.apply_on_output) [else]")
    s = site("alpha=routed_scaling_factor")
    assert (s.role, s.function) == ("multiply", "combine") and s.guards == ("not (shared is None) [early exit]",)
    assert site("def __init__(self, k, routed_scaling_factor").role == "configure"
    assert site("self.routed_scaling_factor = config").role == "configure"
    assert site("TopK(2, routed_scaling_factor=").role == "pass"
    assert site('{"routed_scaling_factor": 1.5}').role == "configure"
    assert site('getattr(self.cfg, "routed_scaling_factor"').role == "read"
    text = [s for s in result.sites if s.method != "ast"]
    assert {(s.file, s.role, s.method) for s in text} == {
        ("pkg/kernel.cu", "multiply", "text"),
        ("pkg/old.py", "read", "text (not valid Python 3)"),
    }
    assert not any(s.file.endswith(".bin") for s in result.sites)


def test_unconditional_multiply_added_is_a_possible_double_application(tree: Path, tmp_path: Path) -> None:
    patch = diff_of(
        tree,
        "pkg/model.py",
        "        if self.apply_on_output:\n            w = w * self.routed_scaling_factor\n",
        "        w = w * self.routed_scaling_factor\n",
        tmp_path / "uncond.diff",
    )
    report = triage(from_diff_files([patch], tree), "routed_scaling_factor")
    assert report.trace is not None
    [added] = report.trace.added
    assert added.function == "TopK.forward" and added.guards == ()
    others = {(d.other.function, d.other.role) for d in report.trace.double_applications}
    assert ("MoE.forward", "multiply") in others
    assert all(d.added.where == added.where for d in report.trace.double_applications)
    [p] = report.patches
    assert p.tier == 1
    assert any("scale" in s.kind and "now unconditional" in s.summary for s in p.signals.signals)


def test_a_multiply_under_the_opposite_flag_is_not_flagged(tree: Path, tmp_path: Path) -> None:
    # MoE multiplies only when TopK does not (the same flag, negated): excluded. The multiply already in
    # TopK.forward runs under the same flag as the new one: both apply, which is flagged.
    patch = diff_of(
        tree,
        "pkg/model.py",
        "        w, i = logits.topk(2)\n",
        "        w, i = logits.topk(2)\n        if self.apply_on_output:\n"
        "            w = w * 2 * self.routed_scaling_factor\n",
        tmp_path / "guarded.diff",
    )
    report = triage(from_diff_files([patch], tree), "routed_scaling_factor")
    assert report.trace is not None and len(report.trace.added) == 1
    assert [d.other.function for d in report.trace.double_applications] == ["TopK.forward"]


def test_the_factor_check_runs_without_symbol(tree: Path, tmp_path: Path) -> None:
    patch = diff_of(
        tree,
        "pkg/model.py",
        "        return w, i\n",
        "        return w * self.routed_scaling_factor, i\n",
        tmp_path / "p.diff",
    )
    report = triage(from_diff_files([patch], tree))
    [p] = report.patches
    assert p.doubles and p.doubles[0].symbol == "routed_scaling_factor"
    assert report.trace is None


def test_hot_path_every_layer_and_setup(tree: Path, tmp_path: Path) -> None:
    forward = diff_of(
        tree,
        "pkg/model.py",
        "        out = x * w.sum(-1, keepdim=True)\n",
        "        out = (x.bfloat16() * w.sum(-1, keepdim=True)).float()\n",
        tmp_path / "f.diff",
    )
    [p] = triage(from_diff_files([forward], tree)).patches
    best = p.signals.best_hot_path
    assert best is not None and best.level == "every layer" and "MoE.forward" in best.function
    assert any(s.kind == "precision" and "bf16" in s.summary for s in p.signals.signals)
    init = diff_of(
        tree,
        "pkg/model.py",
        "        self.fused = config.fused\n",
        "        self.fused = config.fused and True\n",
        tmp_path / "i.diff",
    )
    [q] = triage(from_diff_files([init], tree)).patches
    # Set in MoE.__init__, but read by MoE.forward on every layer: exposed where it is read.
    hot = q.signals.best_hot_path
    assert hot is not None and hot.level == "every layer" and hot.reader == "self.fused in MoE.forward"
    # `x and True` is not `x`: not proven inert, so not "same math", but no risky pattern either.
    assert q.tier == 2 and q.ranking.risk == 0
    assert q.ranking.reasons[0].startswith(
        "no static signal: changes computation on the forward path; no known risky pattern matched"
    )
    assert not q.ranking.signal and q.ranking.tier_words == "2 (no static signal)"
    assert "pkg/model.py:" in q.ranking.in_full[0] and "config.fused and True" in q.ranking.in_full[0]


def test_symbol_must_be_an_identifier(tree: Path) -> None:
    with pytest.raises(UsageError, match="not a Python identifier"):
        triage(PatchSet([], tree, "none"), "routed scaling")
