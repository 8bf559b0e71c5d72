"""Where the factor is applied, measured while the unit replays (``speedtrap_agent.provenance``).

Ground truth by construction: the lines that multiply by the factor are found in the source by their
text (smol-moe's combine, the patch that doubles it, the example user patch on an ``hf:`` model), and a
toy SGLang-shaped MoE below marks its own lines: a top-k custom op that receives the factor as a kernel
argument (and applies it only when told to), a Python function that only passes it on, and the combine.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from localize_helpers import with_user_patches
from torch import Tensor, nn

from speedtrap.localize import check_scale, default_ids, scale_words
from speedtrap.localize._live import _scale_result
from speedtrap.localize._results import FactorSite, ScaleCheckResult
from speedtrap.localize.agent.speedtrap_agent.scale import Scale
from speedtrap.targets._base import InProcessModel

FACTOR = 2.5


def _line(obj: Any, text: str) -> tuple[str, int]:
    """The file and line number of the one line of ``obj``'s source that holds ``text``."""
    lines, first = inspect.getsourcelines(obj)
    (index,) = [i for i, line in enumerate(lines) if text in line]
    return inspect.getsourcefile(obj) or "", first + index


def _applying(result: ScaleCheckResult, unit: int = 0) -> list[tuple[str, int, int]]:
    return sorted((s.file, s.line, s.applies) for s in result.units[unit].applying)


# -- smol-moe and hf: in-process ---------------------------------------------------------------------


def test_smol_moe_names_the_combine_once_and_the_patch_as_the_second_site(
    smol: InProcessModel, smol_ids: list[int]
) -> None:
    from speedtrap.targets.smolmoe import model, patches

    combine = _line(model.MoE.forward, "routed * self.routed_scaling_factor")
    patch = _line(patches.ScaledHashTopK.forward, "weights * self.routed_scaling_factor")
    base = check_scale(smol, smol_ids[:16])
    assert all(_applying(base, i) == [(*combine, 1)] for i in range(len(base.units)))
    assert "applied once: `model.py:" in scale_words(base.units)
    doubled = check_scale(smol, smol_ids[:16], patches=["hash_topk_routed_scaling"])
    hashed = {u.layer for u in doubled.units if u.times == 2}
    for i, unit in enumerate(doubled.units):
        expected = [combine, patch] if unit.layer in hashed else [combine]
        assert _applying(doubled, i) == sorted((*e, 1) for e in expected)
    words = scale_words(doubled.units)
    assert f"applied twice: `patches.py:{patch[1]}` (ScaledHashTopK.forward" in words
    assert f"`model.py:{combine[1]}` (MoE.forward" in words
    assert doubled.provenance is not None and doubled.provenance["bytes"] > 0


def test_an_hf_model_names_transformers_router_and_the_user_patch(hf_v3: InProcessModel) -> None:
    from speedtrap.localize import examples

    (again,) = with_user_patches(hf_v3, "factor_again_layers_1_3")
    result = check_scale(hf_v3, default_ids(hf_v3, 16), patches=[again])
    patch = _line(examples.ScaleRoutedOutput.forward, "out * self.routed_scaling_factor")
    for unit in result.units:
        files = [(Path(s.file).name, s.line) for s in unit.applying]
        assert len(files) == unit.times
        assert ("modeling_deepseek_v3.py" in {f for f, _ in files}) and ((Path(patch[0]).name, patch[1]) in files) == (
            unit.layer in (1, 3)
        )


# -- the agent's path, in this process, on an SGLang-shaped MoE -------------------------------------------


@torch.library.custom_op("speedtrap_test::topk_weights", mutates_args=())
def _topk_weights(logits: Tensor, k: int, routed_scaling_factor: float, apply: bool) -> Tensor:
    """A fused top-k kernel: dense renormalized weights of the top ``k``; the factor applied only if ``apply``."""
    values, index = torch.softmax(logits, -1).topk(k, -1)
    dense = torch.zeros_like(logits).scatter(-1, index, values / values.sum(-1, keepdim=True))
    return dense * routed_scaling_factor if apply else dense


@_topk_weights.register_fake
def _(logits: Tensor, k: int, routed_scaling_factor: float, apply: bool) -> Tensor:
    return torch.empty_like(logits)


@dataclass(frozen=True)
class TopKConfig:
    top_k: int
    routed_scaling_factor: float
    apply_routed_scaling_factor_on_output: bool


def fused_topk(logits: Tensor, k: int, routed_scaling_factor: float, apply: bool) -> Tensor:
    return torch.ops.speedtrap_test.topk_weights(logits, k, routed_scaling_factor, apply)  # site: kernel


def select_experts(logits: Tensor, config: TopKConfig) -> Tensor:
    return fused_topk(  # site: passes on
        logits, config.top_k, config.routed_scaling_factor, config.apply_routed_scaling_factor_on_output
    )


