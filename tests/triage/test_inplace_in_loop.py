"""An in-place update of what a loop's items reach, added inside the loop: once per iteration, and compounding
when the items share one object (vLLM's `get_rope` returns one cached rotary embedding to every layer, so
`layer.self_attn.rotary_emb.rotary_dim //= 2` per layer halved it once per layer)."""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_edit

from speedtrap.triage import PatchReport

MODEL = """\
from torch import nn


class Rotary(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.rotary_dim = dim

    def forward(self, q):
        return q[..., : self.rotary_dim]


class Layer(nn.Module):
    def __init__(self, rotary):
        super().__init__()
        self.rotary_emb = rotary

    def forward(self, x):
        return self.rotary_emb(x)


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        shared = Rotary(64)
        self.layers = nn.ModuleList([Layer(shared) for _ in range(n)])
        self.calls = 0
        for layer in self.layers:
            layer.rotary_emb.is_neox_style = False

    def forward(self, x):
        total = 0
        for layer in self.layers:
            x = layer(x)
        return x
"""

REL = "pkg/models/glm.py"
LOOP = "            layer.rotary_emb.is_neox_style = False\n"


def _report(tmp_path: Path, old: str, new: str) -> PatchReport:
    return triage_edit(tmp_path, REL, MODEL, old, new)


def test_an_in_place_update_through_the_loop_variable_is_a_scale_change(tmp_path: Path) -> None:
    p = _report(tmp_path, LOOP, LOOP + "            layer.rotary_emb.rotary_dim //= 2\n")
    first = p.ranking.in_full[0]
    assert (
        "updates `layer.rotary_emb.rotary_dim //= 2` in place inside `for layer in self.layers` (Model.__init__)"
        in first
    )
    assert "once per item to an object the items share" in first
    assert p.tier == 1


def test_other_in_place_updates_are_not(tmp_path: Path) -> None:
    local = _report(tmp_path / "a", "            x = layer(x)\n", "            x = layer(x)\n            total += 1\n")
    own = _report(tmp_path / "b", LOOP, LOOP + "            self.calls += 1\n")
    for p in (local, own):
        assert not any("in place inside" in r for r in p.ranking.reasons)
