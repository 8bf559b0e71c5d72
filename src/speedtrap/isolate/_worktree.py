"""Commit patches in a search: resolved shas, relations read off the history, a worktree per subset.

- :func:`resolve_commit_patches`: the manifest's ``commit = "<sha>"`` / ``"A..B"`` become full shas
  (checked: a clean repository, known commits, each an ancestor of HEAD and after ``base``).
- :func:`scan_relations`: which commit patches only apply on top of others (``requires``) and
  which pairs do not apply together (``conflicts``), by cherry-picking in memory: no launch.
- :class:`Worktrees`: a git worktree of ``base`` + the selected commits (original order, 3-way),
  one per subset, in a private cache directory, removed on close.
- :class:`ApplyingJudge`: the search's judge, which answers a subset whose commits do not apply
  with ``skipped`` ("conflicts"), like a declared conflict, never as a failure of the stack.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from speedtrap._cache import cache_root
from speedtrap._errors import ManifestError
from speedtrap.isolate._commits import CommitTrees, git, history, open_repo, resolve_commits, resolve_rev
from speedtrap.isolate._results import CommitPatch, Conclusion, Config, Judgement, PatchRelation
from speedtrap.isolate._spec import PatchSpec, TargetSpec

Judge = Callable[[Sequence[Config]], list[Judgement]]
MAX_DIFF_CHARS = 60_000  # per commit patch kept in the result (and the report)


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
            if sha in owner:
                raise ManifestError(
                    f"patches[{i}].commit: commit {sha[:12]} is also in patch {owner[sha]!r}", "list each commit once"
                )
            owner[sha] = p.name
        ranks = tuple(hist.position(s) for s in shas)
        summary = p.summary or "; ".join(hist.subjects[s] for s in shas)
        out.append(dataclasses.replace(p, commits=shas, commit_rank=ranks, summary=summary))
    return top, base_sha, tuple(out)


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
    return tuple(sha for _, _, sha in sorted(pairs))


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


def scan_relations(
    patches: Sequence[PatchSpec], applies: Callable[[Iterable[str]], bool]
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]], dict[str, str], list[PatchRelation]]:
    """Requires / conflicts between commit patches, read off by applying subsets (no launch).

    A patch that does not apply on the base alone requires a 1-minimal set of earlier patches on
    top of which it applies; two patches that apply alone (with what they require) but not
    together conflict. A patch that applies on no earlier set is left out (``unusable``).
    Returns (requires, conflicts, unusable, relations).
    """
    commit = [p for p in patches if p.commits]
    commit.sort(key=lambda p: min(p.commit_rank) if p.commit_rank else 0)
    requires: dict[str, tuple[str, ...]] = {}
    unusable: dict[str, str] = {}
    relations: list[PatchRelation] = []

    def closure(names: Iterable[str]) -> set[str]:
        out: set[str] = set()
        stack = list(names)
        while stack:
            n = stack.pop()
            if n not in out:
                out.add(n)
                stack.extend(requires.get(n, ()))
        return out

    for i, p in enumerate(commit):
        if applies([p.name]):
            continue
        need = [q.name for q in commit[:i] if q.name not in unusable]
        if not applies([*need, p.name]):
            unusable[p.name] = "its commits apply neither on the base nor on top of the earlier commit patches"
            continue
        for q in reversed(list(need)):
            if q not in need:
                continue
            fewer = [n for n in need if n != q and q not in closure([n])]
            if applies([*fewer, p.name]):
                need = fewer
        direct = tuple(n for n in need if not any(n in closure([m]) - {m} for m in need))
        requires[p.name] = direct
        relations.append(
            PatchRelation(
                "requires",
                p.name,
                direct,
                "commits",
                f"{p.name} does not apply on the base without {' + '.join(direct)} (3-way cherry-pick conflicts)",
            )
        )
    conflicts: dict[str, set[str]] = {}
    usable = [p.name for p in commit if p.name not in unusable]
    for i, a in enumerate(usable):
        for b in usable[i + 1 :]:
            if not applies(closure([a, b])):
                conflicts.setdefault(a, set()).add(b)
                conflicts.setdefault(b, set()).add(a)
                relations.append(
                    PatchRelation("conflicts", a, (b,), "commits", f"{a} and {b} do not apply together on the base")
                )
    return requires, {k: tuple(sorted(v)) for k, v in conflicts.items()}, unusable, relations


class ApplyingJudge:
    """Wraps the search's judge: a subset whose commits do not apply is ``skipped`` ("conflicts")."""

    def __init__(self, judge: Judge, worktrees: Worktrees) -> None:
        self.judge = judge
        self.worktrees = worktrees
        self.skipped: list[Config] = []

    def __call__(self, configs: Sequence[Config]) -> list[Judgement]:
        out: dict[Config, Judgement] = {}
        for c in configs:
            if not self.worktrees.applies(c):
                self.skipped.append(c)
                out[c] = Judgement(
                    c, Conclusion.SKIPPED, note="conflicts: its commits do not apply together on the base"
                )
        rest = [c for c in configs if c not in out]
        if rest:
            out.update(zip(rest, self.judge(rest), strict=True))
        return [out[c] for c in configs]


