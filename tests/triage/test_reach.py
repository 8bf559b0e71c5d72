"""Reachability from the served model: a change in another model's file ranks below one the model runs,
and the report says which is which (model named by class, by config.json, or by its folder)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from speedtrap._errors import UsageError
from speedtrap.triage import from_diff_files, triage

FILES = {
    "pkg/__init__.py": "",
    "pkg/layers/__init__.py": "",
    "pkg/layers/moe.py": "def moe(x, scale):\n    return x * scale\n",
    "pkg/models/__init__.py": "",
    "pkg/models/llama.py": "from pkg.layers.moe import moe\n\n\nclass LlamaForCausalLM:\n    def forward(self, x):\n"
    "        return moe(x, 1.0)\n",
    "pkg/models/qwen.py": "class QwenForCausalLM:\n    def forward(self, x):\n        return x + 1\n",
}


def _diff(rel: str, old: str, new: str, out: Path) -> Path:
    before = textwrap.dedent(FILES[rel])
    assert before.count(old) == 1
    after = before.replace(old, new)
    import difflib

    out.write_text(
        "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    )
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("how", ["class", "config", "folder"])
def test_the_served_models_change_ranks_above_another_models(tree: Path, tmp_path: Path, how: str) -> None:
    other = _diff("pkg/models/qwen.py", "return x + 1", "return x + 2", tmp_path / "other.diff")
    mine = _diff("pkg/layers/moe.py", "return x * scale", "return x * scale + 0", tmp_path / "mine.diff")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    model = {"class": "LlamaForCausalLM", "config": str(folder / "config.json"), "folder": str(folder)}[how]
    report = triage(from_diff_files([other, mine], tree), None, model)
    assert [p.name for p in report.patches] == ["mine", "other"]
    other_p = report.patches[1]
    assert other_p.tier == 3
    assert other_p.ranking.reasons[0].startswith(
        "not reachable from the served model LlamaForCausalLM: pkg/models/qwen.py is not imported by "
        "pkg/models/llama.py"
    )
    assert any("reachable from the served model LlamaForCausalLM" in r for r in report.patches[0].ranking.reasons)
    # without the model both are tier 2
    assert {p.tier for p in triage(from_diff_files([other, mine], tree)).patches} == {2}


def test_an_unknown_model_is_a_usage_error(tree: Path, tmp_path: Path) -> None:
    d = _diff("pkg/models/qwen.py", "return x + 1", "return x + 2", tmp_path / "o.diff")
    with pytest.raises(UsageError, match="no class GPT in the tree"):
        triage(from_diff_files([d], tree), None, "GPT")
