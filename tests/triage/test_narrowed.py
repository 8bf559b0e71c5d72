"""A condition made strictly narrower (an alternative dropped, a conjunct added): the cases it no longer
covers take the other path. The mirror of a widened condition, read with the same implication check
(`implies`, sound on the and/or tree): a fix that adds a fallback arm, reversed, narrows."""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_edit, triage_one_report

from speedtrap.triage import PatchReport

MODEL = """\
import torch
from torch import nn


def persistent_kernel(x):
    return x * 2


def fallback_kernel(x):
    return x + x


class Attention(nn.Module):
    def __init__(self, num_heads, kv_dtype):
        super().__init__()
        self.num_heads = num_heads
        self.use_persistent = True
        if (num_heads == 16 and kv_dtype != "fp8") or num_heads == 128:
            self.use_persistent = False

    def forward(self, x):
        if (x.dtype == torch.float16 and self.num_heads == 16) or self.num_heads == 128:
            return fallback_kernel(x)
        return persistent_kernel(x)


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList([Attention(16, "bf16") for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
"""

REL = "pkg/models/attn.py"


def _report(tmp_path: Path, old: str, new: str) -> PatchReport:
    return triage_edit(tmp_path, REL, MODEL, old, new)


def test_an_alternative_dropped_from_a_kernel_selection_in_forward_is_tier_one(tmp_path: Path) -> None:
    p = _report(
        tmp_path,
        "if (x.dtype == torch.float16 and self.num_heads == 16) or self.num_heads == 128:",
        "if x.dtype == torch.float16 and self.num_heads == 16:",
    )
    assert p.tier == 1
    first = p.ranking.in_full[0]
    assert first.startswith("drops the alternative `self.num_heads == 128` from")
    assert "the cases it no longer covers take the other path" in first
    assert "no known risky pattern" not in "\n".join(p.ranking.reasons)


def test_a_conjunct_added_narrows(tmp_path: Path) -> None:
    p = _report(
        tmp_path,
        "if (x.dtype == torch.float16 and self.num_heads == 16) or self.num_heads == 128:",
        "if ((x.dtype == torch.float16 and self.num_heads == 16) or self.num_heads == 128) and x.is_contiguous():",
    )
    assert p.ranking.reasons[0].startswith("narrows `")
    assert p.tier == 1


def test_a_reordered_condition_is_not_narrowed(tmp_path: Path) -> None:
    p = _report(
        tmp_path,
        "if (x.dtype == torch.float16 and self.num_heads == 16) or self.num_heads == 128:",
        "if self.num_heads == 128 or (x.dtype == torch.float16 and self.num_heads == 16):",
    )
    reasons = "\n".join(p.ranking.reasons)
    assert "narrows" not in reasons and "drops the alternative" not in reasons


def test_a_narrowed_selection_in_the_constructor_is_read_where_forward_reads_what_it_sets(tmp_path: Path) -> None:
    # The condition picks self.use_persistent; forward does not read it here, so it stays construction code,
    # but a selection changed at construction is still read at run time (exposure 1).
    p = _report(
        tmp_path,
        'if (num_heads == 16 and kv_dtype != "fp8") or num_heads == 128:',
        'if num_heads == 16 and kv_dtype != "fp8":',
    )
    assert p.ranking.reasons[0].startswith("drops the alternative `num_heads == 128`")
    assert p.ranking.points["exposure"] == 1
    hot = p.signals.best_hot_path
    assert hot is not None and hot.level == "setup"
    read = MODEL.replace("return persistent_kernel(x)", "return persistent_kernel(x) if self.use_persistent else x")
    before = read.replace('if (num_heads == 16 and kv_dtype != "fp8") or num_heads == 128:', "if True:")
    assert before != read
    q = triage_one_report(
        tmp_path / "q",
        REL,
        read,
        read.replace(
            'if (num_heads == 16 and kv_dtype != "fp8") or num_heads == 128:',
            'if num_heads == 16 and kv_dtype != "fp8":',
        ),
    )
    hot = q.signals.best_hot_path
    assert hot is not None and hot.level == "every layer" and hot.reader == "self.use_persistent in Attention.forward"
    assert q.tier == 1
