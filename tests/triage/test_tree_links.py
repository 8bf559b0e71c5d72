"""A tree holding symbolic links out of itself (an absolute link to a compiled ``.so`` in a venv, a relative one
climbing out) is read, not a crash: through ``speedtrap triage --manifest`` on a git repository's commit, and as
a ``--tree`` directory. A link out of the tree is never followed; a link inside it is kept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtrap.cli import app

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

NET = textwrap.dedent(
    """\
    import torch


    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale_factor = 2.0

        def forward(self, x):
            return x.float() @ x.float().T
    """
)
SECRET = "outside_the_tree_marker = 1\n"


def _git(repo: Path, *args: str) -> str:
    env_args = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", "-C", str(repo), *env_args, *args], check=True, capture_output=True, text=True).stdout


def _repo_with_links(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository whose tree links out (absolute and relative) and in; its base and one commit on it."""
    outside = tmp_path / "venv" / "lib"
    outside.mkdir(parents=True)
    (outside / "_kernels.so").write_bytes(b"\x7fELF\x02\x01")
    (outside / "leak.py").write_text(SECRET)
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "pkg" / "net.py").write_text(NET)
    os.symlink(outside / "_kernels.so", repo / "pkg" / "_kernels.so")  # absolute, out of the tree
    os.symlink(str(outside / "leak.py"), repo / "pkg" / "leak_abs.py")  # absolute, a Python file
    os.symlink("../../venv/lib/leak.py", repo / "pkg" / "leak_rel.py")  # relative, climbing out
    os.symlink("net.py", repo / "pkg" / "alias.py")  # inside the tree
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "pkg" / "net.py").write_text(NET.replace("x.float() @ x.float().T", "x.half() @ x.half().T"))
    _git(repo, "commit", "-q", "-am", "half matmul")
    return repo, base, _git(repo, "rev-parse", "HEAD").strip()


def test_triage_manifest_on_a_repo_with_links_out_of_the_tree(tmp_path: Path) -> None:
    repo, base, head = _repo_with_links(tmp_path)
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(
        f'[target]\nrepo = "{repo}"\nbase = "{base}"\n\n[[patches]]\nname = "half"\ncommit = "{head}"\n'
    )
    result = CliRunner().invoke(app, ["triage", "--manifest", str(manifest), "--symbol", "outside_the_tree_marker"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(
        app, ["triage", "--manifest", str(manifest), "--symbol", "outside_the_tree_marker", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (patch,) = data["patches"]
    assert patch["name"] == "half" and patch["tier"] in (1, 2)  # the change itself was read
    assert data["trace"]["sites"] == []  # the file behind the links out was never read


def test_a_tree_directory_with_links_out_is_read_without_following_them(tmp_path: Path) -> None:
    repo, _, _ = _repo_with_links(tmp_path)
    result = CliRunner().invoke(app, ["triage", "--tree", str(repo), "--symbol", "outside_the_tree_marker", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["trace"]["sites"] == []
    inside = CliRunner().invoke(app, ["triage", "--tree", str(repo), "--symbol", "scale_factor", "--json"])
    files = {s["file"] for s in json.loads(inside.stdout)["trace"]["sites"]}
    assert files == {"pkg/net.py", "pkg/alias.py"}  # the link inside the tree is kept


def test_inspect_manifest_on_a_repo_with_links_out_of_the_tree(tmp_path: Path) -> None:
    repo, base, head = _repo_with_links(tmp_path)
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(
        f'[target]\nrepo = "{repo}"\nbase = "{base}"\n\n[[patches]]\nname = "half"\ncommit = "{head}"\n'
    )
    result = CliRunner().invoke(app, ["inspect", "--pid", str(os.getpid()), "--manifest", str(manifest), "--json"])
    assert result.exit_code == 0, result.output
    assert "gates" in json.loads(result.stdout)  # read: the commit patch has no switch, so no gate to compare
