"""Reachability from the served model: a change in another model's file ranks below one the model runs,
and the report says which is which (model named by class, by config.json, or by its folder)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from speedtrap._errors import UsageError
from speedtrap.manifest import load_manifest
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


def test_a_manifests_model_folder_feeds_the_same_reachability(tree: Path, tmp_path: Path) -> None:
    """``triage --manifest`` whose [target] model is a folder with a config.json ranks as ``--model`` does;
    a model the manifest names by a GGUF file names no class, so it feeds nothing."""
    from speedtrap.triage import from_manifest

    _diff("pkg/models/qwen.py", "return x + 1", "return x + 2", tmp_path / "other.diff")
    _diff("pkg/layers/moe.py", "return x * scale", "return x * scale + 0", tmp_path / "mine.diff")
    folder = tmp_path / "weights" / "llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")

    def manifest(model: str) -> Path:
        path = tmp_path / f"speedtrap-{model.replace('/', '_')}.toml"
        path.write_text(
            f'tree = "tree"\n\n[target]\nlaunch = ["srv", "--port", "{{port}}"]\nmodel = "{model}"\n\n'
            '[[patches]]\nname = "other"\ndiff = "other.diff"\ngate = "ungated"\n\n'
            '[[patches]]\nname = "mine"\ndiff = "mine.diff"\ngate = "ungated"\n'
        )
        return path

    report = triage(from_manifest(load_manifest(manifest("weights/llama")), None))
    by_name = {p.name: p for p in report.patches}
    assert [p.name for p in report.patches] == ["mine", "other"]
    assert by_name["other"].tier == 3
    assert (
        by_name["other"]
        .ranking.reasons[0]
        .startswith("not reachable from the served model LlamaForCausalLM: pkg/models/qwen.py")
    )
    # the same as naming the folder with --model on the diff files
    direct = triage(from_diff_files([tmp_path / "other.diff", tmp_path / "mine.diff"], tree), None, str(folder))
    assert [(p.name, p.tier) for p in direct.patches] == [(p.name, p.tier) for p in report.patches]
    # a GGUF model names no class: no reachability, both changes stay tier 2
    assert {p.tier for p in triage(from_manifest(load_manifest(manifest("m.gguf")), None)).patches} == {2}


def test_a_manifests_model_without_a_tree_is_a_warning_not_an_error(tmp_path: Path) -> None:
    from speedtrap.triage import from_manifest

    _diff("pkg/models/qwen.py", "return x + 1", "return x + 2", tmp_path / "other.diff")
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    path = tmp_path / "speedtrap.toml"
    path.write_text(
        '[target]\nlaunch = ["srv", "--port", "{port}"]\nmodel = "llama"\n\n'
        '[[patches]]\nname = "other"\ndiff = "other.diff"\ngate = "ungated"\n'
    )
    report = triage(from_manifest(load_manifest(path), None))
    assert any("is not used for reachability: no source tree" in w for w in report.warnings)
