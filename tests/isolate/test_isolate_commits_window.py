"""A commit window (N commits of a linear history, one tiny server per trial): bisected like git bisect.

Ground truth by construction (tests/isolate/commit_stack.py ``make_window``): which commit(s) break
the stack, and, for the revert case, that the culprit and the earlier flip do not cherry-pick
together onto the base (checked with plain ``git cherry-pick`` here, not with the code under test).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from commit_stack import TINY_PROBE, Window, git, make_window, toml_text, window_positions

from speedtrap.isolate import InteractionKind, Status, isolate
from speedtrap.manifest import load_manifest

BOUND = 0.5


def _name(i: int) -> str:
    return f"c{i:03d}"


def window_manifest(win: Window, path: Path) -> Path:
    text = toml_text(
        {
            "target": {
                "launch": [sys.executable, "-m", "stack.server", "--port", "{port}"],
                "repo": str(win.repo),
                "base": win.base,
                "health": "http://127.0.0.1:{port}/health",
                "start_timeout": 30,
                "stop_timeout": 5,
                "retries": 0,
            },
            "probe": {"kind": "command", "argv": [sys.executable, str(TINY_PROBE), "{base_url}"], "timeout": 30},
            "verdict": {"metric": "metric", "bound": BOUND, "repeats": 0},
        },
        [{"name": _name(i), "commit": sha} for i, sha in enumerate(win.shas)],
    )
    path.write_text(text)
    return path


def culprit_names(win: Window) -> set[str]:
    return {_name(win.subjects.index(s)) for s in win.culprits}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEEDTRAP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("n", [8, 32])
def test_single_culprit_within_log2_plus_one_launches(tmp_path: Path, n: int) -> None:
    win = make_window(tmp_path, n, "single")
    result = isolate(load_manifest(window_manifest(win, tmp_path / "speedtrap.toml")), tmp_path / "run")
    assert result.status is Status.FOUND, result.summary()
    assert [set(c) for c in result.culprit_names] == [culprit_names(win)]
    # Every launch counted (the baseline and HEAD too, when measured); the culprit is not the last commit.
    assert result.launches <= math.ceil(math.log2(n)) + 1, [j.config for j in result.judgements]


def test_culprit_beside_a_revert_is_found(tmp_path: Path) -> None:
    win = make_window(tmp_path, 8, "conflict")
    at = window_positions(8, "conflict")
    # By construction (plain git): the flip and the culprit do not cherry-pick together onto the base.
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(win.repo), str(clone)], check=True)
    git(clone, "checkout", "-q", "--detach", win.base)
    git(clone, "cherry-pick", win.shas[at["flip"]])
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "cherry-pick", win.shas[at["culprit"]]],
        cwd=clone, capture_output=True, check=False,
    )  # fmt: skip
    assert done.returncode != 0

    result = isolate(load_manifest(window_manifest(win, tmp_path / "speedtrap.toml")), tmp_path / "run")
    assert result.status is Status.FOUND, result.summary()
    assert result.culprit_names == [(_name(at["culprit"]),)]
    assert "nothing to isolate" not in result.message


def test_pair_that_fails_only_together_is_named(tmp_path: Path) -> None:
    n = 8
    win = make_window(tmp_path, n, "pair")
    result = isolate(load_manifest(window_manifest(win, tmp_path / "speedtrap.toml")), tmp_path / "run")
    assert result.status is Status.FOUND, result.summary()
    assert [set(c) for c in result.culprit_names] == [culprit_names(win)]
    assert [i.kind for i in result.interactions] == [InteractionKind.JOINT]
    # git bisect takes ceil(log2 n) steps and names the later commit alone; both are named here, in
    # the prefixes' bisection, the later commit alone, the earlier prefixes with it, and the pair alone.
    assert result.launches <= 2 * math.ceil(math.log2(n)) + 2


def test_a_window_whose_head_passes_says_so(tmp_path: Path) -> None:
    n = 8
    win = make_window(tmp_path, n, "none")
    result = isolate(load_manifest(window_manifest(win, tmp_path / "speedtrap.toml")), tmp_path / "run")
    assert result.status is Status.FULL_PASSES, result.summary()
    assert result.culprits == ()
    # Every prefix the bisection tried passed, and HEAD itself was measured before saying so.
    assert tuple(sorted(_name(i) for i in range(n))) in [j.config for j in result.judgements]
    assert result.launches <= math.ceil(math.log2(n)) + 1
