"""Commit patches: a worktree of base + a subset of commits per trial, on a small Python stack in a temp repo.

Ground truth comes from construction (``route_scale`` applies the scale twice, ``tuned_helper``
edits a line ``fused_helper`` wrote) and from brute force: every subset cherry-picked with plain
``git cherry-pick`` in a separate clone and the stack's figure computed there.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from commit_stack import TINY_PROBE, CommitStack, git, make_stack, toml_text
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedtrap._errors import ManifestError
from speedtrap.cli import app
from speedtrap.isolate import IsolateResult, PatchRelation, Status, isolate
from speedtrap.manifest import load_manifest
from speedtrap.stack import Worktrees

BOUND = 0.5
NAMES = ("fused_helper", "route_scale", "tuned_helper")


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CommitStack:
    monkeypatch.setenv("SPEEDTRAP_CACHE_DIR", str(tmp_path / "cache"))
    return make_stack(tmp_path)


def write_manifest(path: Path, stack: CommitStack, extra_patches: list[dict[str, object]] | None = None) -> Path:
    patches: list[dict[str, object]] = [{"name": n, "commit": stack.commits[n]} for n in NAMES]
    patches += extra_patches or []
    text = toml_text(
        {
            "target": {
                "launch": [sys.executable, "-m", "stack.server", "--port", "{port}"],
                "repo": str(stack.repo),
                "base": stack.base,
                "health": "http://127.0.0.1:{port}/health",
                "start_timeout": 30,
                "stop_timeout": 5,
                "retries": 0,
            },
            "probe": {"kind": "command", "argv": [sys.executable, str(TINY_PROBE), "{base_url}"], "timeout": 30},
            "verdict": {"metric": "metric", "bound": BOUND, "repeats": 0},
        },
        patches,
    )
    path.write_text(text)
    return path


# -- brute force, independent of the code under test ------------------------------------------


def brute_force(stack: CommitStack, scratch: Path) -> tuple[dict[frozenset[str], bool | None], set[frozenset[str]]]:
    """Every subset of the commits: None when `git cherry-pick` conflicts, else whether the stack fails.

    Returns the verdicts and the minimal failing subsets among those that apply.
    """
    clone = scratch / "brute"
    subprocess.run(["git", "clone", "-q", str(stack.repo), str(clone)], check=True)
    verdicts: dict[frozenset[str], bool | None] = {}
    for k in range(len(NAMES) + 1):
        for subset in itertools.combinations(NAMES, k):
            git(clone, "checkout", "-q", "--detach", stack.base)
            git(clone, "reset", "-q", "--hard", stack.base)
            applied = True
            for name in NAMES:  # original order
                if name not in subset:
                    continue
                done = subprocess.run(
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "cherry-pick", stack.commits[name]],
                    cwd=clone,
                    capture_output=True,
                    check=False,
                )
                if done.returncode != 0:
                    subprocess.run(["git", "cherry-pick", "--abort"], cwd=clone, capture_output=True, check=False)
                    applied = False
                    break
            if not applied:
                verdicts[frozenset(subset)] = None
                continue
            code = "from stack import model; print(abs(model.combine(1.0) - model.SCALE))"
            out = subprocess.run(
                [sys.executable, "-c", code], cwd=clone, capture_output=True, text=True, check=True
            ).stdout
            verdicts[frozenset(subset)] = float(out) > BOUND
    failing = {s for s, v in verdicts.items() if v}
    minimal = {s for s in failing if not any(o < s for o in failing)}
    return verdicts, minimal


# -- the search ---------------------------------------------------------------------------------


def test_search_names_the_culprit_commit_and_equals_brute_force(stack: CommitStack, tmp_path: Path) -> None:
    env_patch = {"name": "fast_env", "env": {"STACK_FAST": "1"}}
    manifest = load_manifest(write_manifest(tmp_path / "speedtrap.toml", stack, [env_patch]))
    assert manifest.patch("route_scale").commits == (stack.commits["route_scale"],)
    assert manifest.patch("route_scale").summary == stack.subjects["route_scale"]
    head_before = git(stack.repo, "rev-parse", "HEAD")

    result = isolate(manifest, tmp_path / "run")

    # Ground truth by construction: route_scale applies the scale twice.
    assert result.status is Status.FOUND, result.summary()
    assert result.culprit_names == [("route_scale",)]
    # The dependent pair is a relation read off the commits, not a failure of the stack.
    assert PatchRelation("requires", "tuned_helper", ("fused_helper",), "commits", result.relations[0].why) in (
        result.relations
    )
    assert not any(j.verdict.value == "error" for j in result.judgements)
    # Brute force over every subset of the commits (plain git cherry-pick in a clone) agrees.
    verdicts, minimal = brute_force(stack, tmp_path)
    assert verdicts[frozenset({"tuned_helper"})] is None  # only applies on top of fused_helper
    assert verdicts[frozenset({"fused_helper", "tuned_helper"})] is False
    assert minimal == {frozenset(c) for c in result.culprit_names}
    # Every configuration the search measured has the verdict brute force gives it.
    for j in result.judgements:
        if j.verdict.value in ("pass", "fail"):
            commits = frozenset(j.config) - {"fast_env"}
            assert verdicts[commits] is (j.verdict.value == "fail"), j.config
    # Trials ran from worktrees in the cache (never the user's checkout), which are gone afterwards.
    logs = [Path(t.log_path).read_text() for t in result.trials if t.log_path]
    assert logs and all(f"model file: {stack.repo}" not in log for log in logs)
    assert all(str(tmp_path / "cache" / "worktrees") in log for log in logs)
    assert not list((tmp_path / "cache" / "worktrees").glob("repo-*"))
    assert git(stack.repo, "rev-parse", "HEAD") == head_before
    assert git(stack.repo, "status", "--porcelain") == ""
    assert len(git(stack.repo, "worktree", "list").splitlines()) == 1
    # The result round-trips with its relations.
    assert IsolateResult.from_json(result.to_json()).relations == result.relations


def test_applying_matches_git_cherry_pick_for_every_subset(stack: CommitStack, tmp_path: Path) -> None:
    manifest = load_manifest(write_manifest(tmp_path / "speedtrap.toml", stack))
    verdicts, _ = brute_force(stack, tmp_path)
    trees = Worktrees(manifest.target, manifest.patches, tmp_path / "wt")
    try:
        for subset, verdict in verdicts.items():
            assert trees.applies(subset) is (verdict is not None), subset
        path = trees.path(["route_scale", "tuned_helper", "fused_helper"])
        assert "return x * SCALE" in (path / "stack" / "model.py").read_text()
        assert "0.0 + x  # fused, tuned" in (path / "stack" / "model.py").read_text()
        assert trees.path(["fused_helper", "route_scale", "tuned_helper"]) == path  # cached by subset
    finally:
        trees.close()
    assert not (tmp_path / "wt").exists() or not list((tmp_path / "wt").iterdir())


# -- bad input: one line, exit 2 ---------------------------------------------------------------


def _bisect(manifest: Path, tmp_path: Path) -> tuple[int, str]:
    runner = CliRunner()
    res = runner.invoke(app, ["bisect", "--manifest", str(manifest), "--run-dir", str(tmp_path / "r")])
    return res.exit_code, res.output


def test_missing_repo(stack: CommitStack, tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.toml", stack)
    path.write_text(path.read_text().replace(str(stack.repo), str(tmp_path / "nowhere")))
    code, out = _bisect(path, tmp_path)
    assert code == 2 and "does not exist" in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1


def test_dirty_repo(stack: CommitStack, tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.toml", stack)
    (stack.repo / "stack" / "model.py").write_text("# edited\n")
    code, out = _bisect(path, tmp_path)
    assert code == 2 and "uncommitted changes" in out and len(out.strip().splitlines()) == 1


def test_unknown_sha(stack: CommitStack, tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.toml", stack)
    path.write_text(path.read_text().replace(stack.commits["route_scale"], "deadbeef0123"))
    code, out = _bisect(path, tmp_path)
    assert code == 2 and "'deadbeef0123' is not a commit" in out and len(out.strip().splitlines()) == 1


def test_commit_not_an_ancestor_of_head(stack: CommitStack, tmp_path: Path) -> None:
    git(stack.repo, "checkout", "-q", "-b", "side")
    (stack.repo / "side.txt").write_text("x\n")
    git(stack.repo, "add", "side.txt")
    git(stack.repo, "commit", "-q", "-m", "side")
    side = git(stack.repo, "rev-parse", "HEAD")
    git(stack.repo, "checkout", "-q", "main")
    path = write_manifest(tmp_path / "m.toml", stack, [{"name": "side", "commit": side}])
    with pytest.raises(ManifestError, match="not an ancestor of HEAD"):
        load_manifest(path)
    code, out = _bisect(path, tmp_path)
    assert code == 2 and "not an ancestor of HEAD" in out and len(out.strip().splitlines()) == 1


def test_commit_before_base_and_commit_without_repo(stack: CommitStack, tmp_path: Path) -> None:
    path = write_manifest(tmp_path / "m.toml", stack)
    path.write_text(path.read_text().replace(f'base = "{stack.base}"', f'base = "{stack.commits["route_scale"]}"'))
    with pytest.raises(ManifestError, match=r"is not after target\.base"):
        load_manifest(path)
    path = write_manifest(tmp_path / "m.toml", stack)
    path.write_text(path.read_text().replace(f'repo = "{stack.repo}"\n', "").replace(f'base = "{stack.base}"\n', ""))
    with pytest.raises(ManifestError, match="names no repository"):
        load_manifest(path)


# -- init and triage ----------------------------------------------------------------------------


def test_init_writes_a_manifest_triage_reads(stack: CommitStack, tmp_path: Path) -> None:
    from speedtrap.triage import from_manifest, triage

    out = tmp_path / "speedtrap.toml"
    res = CliRunner().invoke(app, ["init", "--repo", str(stack.repo), "--range", f"{stack.base}..HEAD", "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    for name in NAMES:
        assert f'commit = "{stack.commits[name]}"' in text
    assert 'name = "router_apply_the_routed_scaling_factor_in_the_router"' in text
    assert "launch = []" in text and "# triage: tier" in text
    # The launch line is the user's to fill: until then, isolate says so in one line.
    with pytest.raises(ManifestError, match=r"target\.launch is empty"):
        _ = load_manifest(out).target  # what isolate asks for first
    # Triage reads the same manifest: each commit's diff, from the repository.
    patch_set = from_manifest(load_manifest(out), None)
    try:
        report = triage(patch_set)
    finally:
        patch_set.close()
    by_name = {p.name: p for p in report.patches}
    scaled = by_name["router_apply_the_routed_scaling_factor_in_the_router"]
    assert scaled.patch.diff is not None and "return x * SCALE" in scaled.patch.diff
    assert scaled.patch.origin.startswith("commit ")
    # Its plan says a commit patch is A/B'd by a switch (its commit in or out of the worktree), not a rebuild.
    from speedtrap.triage import render_plan

    plan = render_plan(report, patch_set.cli_args)
    row = next(line for line in plan.splitlines() if line.startswith(f"| `{scaled.name}`"))
    assert "switch (commit)" in row and "rebuild" not in row
    # A second init does not overwrite; a dirty repo is one line.
    again = CliRunner().invoke(
        app, ["init", "--repo", str(stack.repo), "--range", f"{stack.base}..HEAD", "-o", str(out)]
    )
    assert again.exit_code == 2 and "already exists" in again.output
    (stack.repo / "stack" / "model.py").write_text("# edited\n")
    dirty = CliRunner().invoke(
        app, ["init", "--repo", str(stack.repo), "--range", f"{stack.base}..HEAD", "-o", str(tmp_path / "b.toml")]
    )
    assert dirty.exit_code == 2 and "uncommitted changes" in dirty.output


def test_git_env_does_not_leak_into_user_repo(stack: CommitStack, tmp_path: Path) -> None:
    """Applying subsets writes objects to the private repository only: the user's object count is unchanged."""
    before = git(stack.repo, "count-objects", "-v")
    manifest = load_manifest(write_manifest(tmp_path / "m.toml", stack))
    trees = Worktrees(manifest.target, manifest.patches, tmp_path / "wt")
    try:
        trees.path(["route_scale"])
    finally:
        trees.close()
    assert git(stack.repo, "count-objects", "-v") == before
    assert not (stack.repo / ".git" / "worktrees").exists()


