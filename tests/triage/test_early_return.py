"""An early return of the unscaled value removed (``if c: return base`` taken out of a function that later returns
``base * mscale * mscale``) is a scale signal: the cases ``c`` selected now get the scaled value. The function is
a trimmed copy of SGLang 0.5.23's ``compute_mla_mscale_scaling`` (``configs/model_config.py``), the shape of
sglang#26203; the caller builds it once per attention layer, as ``DeepseekV2AttentionMLA.__init__`` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _triage_one import triage_one_report

from speedtrap.triage import PatchReport

MODEL = """\
import math


def yarn_get_mscale(scale: float = 1, mscale: float = 1) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def compute_mla_mscale_scaling(rope_scaling: dict, base_scaling: float) -> float:
    rope_type = rope_scaling.get("rope_type") or rope_scaling.get("type")
    if rope_type == "default":
        return base_scaling

    if not rope_scaling.get("apply_yarn_scaling", True):
        return base_scaling

    mscale_all_dim = rope_scaling.get("mscale_all_dim", False)
    scaling_factor = rope_scaling.get("factor", 1.0)
    mscale = yarn_get_mscale(scaling_factor, float(mscale_all_dim))
    return base_scaling * mscale * mscale


def describe(rope_scaling: dict, name: str) -> str:
    if not rope_scaling:
        return name
    return name + str(len(rope_scaling))


class Attention:
    def __init__(self, config, head_dim):
        self.scaling = head_dim**-0.5
        if config.rope_scaling:
            self.scaling = compute_mla_mscale_scaling(config.rope_scaling, self.scaling)

    def forward(self, q, k):
        return (q @ k) * self.scaling
"""

DISABLED = '    if not rope_scaling.get("apply_yarn_scaling", True):\n        return base_scaling\n\n'


def run(tmp_path: Path, old: str, new: str) -> PatchReport:
    return triage_one_report(tmp_path, "pkg/m.py", MODEL, MODEL.replace(old, new))


def test_an_early_return_of_the_unscaled_value_removed_is_a_scale_change(tmp_path: Path) -> None:
    report = run(tmp_path, DISABLED, "")
    said = report.ranking.in_full[0]
    assert report.tier == 1, report.ranking.reasons
    assert "removes the early return" in said and "`return base_scaling * mscale * mscale`" in said, said
    assert "scaled by mscale" in said and "pkg/m.py:18" in said, said


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # the early return's condition kept, only reworded: still there
        (
            '    if not rope_scaling.get("apply_yarn_scaling", True):\n',
            '    if not rope_scaling.get("apply_yarn_scaling", True) :\n',
        ),
        # an early return removed whose value the function does not scale later
        ("    if not rope_scaling:\n        return name\n", ""),
    ],
)
def test_no_early_return_claim_without_a_scaled_return(tmp_path: Path, old: str, new: str) -> None:
    report = run(tmp_path, old, new)
    assert not any("removes the early return" in r for r in report.ranking.reasons), report.ranking.reasons
