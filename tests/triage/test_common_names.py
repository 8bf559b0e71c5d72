"""A multiply or divide removed whose factor is a common word (``factor``, named in hundreds of files) is checked in
the changed files only: its whole-tree sites are not one quantity, and tracing them all cost 20 s of CPU on SGLang
0.5.23 for one patch. The warning says the search was limited instead of "applied nowhere now".

The changed file is a trimmed copy of SGLang 0.5.23's ``configs/laguna.py`` (``_to_sglang_rope_scaling``); the
other files each use a local ``factor`` of their own.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from speedtrap.triage import from_diff_files, triage
from speedtrap.triage.flow.applied_count import _WIDE

LAGUNA = """\
from typing import Any, Dict, Optional


def yarn_get_mscale_simple(scale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * scale + 1.0


def _to_sglang_rope_scaling(rope_params: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    out: Dict[str, Any] = {"rope_type": rope_params.get("rope_type")}
    if "attention_factor" in rope_params:
        factor = float(rope_params.get("factor", 1.0) or 1.0)
        out["attn_factor"] = rope_params["attention_factor"] / factor
    return out
"""
OTHER = """\
def scaled_{i}(x, factor):
    return x * factor
"""


def _tree(root: Path, others: int) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "laguna.py").write_text(LAGUNA)
    for i in range(others):
        (root / "pkg" / f"m{i}.py").write_text(OTHER.format(i=i))
    after = LAGUNA.replace(
        '        factor = float(rope_params.get("factor", 1.0) or 1.0)\n'
        '        out["attn_factor"] = rope_params["attention_factor"] / factor\n',
        '        out["attn_factor"] = rope_params["attention_factor"]\n',
    )
    assert after != LAGUNA
    diff = difflib.unified_diff(LAGUNA.splitlines(True), after.splitlines(True), "a/pkg/laguna.py", "b/pkg/laguna.py")
    (root / "p.diff").write_text("".join(diff))
    return root / "p.diff"


def _warnings(root: Path, others: int) -> list[str]:
    diff = _tree(root, others)
    report = triage(from_diff_files([diff], root), None)
    return list(report.patches[0].missing)


def test_a_removed_divide_by_a_common_word_is_checked_in_the_changed_files_only(tmp_path: Path) -> None:
    said = [w for w in _warnings(tmp_path / "tree", _WIDE + 1) if "removes" in w and "factor" in w]
    assert said, "the removed divide is still warned about"
    assert all("too many to trace" in w and "applied nowhere" not in w for w in said), said


def test_a_rare_name_is_still_traced_across_the_tree(tmp_path: Path) -> None:
    said = [w for w in _warnings(tmp_path / "tree", 3) if "removes" in w]
    assert said and not any("too many to trace" in w for w in said), said