class TopK(nn.Module):
    def __init__(self, config: TopKConfig) -> None:
        super().__init__()
        self.topk_config = config

    def forward(self, logits: Tensor) -> Tensor:
        return select_experts(logits, self.topk_config)


class MoE(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.routed_scaling_factor = FACTOR
        self.gate = nn.Linear(8, 4, bias=False)
        self.topk = TopK(TopKConfig(2, FACTOR, fused))
        self.experts = nn.ModuleList(nn.Linear(8, 8, bias=False) for _ in range(4))
        self.shared_experts = nn.Linear(8, 8, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        weights = self.topk(self.gate(x))
        routed = sum(weights[:, e : e + 1] * expert(x) for e, expert in enumerate(self.experts))
        assert isinstance(routed, Tensor)
        return routed * self.routed_scaling_factor + self.shared_experts(x)  # site: combine


class Layer(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.mlp = MoE(fused)


class Root(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.config = SimpleNamespace(routed_scaling_factor=FACTOR)
        self.layers = nn.ModuleList([Layer(fused)])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            assert isinstance(layer, Layer)
            x = x + layer.mlp(x)
        return x


def _in_agent(fused: bool, out: Path) -> ScaleCheckResult:
    """The agent's scale command on one forward, replayed as in a worker, read back as the harness does."""
    root = Root(fused)
    scale = Scale(SimpleNamespace(root=root, engine="sglang"), {"id": "s", "param": "routed_scaling_factor",  # type: ignore[arg-type]
                                                               "multipliers": [0.5, 1.0, 2.0, 4.0]})  # fmt: skip
    with torch.inference_mode():
        root(torch.randn(5, 8))
    out.mkdir(parents=True)
    scale.replay(out)
    return _scale_result(json.loads((out / "scale.json").read_text()), (), 5, "sglang")


def _marked(mark: str) -> tuple[str, int]:
    lines, _ = inspect.getsourcelines(inspect.getmodule(_marked))  # type: ignore[arg-type]
    (index,) = [i for i, line in enumerate(lines) if line.rstrip().endswith(f"# site: {mark}")]
    return __file__, index + 1


def test_in_the_agent_the_kernel_argument_and_the_combine_are_both_named(tmp_path: Path) -> None:
    kernel, combine, passes = _marked("kernel"), _marked("combine"), _marked("passes on")
    fused = _in_agent(True, tmp_path / "fused")
    (unit,) = fused.units
    assert unit.times == 2
    assert sorted((s.file, s.line, s.kind) for s in unit.applying) == sorted(
        [(*kernel, "kernel argument"), (*combine, "tensor operand")]
    )
    passing = [s for s in unit.sites or () if (s.file, s.line) == passes]
    assert passing and all(s.passes_on and s.applies == 0 and s.kind == "call argument" for s in passing)
    assert scale_words(fused.units).startswith("layer 0: exponent ≈ 2.00, applied twice: `test_provenance.py:")
    assert fused.provenance is not None and fused.provenance["seconds"] > 0


def test_a_kernel_that_receives_the_factor_without_applying_it_is_not_counted(tmp_path: Path) -> None:
    kernel, combine = _marked("kernel"), _marked("combine")
    (unit,) = _in_agent(False, tmp_path / "base").units
    assert unit.times == 1
    assert [(s.file, s.line) for s in unit.applying] == [combine]
    read = [s for s in unit.sites or () if (s.file, s.line) == kernel]
    assert len(read) == 1 and read[0].applies == 0 and read[0].exponent == pytest.approx(0.0, abs=1e-9)
    assert unit.sites_words().startswith(f"applied once: `test_provenance.py:{combine[1]}` (MoE.forward")


def test_sites_round_trip_through_json_and_an_older_result_has_none() -> None:
    site = FactorSite("/a/b/topk.py", 7, "f", "kernel argument", "op", 1, 1.0, 0.0, 1)
    assert FactorSite.from_json(json.loads(json.dumps(site.to_json()))) == site
    assert site.where == "topk.py:7"
    from speedtrap.localize._results import ScaleUnit

    old = {"module": "m", "verdict": "applied once", "times": 1}
    assert ScaleUnit.from_json(old).sites is None and ScaleUnit.from_json(old).sites_words() == ""


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("torch_dynamo_resume_in_biased_grouped_topk_impl_at_1840", "biased_grouped_topk_impl"),  # SGLang's, measured
        ("torch_dynamo_resume_in_torch_dynamo_resume_in_f_at_3_at_9", "f"),  # a resume of a resume
        ("Glm4MoeSparseMoeBlock.forward_normal", "Glm4MoeSparseMoeBlock.forward_normal"),
        ("resume_at_home", "resume_at_home"),
    ],
)
def test_a_site_in_a_frame_torch_compile_resumed_is_named_by_its_source_function(name: str, shown: str) -> None:
    from speedtrap.localize.agent.speedtrap_agent.provenance import _qualname

    assert _qualname(SimpleNamespace(co_qualname=name, co_name=name)) == shown
