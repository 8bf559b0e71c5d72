"""Patch sources (diff files, a git range, a manifest) and the one-line errors on bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtrap._errors import ManifestError, PatchError, UsageError
from speedtrap.cli import app
from speedtrap.manifest import load_manifest
from speedtrap.triage import from_diff_files, from_git_range, from_manifest, render_plan, triage

BASE = textwrap.dedent(
    """\
    import os
    import torch


    class Layer(torch.nn.Module):
        def __init__(self, scale_factor):
            super().__init__()
            self.scale_factor = scale_factor
            assert not os.environ.get("FAST"), "not implemented"

        def forward(self, x):
            return x.float() @ x.float().T


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Layer(2.0) for _ in range(4))
    """
)

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo: Path, *args: str) -> str:
    env_args = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", "-C", str(repo), *env_args, *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "net.py").write_text(BASE)
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "base")
    git(root, "tag", "base")
    (root / "net.py").write_text(BASE.replace("x.float() @ x.float().T", "x.bfloat16() @ x.bfloat16().T"))
    git(root, "commit", "-q", "-am", "bf16 matmul in every layer")
    text = (root / "net.py").read_text()
    (root / "net.py").write_text(
        text.replace(
            '        assert not os.environ.get("FAST"), "not implemented"\n', "        self.fast = True\n"
        ).replace(
            "        return x.bfloat16()",
            "        if self.fast:\n            x = x * self.scale_factor\n        return x.bfloat16()",
        )
    )
    (root / "logo.png").write_bytes(b"\x89PNG\x00\x01")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "fast path: real logic instead of the assert")
    return root


@needs_git
def test_git_range_one_patch_per_commit(repo: Path) -> None:
    patch_set = from_git_range(repo, "base..main", None)
    try:
        assert [p.summary for p in patch_set.patches] == [
            "bf16 matmul in every layer",
            "fast path: real logic instead of the assert",
        ]
        assert patch_set.tree is not None and (patch_set.tree / "net.py").read_text() == BASE
        report = triage(patch_set)
    finally:
        patch_set.close()
    by = {p.patch.summary: p for p in report.patches}
    bf16 = by["bf16 matmul in every layer"]
    assert bf16.tier == 1 and bf16.signals.best_hot_path is not None
    assert bf16.signals.best_hot_path.level == "every layer"
    fast = by["fast path: real logic instead of the assert"]
    kinds = {s.kind for s in fast.signals.signals}
    assert {"guard", "scale"} <= kinds and fast.tier == 1
    assert fast.gate.kind == "ungated"
    plan = render_plan(report)
    assert f"`git revert {fast.patch.origin.split()[1]}` and rebuild" in plan
    assert any("applies on top of the earlier patches" in n for n in fast.notes)


@needs_git
@pytest.mark.parametrize(
    ("repo_arg", "rng", "needle"),
    [
        ("missing", "a..b", "does not exist"),
        ("plain", "a..b", "is not a git repository"),
        ("repo", "base", "is not of the form A..B"),
        ("repo", "base..nope", "revision 'nope' is not a commit"),
        ("repo", "--upload-pack=x..main", "bad revision"),
        ("repo", "main..main", "holds no commits"),
    ],
)
def test_git_range_errors(repo: Path, tmp_path: Path, repo_arg: str, rng: str, needle: str) -> None:
    (tmp_path / "plain").mkdir()
    path = {"missing": tmp_path / "nope", "plain": tmp_path / "plain", "repo": repo}[repo_arg]
    with pytest.raises(UsageError, match=needle):
        from_git_range(path, rng, None)


def test_manifest_with_diffs_env_args_and_ungated(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "net.py").write_text(BASE)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "bf16.diff").write_text(
        "--- a/net.py\n+++ b/net.py\n@@ -11,2 +11,2 @@\n     def forward(self, x):\n"
        "-        return x.float() @ x.float().T\n+        return x.half() @ x.half().T\n"
    )
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(
        textwrap.dedent(
            """\
        tree = "src"
        [[patches]]
        name = "half_matmul"
        env = { FAST_HALF = "1" }
        diff = "p/bf16.diff"
        [[patches]]
        name = "chunked"
        args = ["--chunked-prefill-size", "256"]
        [[patches]]
        name = "baked_in"
        gate = "ungated"
        """
        )
    )
    patch_set = from_manifest(load_manifest(manifest), None)
    assert patch_set.tree == tmp_path / "src"
    report = triage(patch_set)
    by = {p.name: p for p in report.patches}
    assert by["half_matmul"].tier == 1 and by["half_matmul"].gate.env == (("FAST_HALF", "1"),)
    assert by["chunked"].gate.args == ("--chunked-prefill-size", "256")
    assert by["baked_in"].gate.kind == "ungated" and "no diff" in by["baked_in"].notes[0]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[[patches]]\nenv = { A = '1' }\n", r"patches\[0\].name is missing"),
        ("[[patches]]\nname = 'a'\nenv = 'A=1'\n", r"patches\[0\].env must be a table"),
        ("[[patches]]\nname = 'a'\nargs = '--x'\n", r"patches\[0\].args must be a list"),
        ("[[patches]]\nname = 'a'\n[[patches]]\nname = 'a'\n", "is used twice"),
        ("[[patches]]\nname = 'a'\ngate = 'maybe'\n", "gate must be"),
        ("name = 'x'\n", "unknown table 'name'"),
        ("tree = 'x'\n", "has no \\[target\\]"),
        ("[[patches]\n", "not valid TOML"),
    ],
)
def test_bad_manifests(tmp_path: Path, body: str, needle: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(body)
    with pytest.raises(ManifestError, match=needle):
        load_manifest(path)


def test_diff_that_does_not_apply_to_the_tree(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "net.py").write_text(BASE.replace("x.float() @ x.float().T", "x @ x.T"))
    diff = tmp_path / "p.diff"
    diff.write_text(
        "--- a/net.py\n+++ b/net.py\n@@ -11,2 +11,2 @@\n     def forward(self, x):\n"
        "-        return x.float() @ x.float().T\n+        return x.half() @ x.half().T\n"
    )
    with pytest.raises(PatchError, match=r"does not apply to net\.py"):
        triage(from_diff_files([diff], tree))
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(PatchError, match=r"changes net\.py, which is not in"):
        triage(from_diff_files([diff], other))


def test_diff_without_a_tree_is_read_alone(tmp_path: Path) -> None:
    diff = tmp_path / "p.diff"
    diff.write_text(
        "--- a/net.py\n+++ b/net.py\n@@ -11,2 +11,2 @@\n     def forward(self, x):\n"
        "-        return x.float() @ x.float().T\n+        return x.half() @ x.half().T\n"
    )
    report = triage(from_diff_files([diff], None))
    assert report.warnings
    [precision] = [s for s in report.patches[0].signals.signals if s.kind == "precision"]
    assert precision.method == "text" and precision.evidence[0].line == 12


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--patch", "{tmp}/missing.diff"], "does not exist"),
        (["--patch", "{tmp}/binary.diff"], "is binary"),
        (["--patch", "{tmp}/malformed.diff"], "malformed diff at line 5"),
        (["--patch", "{tmp}/empty.diff"], "holds no unified diff"),
        (["--range", "a..b", "--repo", "{tmp}/nope"], "does not exist"),
        (["--range", "a..b"], "--range needs --repo"),
        (["--target", "smol-moe", "--manifest", "{tmp}/m.toml"], "choose one patch source"),
        (["--target", "nope"], "unknown target 'nope'"),
        (["--manifest", "{tmp}/missing.toml"], "does not exist"),
        ([], "no patches given"),
        (["--patch", "{tmp}/ok.diff", "--tree", "{tmp}/missing"], "is not a directory"),
    ],
)
def test_cli_bad_input_one_line_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "binary.diff").write_bytes(b"\x7fELF\x02\x01\x00\x00\x00")
    (tmp_path / "malformed.diff").write_text("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n*b\n")
    (tmp_path / "empty.diff").write_text("")
    (tmp_path / "ok.diff").write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    result = CliRunner().invoke(app, ["triage", *(a.format(tmp=tmp_path) for a in args)])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output and result.output.count("error:") == 1


def test_cli_trace_only(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(BASE)
    result = CliRunner().invoke(app, ["triage", "--tree", str(tmp_path), "--symbol", "scale_factor", "--json"])
    assert result.exit_code == 0, result.output
    sites = json.loads(result.stdout)["trace"]["sites"]
    assert {(s["function"], s["role"]) for s in sites} == {("Layer.__init__", "configure")}


@needs_git
def test_cli_git_range_prints_the_plan(repo: Path) -> None:
    result = CliRunner().invoke(app, ["triage", "--range", "base..main", "--repo", str(repo), "--plan", "-"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Triage plan: 2 commit(s) base..main")
    assert "`speedtrap triage --range base..main --repo" in result.stdout and "git revert" in result.stdout


@needs_git
def test_a_manifest_whose_tree_links_compiled_files_by_absolute_path(repo: Path, tmp_path: Path) -> None:
    """The SGLang examples link the wheel's .so files by absolute path: triage reads the tree without them
    (tarfile's "data" filter refused such a link with a traceback before)."""
    (repo / "ext.so").symlink_to("/bin/true")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "an extension linked by absolute path")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "net.py").write_text((repo / "net.py").read_text() + "\nFACTOR = 2.0\n")
    git(repo, "commit", "-q", "-am", "a factor")
    head = git(repo, "rev-parse", "HEAD").strip()
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(
        f'[target]\nlaunch = ["x", "--port", "{{port}}"]\nrepo = "{repo}"\nbase = "{base}"\n\n'
        f'[[patches]]\nname = "factor"\ncommit = "{head}"\n'
    )
    patch_set = from_manifest(load_manifest(manifest), None)
    try:
        assert patch_set.tree is not None and (patch_set.tree / "net.py").is_file()
        assert not (patch_set.tree / "ext.so").exists()
        assert [p.name for p in patch_set.patches] == ["factor"]
    finally:
        patch_set.close()