def merged(
    patches: Sequence[PatchSpec], requires: Mapping[str, tuple[str, ...]], conflicts: Mapping[str, tuple[str, ...]]
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """The manifest's requires / conflicts plus the ones read off the commits."""
    req = {p.name: tuple(dict.fromkeys([*p.requires, *requires.get(p.name, ())])) for p in patches}
    con = {p.name: tuple(dict.fromkeys([*p.conflicts, *conflicts.get(p.name, ())])) for p in patches}
    return {k: v for k, v in req.items() if v}, {k: v for k, v in con.items() if v}


def declared_relations(patches: Sequence[PatchSpec]) -> list[PatchRelation]:
    """The manifest's own ``requires`` / ``conflicts``, as relations."""
    out = [PatchRelation("requires", p.name, p.requires, "manifest") for p in patches if p.requires]
    return out + [PatchRelation("conflicts", p.name, p.conflicts, "manifest") for p in patches if p.conflicts]


@dataclasses.dataclass
class CommitRelations:
    """What a run's commit patches add to the search: relations, left-out patches, and the judge wrapper."""

    worktrees: Worktrees | None = None
    requires: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    conflicts: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    unusable: dict[str, str] = dataclasses.field(default_factory=dict)
    relations: list[PatchRelation] = dataclasses.field(default_factory=list)
    wrapped: ApplyingJudge | None = None

    @classmethod
    def read(cls, target: TargetSpec, patches: Sequence[PatchSpec]) -> CommitRelations:
        """Scan the commit patches (none: an empty record that changes nothing)."""
        if target.repo is None or not any(p.commits for p in patches):
            return cls()
        worktrees = Worktrees(target, patches)
        try:
            requires, conflicts, unusable, relations = scan_relations(patches, worktrees.applies)
        except BaseException:
            worktrees.close()
            raise
        return cls(worktrees, requires, conflicts, unusable, relations)

    def judge(self, judge: Judge) -> Judge:
        if self.worktrees is None:
            return judge
        self.wrapped = ApplyingJudge(judge, self.worktrees)
        return self.wrapped

    def notes(self) -> list[str]:
        out = [f"{r.why} (read off the commits: {r.patch} {r.kind} {', '.join(r.others)})" for r in self.relations]
        if self.wrapped is not None and self.wrapped.skipped:
            out.append(
                f"{len(self.wrapped.skipped)} subset(s) of commits did not apply on the base: "
                "skipped as conflicting, not counted as failures"
            )
        return out

    def close(self) -> None:
        if self.worktrees is not None:
            self.worktrees.close()


def describe_commit_patches(target: TargetSpec, patches: Sequence[PatchSpec]) -> tuple[CommitPatch, ...]:
    """Subject and diff of each commit patch (read from the repository), for the result and the report."""
    if target.repo is None:
        return ()
    out = []
    for p in patches:
        if not p.commits:
            continue
        diff = "".join(
            git(["show", "--no-color", "--no-ext-diff", "--format=commit %H%n%n    %s%n", "--patch", sha, "--"],
                cwd=target.repo)
            for sha in p.commits
        )  # fmt: skip
        if len(diff) > MAX_DIFF_CHARS:
            diff = diff[:MAX_DIFF_CHARS] + f"\n... ({len(diff) - MAX_DIFF_CHARS} more characters: git show)\n"
        out.append(CommitPatch(p.name, p.commits, p.summary, diff))
    return tuple(out)
