"""Commit patches on a stack: resolved shas, and a git worktree per subset of commits.

- :func:`resolve_commit_patches`: the manifest's ``commit = "<sha>"`` / ``"A..B"`` become full shas
  (checked: a clean repository, known commits, each an ancestor of HEAD and after ``base``).
- :class:`Worktrees`: a git worktree of ``base`` + the selected commits (original order, 3-way),
  one per subset, in a private cache directory, removed on close.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from speedtrap._cache import cache_root
from speedtrap._errors import ManifestError
from speedtrap.stack._commits import CommitTrees, git, history, open_repo, resolve_commits, resolve_rev
from speedtrap.stack._spec import PatchSpec, TargetSpec


def resolve_commit_patches(
    target: TargetSpec, patches: Sequence[PatchSpec]
) -> tuple[TargetSpec, tuple[PatchSpec, ...]]:
    """Full shas for every commit patch and for ``base``; every problem is one ManifestError line."""
    commit_patches = [p for p in patches if p.commit is not None]
    if target.repo is None:
        if any("{worktree}" in a for a in [*target.launch, *(v for _, v in target.env)]):
            raise ManifestError(
                "target.launch or target.env uses {worktree} but the target names no repository",
                'add repo = "path/to/checkout" and base = "<sha>" to [target]',
            )
        if commit_patches:
            raise ManifestError(
                f"patch {commit_patches[0].name!r} is a commit but the target names no repository",
                'add repo = "path/to/checkout" and base = "<sha>" to [target]',
            )
        return target, tuple(patches)
    if target.in_process:
        raise ManifestError("target.repo is for servers launched per trial", "add target.launch, or drop target.repo")
    repo, base, out = resolve_commits_in(target.repo, target.base, patches)
    return dataclasses.replace(target, repo=repo, base=base), out


def resolve_commits_in(
    repo: Path, base: str | None, patches: Sequence[PatchSpec]
) -> tuple[Path, str, tuple[PatchSpec, ...]]:
    """The checked repository, the base's sha, and the patches with their commits resolved (triage uses it too)."""
    if not base:
        raise ManifestError("target.repo needs target.base (the commit the patches apply to)", 'add base = "<sha>"')
    top = open_repo(repo)
    base_sha = resolve_rev(top, base, "target.base")
    hist = history(top, base_sha)
    out: list[PatchSpec] = []
    owner: dict[str, str] = {}
    for i, p in enumerate(patches):
        if p.commit is None:
            out.append(p)
            continue
        shas = resolve_commits(hist, p.commit, f"patches[{i}].commit")
        for sha in shas:
            if sha in owner and _whole(owner[sha]) != _whole(p.name):  # a split patch's halves share them
                raise ManifestError(
                    f"patches[{i}].commit: commit {sha[:12]} is also in patch {owner[sha]!r}", "list each commit once"
                )
            owner[sha] = p.name
        ranks = tuple(hist.position(s) for s in shas)
        summary = p.summary or "; ".join(hist.subjects[s] for s in shas)
        out.append(dataclasses.replace(p, commits=shas, commit_rank=ranks, summary=summary))
    return top, base_sha, tuple(out)


def _whole(name: str) -> str:
    """A split patch's name without its role (``x@prefill`` -> ``x``)."""
    return name.split("@", 1)[0]


def commit_target_fields(raw: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """``[target]``'s ``repo``, ``base`` and ``pythonpath`` as written (shas are resolved later)."""
    repo, rev = raw.get("repo"), raw.get("base")
    if repo is not None and (not isinstance(repo, str) or not repo):
        raise ManifestError("target.repo must be a path string", 'write repo = "path/to/checkout"')
    if rev is not None and (not isinstance(rev, str) or not rev):
        raise ManifestError("target.base must be a commit (a string)", 'write base = "<sha>"')
    if rev is not None and repo is None:
        raise ManifestError("target.base needs target.repo", 'add repo = "path/to/checkout"')
    pythonpath = raw.get("pythonpath", ["."])
    if not isinstance(pythonpath, list) or not all(isinstance(x, str) for x in pythonpath):
        raise ManifestError("target.pythonpath must be a list of folders of the worktree", 'write pythonpath = ["."]')
    path = Path(repo).expanduser() if repo else None
    if path is not None and not path.is_absolute():
        path = base / path
    return {"repo": path, "base": rev, "pythonpath": tuple(pythonpath)}


def commit_order(patches: Sequence[PatchSpec], config: Iterable[str]) -> tuple[str, ...]:
    """The commits of the patches of ``config`` in their original (history) order."""
    chosen = set(config)
    pairs: list[tuple[int, int, str]] = []
    for i, p in enumerate(patches):
        if p.name in chosen:
            ranks = p.commit_rank or tuple(range(len(p.commits)))
            pairs.extend((rank, i, sha) for rank, sha in zip(ranks, p.commits, strict=True))
    # a split patch's halves (name@prefill, name@decode) hold the same commits: each is applied once
    return tuple(dict.fromkeys(sha for _, _, sha in sorted(pairs)))


class Worktrees:
    """One git worktree per subset of commits (base + the commits cherry-picked in order), cached.

    Worktrees live in a private directory under the speedtrap cache (``$SPEEDTRAP_CACHE_DIR``);
    the user's repository and checkout are only read. :meth:`close` removes everything.
    """

    def __init__(self, target: TargetSpec, patches: Sequence[PatchSpec], root: Path | None = None) -> None:
        if target.repo is None or target.base is None:
            raise ManifestError("commit patches need target.repo and target.base", "add them to [target]")
        self.patches = tuple(patches)
        self.trees = CommitTrees(target.repo, target.base, root or cache_root() / "worktrees")
        self.trees.prime([sha for p in self.patches for sha in p.commits])
        self._paths: dict[tuple[str, ...], Path] = {}
        self._lock = threading.Lock()

    def commits(self, config: Iterable[str]) -> tuple[str, ...]:
        return commit_order(self.patches, config)

    def applies(self, config: Iterable[str]) -> bool:
        return self.trees.tree(self.commits(config)) is not None

    def path(self, config: Iterable[str]) -> Path:
        """The worktree of ``config``'s commits (made on first use); CommitConflict when they do not apply."""
        commits = self.commits(config)
        with self._lock:
            if commits in self._paths:
                return self._paths[commits]
            sha = self.trees.commit(commits)
            path = self.trees.root / f"wt-{len(self._paths):04d}"
            git(["worktree", "add", "--detach", "--quiet", str(path), sha], git_dir=self.trees.git_dir)
            self._paths[commits] = path
            return path

    def close(self) -> None:
        with self._lock:
            self._paths.clear()
            self.trees.close()
