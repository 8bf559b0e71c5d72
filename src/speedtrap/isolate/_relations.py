"""Relations between patches (``requires``, ``conflicts``) and the hitting sets of found culprit sets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_TRANSVERSALS = 256


@dataclass(frozen=True)
class Relations:
    """``requires`` and ``conflicts`` between patches (from the manifest)."""

    requires: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    conflicts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def closure(self, names: Iterable[str]) -> frozenset[str]:
        out: set[str] = set()
        stack = list(names)
        while stack:
            name = stack.pop()
            if name not in out:
                out.add(name)
                stack.extend(self.requires.get(name, ()))
        return frozenset(out)

    def dependents(self, names: Iterable[str], universe: Iterable[str]) -> frozenset[str]:
        """Patches of ``universe`` that need one of ``names`` (directly or not)."""
        gone = set(names)
        return frozenset(p for p in universe if self.closure([p]) & gone) - gone

    def conflict(self, names: frozenset[str]) -> tuple[str, str] | None:
        for a in sorted(names):
            for b in self.conflicts.get(a, ()):
                if b in names:
                    return a, b
        return None

    def plan(self, patches: Sequence[str], prior: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """The searchable full set in search order: prior suspects first, requirements before dependents."""
        first = [p for p in prior if p in patches]
        ranked = list(dict.fromkeys([*first, *patches]))
        chosen: list[str] = []
        skipped: dict[str, str] = {}
        for p in ranked:
            need = self.closure([p])
            if p in chosen:
                continue
            missing = [q for q in need if q not in patches]
            if missing:
                skipped[p] = f"requires {', '.join(sorted(missing))}, which is not listed"
                continue
            clash = self.conflict(frozenset(chosen) | need)
            if clash is not None:
                other = clash[1] if clash[0] in need else clash[0]
                skipped[p] = f"conflicts with {other}, which is searched instead"
                continue
            for q in self.topological(need, ranked):
                if q not in chosen:
                    chosen.append(q)
        return chosen, skipped

    def topological(self, names: frozenset[str], ranked: list[str]) -> list[str]:
        out: list[str] = []

        def visit(p: str) -> None:
            if p in out:
                return
            for q in sorted(self.requires.get(p, ()), key=ranked.index):
                visit(q)
            out.append(p)

        for p in sorted(names, key=ranked.index):
            visit(p)
        return out


def minimal_transversals(family: Sequence[set[str]], position: Mapping[str, int]) -> list[frozenset[str]]:
    """Every minimal set that meets each set of ``family`` (Berge's algorithm), smallest first."""
    current: list[frozenset[str]] = [frozenset()]
    for member in family:
        grown: set[frozenset[str]] = set()
        for t in current:
            if t & member:
                grown.add(t)
            else:
                grown.update(t | {x} for x in member)
        current = [t for t in grown if not any(o < t for o in grown)]
        if len(current) > MAX_TRANSVERSALS:
            current = sorted(current, key=lambda t: _rank(t, position))[:MAX_TRANSVERSALS]
    return sorted(current, key=lambda t: _rank(t, position))


def _rank(t: frozenset[str], position: Mapping[str, int]) -> tuple[int, list[int]]:
    return len(t), sorted(position.get(x, 0) for x in t)
