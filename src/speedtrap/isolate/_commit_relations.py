"""Commit patches in a search: relations read off the history, and a judge that skips what does not apply.

- :func:`scan_relations`: which commit patches only apply on top of others (``requires``) and
  which pairs do not apply together (``conflicts``), by cherry-picking in memory: no launch.
- :class:`ApplyingJudge`: the search's judge, which answers a subset whose commits do not apply
  with ``skipped`` ("conflicts"), like a declared conflict, never as a failure of the stack.
- :func:`window_order`: whether the patches are a *commit window* (every patch one commit, together
  the linear history base..HEAD). A window is not scanned up front (the pairwise scan grows as N^2
  and drops a culprit that conflicts with an earlier commit on the base): the search bisects its
  prefixes, which always apply, and a subset that does not apply is skipped when it is asked for.

The worktrees themselves (one per subset) are the stack's: :class:`speedtrap.stack.Worktrees`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from speedtrap.isolate._results import CommitPatch, Conclusion, Config, Judgement, PatchRelation
from speedtrap.spec import GateKind
from speedtrap.stack import PatchSpec, TargetSpec, Worktrees, git

Judge = Callable[[Sequence[Config]], list[Judgement]]
MAX_DIFF_CHARS = 60_000  # per commit patch kept in the result (and the report)


def scan_relations(
    patches: Sequence[PatchSpec], applies: Callable[[Iterable[str]], bool], pairs: bool = True
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]], dict[str, str], list[PatchRelation]]:
    """Requires / conflicts between commit patches, read off by applying subsets (no launch).

    A patch that does not apply on the base alone requires a 1-minimal set of earlier patches on
    top of which it applies; two patches that apply alone (with what they require) but not
    together conflict. A patch that applies on no earlier set is left out (``unusable``).
    ``pairs=False``: the requires only (linear in the patches), no pairwise conflicts.
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
    usable = [p.name for p in commit if p.name not in unusable] if pairs else []
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


def window_order(target: TargetSpec, patches: Sequence[PatchSpec]) -> list[str] | None:
    """The patch names in history order when the patches are a linear commit window, else None.

    A window: every patch is one commit (no switch, not ungated, not split across roles), and the
    commits, in history order, each have the previous one (the first: the base) as their only parent.
    One ``git log`` call for the whole window.
    """
    if target.repo is None or target.base is None or len(patches) < 2:
        return None
    if any(len(p.commits) != 1 or p.gate.kind is not GateKind.COMMIT or p.roles for p in patches):
        return None
    ordered = sorted(patches, key=lambda p: p.commit_rank[0] if p.commit_rank else 0)
    shas = [p.commits[0] for p in ordered]
    if len(set(shas)) != len(shas):
        return None
    listing = git(["log", "--no-walk=unsorted", "--format=%H %P", *shas], cwd=target.repo)
    parents = {line.split()[0]: line.split()[1:] for line in listing.splitlines() if line.strip()}
    expected = str(target.base)
    for sha in shas:
        if parents.get(sha) != [expected]:
            return None
        expected = sha
    return [p.name for p in ordered]


@dataclasses.dataclass
class CommitRelations:
    """What a run's commit patches add to the search: relations, left-out patches, and the judge wrapper."""

    worktrees: Worktrees | None = None
    requires: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    conflicts: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    unusable: dict[str, str] = dataclasses.field(default_factory=dict)
    relations: list[PatchRelation] = dataclasses.field(default_factory=list)
    wrapped: ApplyingJudge | None = None
    window: list[str] | None = None  # a linear commit window: the patches in history order (not scanned)

    @classmethod
    def read(cls, target: TargetSpec, patches: Sequence[PatchSpec]) -> CommitRelations:
        """Scan the commit patches (none: an empty record that changes nothing)."""
        if target.repo is None or not any(p.commits for p in patches):
            return cls()
        worktrees = Worktrees(target, patches)
        try:
            window = window_order(target, patches)
            if window is not None:
                return cls(worktrees, window=window)
            requires, conflicts, unusable, relations = scan_relations(patches, worktrees.applies)
        except BaseException:
            worktrees.close()
            raise
        return cls(worktrees, requires, conflicts, unusable, relations)

    def read_window_requires(self, patches: Sequence[PatchSpec]) -> None:
        """A window's ``requires`` (which commits apply on the base only on top of earlier ones), read
        after its hunt for the report: the hunt needs none of them (it bisects prefixes)."""
        if self.window is None or self.worktrees is None:
            return
        _requires, _conflicts, _unusable, relations = scan_relations(patches, self.worktrees.applies, pairs=False)
        self.relations = relations

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