# -- the whole hunt: speedtrap run --manifest on commit patches ---------------------------------


def test_run_on_commit_patches_names_the_culprit_commit_in_the_report(stack: CommitStack, tmp_path: Path) -> None:
    import json

    from speedtrap.report import schema_errors

    manifest = write_manifest(tmp_path / "speedtrap.toml", stack)
    out = tmp_path / "run"
    env = {**os.environ, "SPEEDTRAP_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest), "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    # The recall probe cannot talk to a stack without a chat API: that stage fails, the rest goes on.
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert [(c["patches"], c["confirmed"]) for c in summary["verdict"]["culprits"]] == [(["route_scale"], True)]
    document = json.loads((out / "report.json").read_text())
    assert schema_errors(document) == []
    # Triage read the commits' diffs from the repository: the double scale ranks first.
    triage_rows = {r["name"]: r for r in document["triage"]["rows"]}
    assert triage_rows["route_scale"]["tier"] == 1
    # The report shows each commit: subject, diff and verdict, with triage's reasons beside it.
    rows = {c["patch"]: c for c in document["isolation"]["commits"]}
    assert rows["route_scale"]["verdict"] == "culprit"
    assert rows["route_scale"]["subject"] == stack.subjects["route_scale"]
    assert "+    return x * SCALE" in rows["route_scale"]["diff"]
    assert rows["fused_helper"]["verdict"].startswith("cleared")
    assert rows["tuned_helper"]["relations"] == ["requires fused_helper (read off commits)"]
    html = (out / "report.html").read_text()
    assert "<h3>Commits</h3>" in html and "return x * SCALE" in html
    sha = stack.commits["route_scale"][:10]
    assert f"commit {sha}: {stack.subjects['route_scale']}" in " ".join(document["verdict"]["evidence"])
    assert triage_rows["route_scale"]["reasons"][0].split(":")[0] in html
    markdown = (out / "report.md").read_text()
    assert "### Commits" in markdown and "#### route_scale: " + stack.subjects["route_scale"] in markdown
    assert not list((tmp_path / "cache" / "worktrees").glob("repo-*"))


@pytest.fixture(scope="module")
def shared_stack(tmp_path_factory: pytest.TempPathFactory) -> CommitStack:
    return make_stack(tmp_path_factory.mktemp("shared"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spec=st.one_of(
        st.text(max_size=30),
        st.sampled_from(["HEAD", "HEAD~1", "HEAD~1..HEAD", "HEAD~3..HEAD", "..", "a...b", "-x", "HEAD^{tree}"]),
        st.builds(lambda h, n: h[:n], st.sampled_from(["0123456789abcdef" * 3]), st.integers(0, 45)),
    )
)
def test_any_commit_spec_resolves_or_is_one_manifest_error(shared_stack: CommitStack, spec: str) -> None:
    """Whatever a user writes as `commit`, the parser either resolves it to commits in base..HEAD or
    raises a ManifestError (one line), never another exception."""
    from speedtrap.stack import PatchSpec, resolve_commits_in

    try:
        _, base, (patch,) = resolve_commits_in(shared_stack.repo, shared_stack.base, [PatchSpec("p", commit=spec)])
    except ManifestError as exc:
        assert "\n" not in exc.one_line()
        return
    assert patch.commits and set(patch.commits) <= set(shared_stack.commits.values())
    assert base == shared_stack.base
