"""Patches that are commits: the repository checks, sha resolution, and applying a subset of commits.

A commit patch names one commit (or a range ``A..B``) of ``[target] repo``; a trial applies the
selected commits on ``[target] base`` in their original (history) order, each one a 3-way
cherry-pick. Applying is done in memory by ``git merge-tree`` in a private bare repository that
borrows the user's objects (``objects/info/alternates``): nothing is written to the user's
repository or checkout. Every git call is an argument list, never a shell.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from speedtrap._errors import ManifestError, SpeedtrapError

_GIT_TIMEOUT_S = 300
# Synthetic commits (the cherry-pick's merge bases and results) get a fixed identity and date, so the
# same subset gives the same commit ids in every run.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "speedtrap",
    "GIT_AUTHOR_EMAIL": "speedtrap@localhost",
    "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_NAME": "speedtrap",
    "GIT_COMMITTER_EMAIL": "speedtrap@localhost",
    "GIT_COMMITTER_DATE": "1700000000 +0000",
    "GIT_TERMINAL_PROMPT": "0",
}
_SCRUB = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES")


class CommitConflict(SpeedtrapError):
    """A subset of commits does not apply on the base (a 3-way cherry-pick conflicts)."""


class GitFailed(SpeedtrapError):
    """A git command failed unexpectedly."""


def git(args: Sequence[str], cwd: Path | None = None, git_dir: Path | None = None, check: bool = True) -> str:
    """Run git with an argument list; stdout as text. ``check``: a non-zero exit raises GitFailed."""
    return run_git(args, cwd, git_dir, check).stdout


def run_git(
    args: Sequence[str], cwd: Path | None = None, git_dir: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run git with an argument list (never a shell) in a scrubbed environment with a fixed identity."""
    exe = shutil.which("git")
    if exe is None:
        raise ManifestError("git is not installed (commit patches need it)", "install git")
    argv = [exe, "-c", "commit.gpgSign=false", "-c", "core.hooksPath=/dev/null"]
    if git_dir is not None:
        argv += ["--git-dir", str(git_dir)]
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(_GIT_ENV)
    try:
        proc = subprocess.run(  # noqa: S603  (an argument list, no shell; revisions are checked first)
            [*argv, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise GitFailed(f"git {args[0]} took over {_GIT_TIMEOUT_S} s", "check the repository") from None
    if check and proc.returncode != 0:
        err = proc.stderr.strip().splitlines()
        raise GitFailed(f"git {args[0]} failed: {err[-1] if err else proc.returncode}", "check the repository")
    return proc


def _ok(args: Sequence[str], cwd: Path) -> bool:
    exe = shutil.which("git") or "git"
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    try:
        done = subprocess.run(  # noqa: S603  (an argument list, no shell)
            [exe, *args], cwd=cwd, env=env, capture_output=True, timeout=_GIT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise GitFailed(f"git {args[0]} took over {_GIT_TIMEOUT_S} s", "check the repository") from None
    return done.returncode == 0


def _check_rev(rev: str, where: str) -> str:
    if not rev or rev.startswith("-") or any(c.isspace() or c == "\x00" for c in rev):
        raise ManifestError(f"{where}: {rev!r} is not a revision", 'write a commit id, e.g. "3f2a9c1"')
    return rev


def open_repo(path: Path, where: str = "target.repo") -> Path:
    """The repository's top level; a missing path, a non-repository or uncommitted changes are errors."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ManifestError(f"{where} {str(path)!r} does not exist", "give the path of the stack's git checkout")
    if not _ok(["rev-parse", "--is-inside-work-tree"], path):
        raise ManifestError(f"{where} {str(path)!r} is not a git checkout", "give the path of the stack's git checkout")
    top = Path(git(["rev-parse", "--show-toplevel"], cwd=path).strip())
    dirty = git(["status", "--porcelain", "--untracked-files=no"], cwd=top).strip()
    if dirty:
        first = dirty.splitlines()[0][3:]
        raise ManifestError(
            f"{where} {str(top)!r} has uncommitted changes ({first} ...)",
            "commit or stash them: the patches must be commits",
        )
    return top


def resolve_rev(repo: Path, rev: str, where: str) -> str:
    _check_rev(rev, where)
    out = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=repo, check=False).strip()
    if not out:
        raise ManifestError(f"{where}: {rev!r} is not a commit in {repo}", "check it with `git log`")
    return out


def _is_ancestor(repo: Path, a: str, b: str) -> bool:
    return _ok(["merge-base", "--is-ancestor", a, b], repo)


@dataclass(frozen=True)
class RepoHistory:
    """The commits of ``base..HEAD`` in history order (oldest first), with their subjects."""

    repo: Path
    base: str
    head: str
    order: tuple[str, ...]
    subjects: dict[str, str]

    def position(self, sha: str) -> int:
        return self.order.index(sha)


def history(repo: Path, base: str) -> RepoHistory:
    head = resolve_rev(repo, "HEAD", "target.repo HEAD")
    if not _is_ancestor(repo, base, head):
        raise ManifestError(f"target.base {base[:12]} is not an ancestor of HEAD in {repo}", "choose an older base")
    listing = git(["log", "--reverse", "--topo-order", "--format=%H%x00%P%x00%s", f"{base}..{head}"], cwd=repo)
    order, subjects = [], {}
    for line in listing.splitlines():
        sha, parents, subject = line.split("\x00", 2)
        order.append(sha)
        subjects[sha] = subject if len(parents.split()) == 1 else "\x00merge"
    return RepoHistory(repo, base, head, tuple(order), subjects)


def resolve_commits(hist: RepoHistory, spec: str, where: str) -> tuple[str, ...]:
    """A patch's ``commit``: one sha, or ``A..B`` (the commits of that range), each in base..HEAD."""
    if ".." in spec:
        if "..." in spec:
            raise ManifestError(f"{where} {spec!r}: write a range as A..B", 'e.g. commit = "abc123..def456"')
        a, b = (resolve_rev(hist.repo, x, where) for x in spec.split("..", 1))
        shas = [line for line in git(["rev-list", "--reverse", f"{a}..{b}"], cwd=hist.repo).split() if line]
        if not shas:
            raise ManifestError(f"{where} {spec!r} holds no commits", "check it with `git log A..B`")
    else:
        shas = [resolve_rev(hist.repo, spec, where)]
    for sha in shas:
        if sha not in hist.subjects:
            if not _is_ancestor(hist.repo, sha, hist.head):
                raise ManifestError(
                    f"{where}: commit {sha[:12]} is not an ancestor of HEAD in {hist.repo}",
                    "check out the branch that holds the patches, or fix the sha",
                )
            raise ManifestError(
                f"{where}: commit {sha[:12]} is not after target.base {hist.base[:12]}",
                "choose an older base, or drop this patch (the base already holds it)",
            )
        if hist.subjects[sha] == "\x00merge":
            raise ManifestError(f"{where}: commit {sha[:12]} is a merge", "list the commits it merges instead")
    return tuple(sorted(shas, key=hist.position))


def _check_git_version() -> None:
    """``git merge-tree --write-tree`` (the in-memory cherry-pick) needs git 2.38 or newer."""
    text = git(["version"]).strip()
    numbers = [int(x) for x in re.findall(r"\d+", text)[:2]]
    if len(numbers) == 2 and tuple(numbers) < (2, 38):
        raise ManifestError(f"commit patches need git 2.38 or newer ({text})", "upgrade git")


APPLIED = "Speedtrap-Applied: "  # a line of a worktree commit's message per commit it holds


def applied_message(base: str, commits: Sequence[str]) -> str:
    """The message of a worktree's commit: the base, then a line per commit applied (what inspect reads back)."""
    return "\n".join([f"speedtrap: {base} + {len(commits)} commit(s)", "", *(APPLIED + c for c in commits)])


Applied = tuple[Path, frozenset[str]]  # a speedtrap worktree and the commits it holds


def worktree_applied(pythonpath: str) -> Applied | None:
    """The first entry of ``pythonpath`` that is a speedtrap worktree, and the commits it holds (read from its
    HEAD's message); None when no entry is one."""
    for entry in filter(None, pythonpath.split(os.pathsep)):
        folder = Path(entry)
        if not folder.is_dir():
            continue
        try:
            done = run_git(["log", "-1", "--format=%B", "HEAD"], cwd=folder, check=False)
        except ManifestError:  # no git here: nothing can be read back
            return None
        message = done.stdout if done.returncode == 0 else ""
        if message.startswith("speedtrap: "):
            lines = message.splitlines()
            return folder, frozenset(line[len(APPLIED) :].strip() for line in lines if line.startswith(APPLIED))
    return None


class CommitTrees:
    """Applies subsets of commits on a base in a private bare repository (in memory, cached by prefix).

    ``tree(commits)`` is the tree of base + the commits, each cherry-picked 3-way in the order
    given, or None when one of them conflicts; ``commit(commits)`` a commit of that tree (its
    parent is the base), which a worktree can check out. Thread-safe.
    """

    def __init__(self, repo: Path, base: str, root: Path) -> None:
        self.repo = Path(repo)
        self.base = base
        _check_git_version()
        root.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="repo-", dir=root))
        self.git_dir = self.root / "repo.git"
        git(["init", "--bare", "--quiet", str(self.git_dir)])
        objects = Path(git(["rev-parse", "--path-format=absolute", "--git-path", "objects"], cwd=self.repo).strip())
        (self.git_dir / "objects" / "info" / "alternates").write_text(f"{objects}\n")
        self._lock = threading.Lock()
        self._trees: dict[tuple[str, ...], str | None] = {(): self._tree_of(base)}
        self._picks: dict[str, tuple[str, str]] = {}
        self._own: dict[str, tuple[str, str]] = {}  # commit -> (its tree, its parent's tree)

    def prime(self, commits: Sequence[str]) -> None:
        """Read every commit's tree and its parent's tree in one git call (the prefix fast path's)."""
        todo = [c for c in dict.fromkeys(commits) if c not in self._own]
        if not todo:
            return
        args = [rev for c in todo for rev in (f"{c}^{{tree}}", f"{c}^^{{tree}}")]
        done = run_git(["rev-parse", *args], git_dir=self.git_dir, check=False)
        lines = done.stdout.split()
        if done.returncode != 0 or len(lines) != len(args):  # a root commit (no parent): one at a time
            return
        with self._lock:
            for i, c in enumerate(todo):
                self._own[c] = (lines[2 * i], lines[2 * i + 1])

    def _git(self, *args: str, check: bool = True) -> str:
        return git(list(args), git_dir=self.git_dir, check=check)

    def _tree_of(self, rev: str) -> str:
        return self._git("rev-parse", f"{rev}^{{tree}}").strip()

    def _synthetic(self, tree: str, parent: str | None, message: str = "speedtrap") -> str:
        extra = ["-p", parent] if parent else []
        return self._git("commit-tree", tree, *extra, "-m", message).strip()

    def _pick(self, onto: str, commit: str) -> str | None:
        """The tree of ``onto`` with ``commit`` cherry-picked (3-way, merge base: its parent), or None.

        Onto its own parent's tree the pick is the commit's tree (no merge): a prefix of a linear
        history costs no git call once :meth:`prime` has read the trees.
        """
        own = self._own.get(commit)
        if own is not None and own[1] == onto:
            return own[0]
        if commit not in self._picks:
            parent = self._synthetic(self._tree_of(f"{commit}^"), None)
            self._picks[commit] = (parent, self._synthetic(self._tree_of(commit), parent))
        parent, theirs = self._picks[commit]
        ours = self._synthetic(onto, parent)
        done = run_git(["merge-tree", "--write-tree", "--no-messages", ours, theirs], git_dir=self.git_dir, check=False)
        if done.returncode == 1:  # conflicts (the tree it prints holds conflict markers)
            return None
        first = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
        if len(first) < 40:
            raise GitFailed(f"git merge-tree failed on commit {commit[:12]}: {done.stderr.strip()}", "check git")
        return first

    def tree(self, commits: Sequence[str]) -> str | None:
        key = tuple(commits)
        with self._lock:
            return self._tree_locked(key)

    def _tree_locked(self, key: tuple[str, ...]) -> str | None:
        if key in self._trees:
            return self._trees[key]
        below = self._tree_locked(key[:-1])
        result = None if below is None else self._pick(below, key[-1])
        self._trees[key] = result
        return result

    def commit(self, commits: Sequence[str]) -> str:
        tree = self.tree(commits)
        if tree is None:
            raise CommitConflict(
                f"commits {', '.join(c[:12] for c in commits)} do not apply together on {self.base[:12]}",
                "this subset conflicts: it is skipped by the search",
            )
        with self._lock:
            return self._synthetic(tree, self.base, applied_message(self.base, commits))

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
