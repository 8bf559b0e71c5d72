"""A commit split per role (``split = true``: ``name@prefill``, ``name@decode``) is one change to the tree.

Found on the SGLang PD example read by ``speedtrap init --pid``: the second commit edits a line the first
one added, and triage laid each role's copy of a commit on top of the other, so the later commit's
second copy no longer applied ("the diff does not apply ... with the earlier patches applied") and
``speedtrap run`` failed its triage stage. Ground truth by construction: the two commits below apply in
history order (git made them).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from typer.testing import CliRunner

from speedtrap.cli import app


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


def test_a_split_commit_after_one_it_edits_is_laid_once_per_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    body = "".join(f"def f{i}(x):\n    return x * {i}\n\n\n" for i in range(8))
    (repo / "pkg" / "mod.py").write_text(body)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD")
    shas = []
    for old, new, subject in (
        ("def f4(x):\n", "# f4: the fourth.\ndef f4(x):\n", "mod: say what f4 is"),
        ("# f4: the fourth.\n", "# f4: the fourth (and last but three).\n", "mod: say more of f4"),
    ):
        path = repo / "pkg" / "mod.py"
        path.write_text(path.read_text().replace(old, new))
        _git(repo, "commit", "-q", "-am", subject)
        shas.append(_git(repo, "rev-parse", "HEAD"))
    roles = "".join(
        f'[target.roles.{r}]\nlaunch = ["python", "-m", "x", "--port", "{{port}}"]\n'
        + ("entry = true\n" if r == "decode" else "")
        + "\n"
        for r in ("prefill", "decode")
    )
    patches = "".join(f'[[patches]]\nname = "c{i}"\ncommit = "{sha}"\nsplit = true\n\n' for i, sha in enumerate(shas))
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(f'[target]\nrepo = "{repo}"\nbase = "{base}"\n\n{roles}{patches}')
    result = CliRunner().invoke(app, ["triage", "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    for name in ("c0@prefill", "c0@decode", "c1@prefill", "c1@decode"):
        assert name in result.output
