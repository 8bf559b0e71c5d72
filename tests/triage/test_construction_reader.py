"""What construction code sets is exposed where forward reads it.

A changed statement in ``__init__`` runs once, but the attribute it sets (``self.scaling``, a registered
buffer) is read by the module's forward on every layer when the module is built once per layer: the
classic YaRN ``mscale`` folded into a softmax scale in the constructor. Before this, such a change was
"setup" (exposure 0) and a scale change there stayed tier 2.
"""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_edit, triage_one_report

from speedtrap.triage import PatchReport

MODEL = """\
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, head_dim, mscale):
        super().__init__()
        self.head_dim = head_dim
        self.scaling = self.head_dim ** -0.5
        self.register_buffer("bias", torch.zeros(head_dim), persistent=False)
        self.label = "attn"
        self.proj = nn.Linear(head_dim, head_dim)

    def extra_repr(self):
        return self.label

    def forward(self, q, k, v):
        w = torch.softmax(q @ k.transpose(-1, -2) * self.scaling, dim=-1)
        return self.proj(w @ v + self.bias)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention(64, 1.2)

    def forward(self, x):
        return x + self.attn(x, x, x)


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""

REL = "pkg/models/attn.py"


def _report(tmp_path: Path, old: str, new: str) -> PatchReport:
    return triage_edit(tmp_path, REL, MODEL, old, new)


def test_a_scale_folded_in_the_constructor_is_read_on_every_layer(tmp_path: Path) -> None:
    p = _report(tmp_path, "self.head_dim ** -0.5\n", "self.head_dim ** -0.5 * mscale * mscale\n")
    hot = p.signals.best_hot_path
    assert hot is not None and hot.level == "every layer" and hot.reader == "self.scaling in Attention.forward"
    assert p.tier == 1
    words = next(r for r in p.ranking.reasons if r.startswith("construction code"))
    assert "Attention.__init__ sets self.scaling, which Attention.forward reads" in words
    assert "on every layer for every token" in words


def test_a_registered_buffer_is_read_where_forward_reads_it(tmp_path: Path) -> None:
    p = _report(tmp_path, "torch.zeros(head_dim)", "torch.empty(head_dim)")
    hot = p.signals.best_hot_path
    assert hot is not None and hot.level == "every layer" and hot.reader == "self.bias in Attention.forward"


def test_an_attribute_forward_never_reads_stays_construction(tmp_path: Path) -> None:
    p = _report(tmp_path, 'self.label = "attn"', 'self.label = "attention"')
    hot = p.signals.best_hot_path
    assert hot is not None and hot.level == "setup" and not hot.reader
    assert any("changes construction code (Attention.__init__)" in r for r in p.ranking.reasons)


def test_a_submodule_built_is_not_a_read_of_its_attribute(tmp_path: Path) -> None:
    # self.proj is called in forward, not read as a value: the Linear's own code is elsewhere.
    p = _report(tmp_path, "nn.Linear(head_dim, head_dim)", "nn.Linear(head_dim, head_dim, bias=False)")
    hot = p.signals.best_hot_path
    assert hot is not None and hot.level == "setup" and not hot.reader


RUNNER = """\
class Backend:
    def __init__(self, page_size):
        self.page_size = page_size
        self.init_buffers(page_size)

    def init_buffers(self, page_size):
        self.buffers = [0] * page_size

    def init_forward_metadata(self, batch):
        self.indices = [i * self.page_size for i in batch]


class ModelRunner:
    def __init__(self):
        self.attn_backend = Backend(64)

    def forward_decode(self, batch):
        self.attn_backend.init_forward_metadata(batch)
        return batch

    def forward(self, batch):
        return self.forward_decode(batch)
"""


def test_a_method_named_like_setup_that_forward_calls_runs_every_step(tmp_path: Path) -> None:
    # `init_` names construction code, but the runner's forward calls this one through an attribute.
    rel = "pkg/backend.py"
    p = triage_one_report(tmp_path, rel, RUNNER, RUNNER.replace("i * self.page_size", "i * self.page_size + 1"))
    hot = p.signals.best_hot_path
    assert hot is not None and hot.level == "once per step"
    assert "init_forward_metadata is called from ModelRunner.forward_decode" in hot.chain[0]


def test_a_method_named_like_setup_that_only_construction_calls_stays_setup(tmp_path: Path) -> None:
    rel = "pkg/backend.py"
    p = triage_one_report(tmp_path, rel, RUNNER, RUNNER.replace("[0] * page_size", "[1] * page_size"))
    hot = p.signals.best_hot_path
    assert hot is not None and hot.level == "setup"
