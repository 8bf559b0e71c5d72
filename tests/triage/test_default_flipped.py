"""Two shapes read on calls that stay: a config key's fallback flipped (``getattr(cfg, "k", False)`` -> ``True``),
and what a dropped keyword argument carried (a factor: applied zero times now; a float32 request: the callee's
default precision now). Each patch below is built to be that change and nothing else."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from speedtrap.triage import from_diff_files, triage
from speedtrap.triage.evidence import GUARD, PRECISION, SCALE

MODEL = """\
import torch
from torch import nn


def fused_gemm(x, w, out_dtype=None, routed_scaling_factor=1.0, block=64):
    y = torch.mm(x, w)
    return y if out_dtype is None else y.to(out_dtype)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.neox = not getattr(config, "rope_interleave", False)
        self.window = config.extra.get("window", 4096)
        self.routed_scaling_factor = config.routed_scaling_factor
        self.w = nn.Parameter(torch.ones(4, 4))

    def forward(self, x):
        y = fused_gemm(x, self.w, out_dtype=torch.float32, routed_scaling_factor=self.routed_scaling_factor, block=64)
        return y if self.neox else -y


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([Attention(config) for _ in range(config.n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""

CALL = "fused_gemm(x, self.w, out_dtype=torch.float32, routed_scaling_factor=self.routed_scaling_factor, block=64)"


def _report(tmp_path: Path, old: str, new: str):  # type: ignore[no-untyped-def]
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "pkg" / "model.py").write_text(MODEL)
    assert MODEL.count(old) == 1
    after = MODEL.replace(old, new)
    diff = tmp_path / "p.diff"
    diff.write_text(
        "".join(
            difflib.unified_diff(MODEL.splitlines(True), after.splitlines(True), "a/pkg/model.py", "b/pkg/model.py")
        )
    )
    [p] = triage(from_diff_files([diff], tree)).patches
    return p


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('getattr(config, "rope_interleave", False)', 'getattr(config, "rope_interleave", True)', "rope_interleave"),
        ('config.extra.get("window", 4096)', 'config.extra.get("window", 128)', "window"),
    ],
)
def test_a_flipped_fallback_is_a_selection_change(tmp_path: Path, old: str, new: str, key: str) -> None:
    p = _report(tmp_path, old, new)
    flips = [s for s in p.signals.of(GUARD) if s.data.get("kind") == "default flipped"]
    assert [s.data["key"] for s in flips] == [key]
    assert "every config without the key now takes the other value" in flips[0].summary
    assert p.ranking.signal and p.ranking.risk >= 3


def test_a_renamed_key_is_not_a_flip_but_any_other_fallback_is(tmp_path: Path) -> None:
    renamed = _report(
        tmp_path / "a", 'getattr(config, "rope_interleave", False)', 'getattr(config, "rope_interleaved", True)'
    )
    assert not [s for s in renamed.signals.of(GUARD) if s.data.get("kind") == "default flipped"]
    same = _report(tmp_path / "b", 'getattr(config, "rope_interleave", False)', 'getattr(config, "rope_interleave", 0)')
    assert [s.data["after"] for s in same.signals.of(GUARD) if s.data.get("kind") == "default flipped"] == ["0"]


def test_a_dropped_factor_keyword_is_a_scale_change(tmp_path: Path) -> None:
    p = _report(tmp_path, CALL, "fused_gemm(x, self.w, out_dtype=torch.float32, block=64)")
    scales = p.signals.of(SCALE)
    assert [(s.data["factor"], s.data["change"]) for s in scales] == [("routed_scaling_factor", "factor dropped")]
    assert not p.signals.of(PRECISION)


def test_a_dropped_float32_request_is_a_precision_change(tmp_path: Path) -> None:
    p = _report(tmp_path, CALL, "fused_gemm(x, self.w, routed_scaling_factor=self.routed_scaling_factor, block=64)")
    assert [s.data["kind"] for s in p.signals.of(PRECISION)] == ["precision request dropped"]
    assert not p.signals.of(SCALE)


def test_another_dropped_keyword_is_only_the_argument(tmp_path: Path) -> None:
    p = _report(
        tmp_path,
        CALL,
        "fused_gemm(x, self.w, out_dtype=torch.float32, routed_scaling_factor=self.routed_scaling_factor)",
    )
    assert [s.data.get("kind") for s in p.signals.of(GUARD)] == ["argument dropped"]
    assert not p.signals.of(SCALE) and not p.signals.of(PRECISION)
