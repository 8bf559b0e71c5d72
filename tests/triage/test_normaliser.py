"""A multiply or divide by a normaliser (a root or inverse power of a size: ``hidden_size**-0.5``,
``1.0 / (d ** 0.5)``, ``torch.rsqrt(v)``) is a scale signal named by its text, added, removed or changed;
an integer power or a plain constant is not."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from speedtrap.triage import PatchReport, from_diff_files, triage

MODEL = """\
import torch


class Embed:
    def __init__(self, config):
        self.config = config

    def embed(self, x):
        y = self.project(x)
        return y

    def attend(self, query, sm_scale=None):
        if sm_scale is None:
            sm_scale = 1.0 / (query.shape[2] ** 0.5)
        return query * sm_scale
"""


def run(tmp_path: Path, old: str, new: str) -> PatchReport:
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "m.py").write_text(MODEL)
    after = MODEL.replace(old, new)
    assert after != MODEL
    diff = difflib.unified_diff(MODEL.splitlines(True), after.splitlines(True), "a/pkg/m.py", "b/pkg/m.py")
    (tmp_path / "p.diff").write_text("".join(diff))
    [report] = triage(from_diff_files([tmp_path / "p.diff"], root)).patches
    return report


def scale_summaries(report: PatchReport) -> list[str]:
    return [s.summary for s in report.signals.of("scale")]


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "        return y\n",
            "        y = y * (self.config.hidden_size**-0.5)\n        return y\n",
            "adds a multiply by self.config.hidden_size ** (-0.5) in Embed.embed",
        ),
        (
            "        return y\n",
            "        y = y / torch.sqrt(y.shape[-1])\n        return y\n",
            "adds a divide by torch.sqrt(y.shape[-1])",
        ),
        ("query.shape[2] ** 0.5", "query.shape[1] ** 0.5", "adds a divide by query.shape[1] ** 0.5"),
    ],
)
def test_a_normaliser_is_a_scale_signal(tmp_path: Path, old: str, new: str, said: str) -> None:
    report = run(tmp_path, old, new)
    assert any(s.startswith(said) for s in scale_summaries(report)), scale_summaries(report)
    assert report.tier <= 2


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("        return y\n", "        y = y * (self.config.hidden_size**2)\n        return y\n"),
        ("        return y\n", "        y = y * 2.0\n        return y\n"),
    ],
)
def test_an_integer_power_or_a_constant_is_not_a_normaliser(tmp_path: Path, old: str, new: str) -> None:
    assert scale_summaries(run(tmp_path, old, new)) == []
