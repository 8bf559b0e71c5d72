"""A factor followed through the dispatch a tree defines, on a small tree shaped like SGLang's MoE written here:
the model builds ``FusedMoE(routed_scaling_factor=...)``; ``FusedMoE.forward`` calls
``self.quant_method.apply(self, ...)``, where ``self.quant_method`` is an ``UnquantizedFusedMoEMethod()`` or
what ``quant_config.get_quant_method(self)`` returns (a factory); ``apply`` calls ``fused_experts``, which
multiplies by the factor (the kernel side); the model's forward multiplies by it too (the model side), and
calls ``self.topk(x)`` (a module: its ``forward``), which multiplies by it when its flag says so.

Ground truth from the construction: the patch ``routed_scaling_factor=1.0`` -> ``=self.routed_scaling_factor``
lets the factor reach the kernel-side multiply while the model-side one still applies it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _triage_one import edit_diff, lay_tree
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.triage import from_diff_files, triage

FILES = {
    "pkg/__init__.py": "",
    "pkg/layers/__init__.py": "",
    "pkg/layers/base.py": """\
        class MoEMethodBase:
            def create_weights(self, layer):
                layer.w13 = None
                layer.w2 = None
        """,
    "pkg/layers/kernels.py": """\
        def _impl(x, w1, w2, topk_output):
            return x


        def fused_experts(x, w1, w2, topk_output, routed_scaling_factor=None):
            out = _impl(x, w1, w2, topk_output)
            if routed_scaling_factor is not None:
                out *= routed_scaling_factor
            return out
        """,
    "pkg/layers/unquant.py": """\
        from pkg.layers.base import MoEMethodBase
        from pkg.layers.kernels import fused_experts


        class UnquantizedFusedMoEMethod(MoEMethodBase):
            def apply(self, layer, x, topk_output, routed_scaling_factor=None):
                return self.forward_cuda(layer, x, topk_output, routed_scaling_factor)

            def forward_cuda(self, layer, x, topk_output, routed_scaling_factor):
                return fused_experts(x, layer.w13, layer.w2, topk_output, routed_scaling_factor=routed_scaling_factor)
        """,
    "pkg/layers/fp8.py": """\
        from pkg.layers.base import MoEMethodBase
        from pkg.layers.kernels import fused_experts


        class Fp8Config:
            def get_quant_method(self, layer):
                return Fp8MoEMethod(self)


        class Fp8MoEMethod(MoEMethodBase):
            def __init__(self, config):
                self.config = config

            def apply(self, layer, x, topk_output, routed_scaling_factor=None):
                return fused_experts(x, layer.w13, layer.w2, topk_output, routed_scaling_factor=routed_scaling_factor)
        """,
    "pkg/layers/fused_moe.py": """\
        from torch import nn

        from pkg.layers.unquant import UnquantizedFusedMoEMethod


        class FusedMoE(nn.Module):
            def __init__(self, num_experts, routed_scaling_factor=None, quant_config=None):
                super().__init__()
                self.routed_scaling_factor = routed_scaling_factor
                if quant_config is None:
                    self.quant_method = UnquantizedFusedMoEMethod()
                else:
                    self.quant_method = quant_config.get_quant_method(self)
                self.quant_method.create_weights(self)

            def forward(self, x, topk_output):
                return self.quant_method.apply(self, x, topk_output, routed_scaling_factor=self.routed_scaling_factor)
        """,
    "pkg/layers/topk.py": """\
        from torch import nn


        class TopK(nn.Module):
            def __init__(self, top_k, routed_scaling_factor=None, apply_on_output=False):
                super().__init__()
                self.top_k = top_k
                self.routed_scaling_factor = routed_scaling_factor
                self.apply_on_output = apply_on_output

            def forward(self, x):
                weights = x.softmax(-1)
                if not self.apply_on_output:
                    weights = weights * self.routed_scaling_factor
                return weights
        """,
    "pkg/model.py": """\
        from torch import nn

        from pkg.layers.fused_moe import FusedMoE
        from pkg.layers.topk import TopK


        class DeepseekMoE(nn.Module):
            def __init__(self, config, quant_config=None):
                super().__init__()
                self.routed_scaling_factor = config.routed_scaling_factor
                self.topk = TopK(config.k, routed_scaling_factor=self.routed_scaling_factor, apply_on_output=True)
                self.experts = FusedMoE(config.n, routed_scaling_factor=1.0, quant_config=quant_config)

            def forward(self, x):
                topk_output = self.topk(x)
                out = self.experts(x, topk_output)
                out *= self.routed_scaling_factor
                return out


        class Model(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.layers = nn.ModuleList([DeepseekMoE(config) for _ in range(config.n_layers)])
        """,
}
BEFORE = "routed_scaling_factor=1.0, quant_config"
AFTER = "routed_scaling_factor=self.routed_scaling_factor, quant_config"


def _line(tree: Path, rel: str, code: str) -> str:
    lines = (tree / rel).read_text().split("\n")
    return f"{rel}:{next(i for i, line in enumerate(lines, 1) if code in line)}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return lay_tree(tmp_path / "tree", FILES)


def _patch(tree: Path, out: Path) -> Path:
    return edit_diff(tree, "pkg/model.py", [(BEFORE, AFTER)], out)


def test_the_kernel_side_multiply_is_named_through_quant_method_apply(tree: Path, tmp_path: Path) -> None:
    report = triage(from_diff_files([_patch(tree, tmp_path / "p.diff")], tree), "routed_scaling_factor")
    [p] = report.patches
    kernel = _line(tree, "pkg/layers/kernels.py", "out *= routed_scaling_factor")
    model = _line(tree, "pkg/model.py", "out *= self.routed_scaling_factor")
    said = "\n".join(d.in_full for d in p.doubles)
    assert kernel in said and model in said, said
    [d] = [d for d in p.doubles if d.added.where == kernel and d.other.where == model]
    assert "routed_scaling_factor is not None" in " ".join(d.added.guards)  # the kernel site's condition
    assert p.tier == 1
    # the route: FusedMoE(...) -> self.routed_scaling_factor -> self.quant_method.apply -> ... -> fused_experts
    flow = " -> ".join(d.flow)
    assert "apply(routed_scaling_factor=)" in flow and "fused_experts(routed_scaling_factor=)" in flow, flow


def test_the_factory_call_it_could_not_read_is_named_with_its_candidates(tree: Path, tmp_path: Path) -> None:
    report = triage(from_diff_files([_patch(tree, tmp_path / "p.diff")], tree), "routed_scaling_factor")
    [p] = report.patches
    notes = [n for d in p.doubles for n in d.unresolved]
    # `quant_config` is a parameter: which get_quant_method runs is not read, so its classes are candidates
    assert any("quant_config.get_quant_method(self)" in n and "Fp8Config.get_quant_method" in n for n in notes), notes


def test_a_method_a_class_inherits_is_found_on_its_base(tree: Path, tmp_path: Path) -> None:
    # create_weights is defined on the base class only: a factor passed to it is followed there (MRO by name)
    from speedtrap.triage.flow import Resolver
    from speedtrap.triage.source import SourceIndex

    index = SourceIndex(tree)
    resolver = Resolver(index)
    mod = index.module("pkg/layers/fused_moe.py")
    assert mod is not None
    import ast

    [call] = [
        n
        for n in ast.walk(mod.tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "create_weights"
    ]
    found = resolver.callees(mod, call)
    assert [(r.file, r.node.name) for r in found] == [("pkg/layers/base.py", "create_weights")]


def test_the_warning_in_the_text_output_lists_every_site_with_its_condition(tree: Path, tmp_path: Path) -> None:
    diff = _patch(tree, tmp_path / "p.diff")
    out = CliRunner().invoke(app, ["triage", "--patch", str(diff), "--tree", str(tree)])
    assert out.exit_code == 0, out.output
    warning = out.stdout[out.stdout.index("warning: possible double application") :]
    kernel = _line(tree, "pkg/layers/kernels.py", "out *= routed_scaling_factor")
    model = _line(tree, "pkg/model.py", "out *= self.routed_scaling_factor")
    assert f"{kernel} fused_experts" in warning and f"{model} DeepseekMoE.forward" in warning
    js = CliRunner().invoke(app, ["triage", "--patch", str(diff), "--tree", str(tree), "--json"])
    found = json.loads(js.stdout)["patches"][0]["double_applications"]
    doubled = next(d for d in found if f"{d['added']['file']}:{d['added']['line']}" == kernel)
    assert doubled["flow"] and doubled["lines"] and doubled["unresolved"]  # the evidence, structured
