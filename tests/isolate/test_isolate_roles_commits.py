"""A commit patch split per role: each role runs the worktree of its own commits (examples/sglang-pd's case).

Ground truth is each role's process as the kernel shows it: the first folder of its ``PYTHONPATH`` and its
working directory (``/proc/PID/environ``, ``/proc/PID/cwd``), and the file the commit changes, read there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from test_isolate_roles import _environ, _server_pid, pd_roles, started, write_stack

from speedtrap.manifest import load_manifest
from speedtrap.stack import Launcher


def _git(repo: Path, *args: str) -> str:
    env_args = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", "-C", str(repo), *env_args, *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "src"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    (root / "moe.py").write_text("SCALE = 1.0\n")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "base")
    base = _git(root, "rev-parse", "HEAD").strip()
    (root / "moe.py").write_text("SCALE = 2.5  # fused twice\n")
    _git(root, "commit", "-q", "-am", "fuse the scale")
    return root, base, _git(root, "rev-parse", "HEAD").strip()


def _code(pid: int) -> tuple[str, str]:
    """What the role imports first (its PYTHONPATH's first folder) and where it runs."""
    first = Path(_environ(pid)["PYTHONPATH"].split(":")[0])
    return (first / "moe.py").read_text().split()[2], str(Path(f"/proc/{pid}/cwd").resolve())


def test_a_split_commit_runs_in_its_role_only(tmp_path: Path, repo: tuple[Path, str, str]) -> None:
    root, base, sha = repo
    patches = [{"name": "fuse", "commit": sha, "split": True}]
    target = {"repo": str(root), "base": base, "env": {"TINY_EVENTS": str(tmp_path / "events.txt"), "PYTHONPATH": "/x"}}
    path = write_stack(tmp_path, pd_roles(), patches, target)
    manifest = load_manifest(path)
    assert [p.name for p in manifest.patches] == ["fuse@prefill", "fuse@decode"]
    launcher = Launcher(manifest.target, manifest.patches)
    assert launcher.roles_of(("fuse@prefill",)) == ("prefill",)
    assert launcher.roles_of(("fuse@decode", "fuse@prefill")) == ("prefill", "decode")
    for config, patched in [(("fuse@prefill",), {"prefill"}), (("fuse@decode", "fuse@prefill"), {"prefill", "decode"})]:
        with started(path, config, tmp_path) as stack:
            seen = {role: _code(_server_pid(pid)) for role, pid in stack.pids().items()}
            assert {r for r, (scale, _) in seen.items() if scale == "2.5"} == patched, seen
            for role, (_, cwd) in seen.items():
                first = _environ(_server_pid(stack.pids()[role]))["PYTHONPATH"].split(":")
                assert cwd == str(Path(first[0]).resolve()) and first[-1] == "/x", (role, first)  # target.env kept


def test_inspect_reads_a_commit_patch_back_from_each_roles_worktree(
    tmp_path: Path, repo: tuple[Path, str, str]
) -> None:
    """``inspect --manifest``: a commit patch is on in a role when the worktree first on that process's
    PYTHONPATH holds its commit; checked against the file the commit changes, read in that folder."""
    from typer.testing import CliRunner

    from speedtrap.cli import app

    root, base, sha = repo
    patches = [{"name": "fuse", "commit": sha, "split": True}]
    path = write_stack(tmp_path, pd_roles(), patches, {"repo": str(root), "base": base})
    with started(path, ("fuse@prefill",), tmp_path) as stack:
        seen = {role: _code(_server_pid(pid))[0] for role, pid in stack.pids().items() if role != "router"}
        out = CliRunner().invoke(app, ["inspect", "--manifest", str(path), "--json"])
    assert out.exit_code == 0, out.output
    by_role = {r["role"]: r for r in json.loads(out.output)["roles"]}
    assert seen == {"prefill": "2.5", "decode": "1.0"}  # the kernel's view: the prefill alone runs the commit
    assert by_role["prefill"]["patches_on"] == ["fuse@prefill"] and by_role["decode"]["patches_on"] == []
    (gate,) = by_role["decode"]["gates"]
    assert gate["patch"] == "fuse@decode" and gate["state"] == "off" and sha[:12] in gate["evidence"]
