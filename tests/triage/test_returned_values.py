"""A factor swapped for its identity (or back) in a value a function returns, whole or as an item of a
returned tuple: the callers receive the identity where they received the factor (the shape of a
backend's ``_get_bmm_scales`` returning ``(bmm1_scale, v_scale)`` to an attention kernel)."""

from __future__ import annotations

import difflib
from pathlib import Path

from speedtrap.triage import PatchReport, from_diff_files, triage
from speedtrap.triage.ranking.rank import FORWARD

BACKEND = """\
from some_kernels import decode_kernel


class Backend:
    def _scalar(self, layer, name):
        return getattr(layer, name, None) or 1.0

    def _get_bmm_scales(self, layer):
        q_scale = 1.0
        k_scale = self._scalar(layer, "k_scale")
        v_scale = self._scalar(layer, "v_scale")
        return q_scale * k_scale * layer.scaling, v_scale

    def forward_decode(self, q, kv, layer):
        bmm1_scale, bmm2_scale = self._get_bmm_scales(layer)
        return decode_kernel(q, kv, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale)
"""


def _run(tmp_path: Path, before: str, after: str, symbol: str | None = None) -> PatchReport:
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "backend.py").write_text(before)
    diff = difflib.unified_diff(before.splitlines(True), after.splitlines(True), "a/pkg/backend.py", "b/pkg/backend.py")
    (tmp_path / "p.diff").write_text("".join(diff))
    [report] = triage(from_diff_files([tmp_path / "p.diff"], root), symbol).patches
    return report


def test_factor_replaced_by_identity_in_a_returned_tuple(tmp_path: Path) -> None:
    after = BACKEND.replace(
        '        v_scale = self._scalar(layer, "v_scale")\n        return q_scale * k_scale * layer.scaling, v_scale\n',
        "        return q_scale * k_scale * layer.scaling, 1.0\n",
    )
    report = _run(tmp_path, BACKEND, after, "v_scale")
    assert report.tier <= 2
    assert not report.ranking.reasons[0].startswith(FORWARD)
    assert "replaces v_scale by 1.0" in report.ranking.reasons[0]
    assert "item 2 of the tuple Backend._get_bmm_scales returns" in report.ranking.reasons[0]
    line = after.split("\n").index("        return q_scale * k_scale * layer.scaling, 1.0") + 1
    assert any(f"pkg/backend.py:{line}" in m and "callers now receive the identity" in m for m in report.missing)


def test_identity_replaced_by_a_factor_in_a_returned_value(tmp_path: Path) -> None:
    before = BACKEND.replace(
        "        return q_scale * k_scale * layer.scaling, v_scale\n", "        return 1.0, v_scale\n"
    )
    after = BACKEND.replace(
        "        return q_scale * k_scale * layer.scaling, v_scale\n", "        return layer.attn_scaling, v_scale\n"
    )
    report = _run(tmp_path, before, after)
    assert "identity literal replaced: attn_scaling now flows" in report.ranking.reasons[0]


def test_a_returned_value_that_is_no_factor_is_not_a_scale_change(tmp_path: Path) -> None:
    before = BACKEND + "\n    def block_size(self):\n        return 1\n"
    after = BACKEND + "\n    def block_size(self):\n        return self.page\n"
    report = _run(tmp_path, before, after)
    assert report.ranking.reasons[0].startswith(FORWARD)


def test_a_returned_tuple_rewritten_equal_stays_same_math(tmp_path: Path) -> None:
    after = BACKEND.replace(
        "        return q_scale * k_scale * layer.scaling, v_scale\n",
        "        return (q_scale * k_scale * layer.scaling, v_scale)\n",
    )
    report = _run(tmp_path, BACKEND, after)
    assert report.tier == 3
