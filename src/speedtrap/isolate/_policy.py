"""Which trial the search makes next inside a failing context: a minimax table (issue 17).

The model. n patches; every patch is either a culprit (breaks the stack alone) or clean. The search
knows the baseline passes and the full set fails, and after each culprit it finds it tests the
context without the culprits found so far (the naive plan makes that trial too, so it is free
here). Inside a failing context the search knows a *span* (a prefix of the context minus a prefix
known to pass) that holds a culprit; ``m`` patches of the span and ``a`` patches after it have an
unknown verdict alone. Two kinds of trial cost one launch each:

- the first unknown patch of the span alone: fails = a culprit, found and confirmed at once;
  passes = one unknown fewer;
- the prefix up to the ``s``-th unknown patch of the span (2 <= s < m): passes = those ``s`` are
  clean; fails = the span shrinks to them and the other ``m - s`` join the patches after it.

With one unknown left in the span it is tested alone (the confirmation every plan makes).

The goal. The naive plan tests every patch alone: ``n`` trials besides the baseline, the full set
and the checks the conclusion needs, which both plans share. For k culprits the search may spend at
most ``budget[k]`` such trials, for every k up to ``MAX_SETS`` and every placement an adversary
picks. The table is a minimax over that game (the adversary also decides, after each culprit,
whether another one remains); :func:`budgets` finds the smallest budgets that a plan can keep, in
order: single culprits first, then two, then three, each at most ``n`` (the naive plan). The search
then takes, in each state, a trial with the best worst case; among those, with a prior (triage's
ranking), the one that cuts the span's prior weight nearest its middle, else the one with the
fewest trials expected when the round's culprit is anywhere in the span with equal chance.

What that gives (benchmarks/bench_isolate.py and tests/isolate/test_isolate_plan.py count it on
every placement): for up to three single culprits the search never spends more trials than the
naive plan; for n >= 11 a single culprit costs ceil(log2 n) + 1 of them, as plain bisection does
(n = 10: 6). For n <= 9 no plan can do both: keeping three culprits within the naive count forces a single
culprit's worst case to n trials (the table's own minimax, over plans that test a patch alone or
a prefix; the search before issue 17 found one culprit in about log2(n) + 1 trials and went over
the naive count with two or three). Past ``MAX_SETS`` culprits the table still
picks trials (as for the last one it plans for) but promises nothing.

The table costs O(n^3) per budget tried; :data:`MAX_PATCHES` bounds it (beyond that, bisection).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

MAX_SETS = 3
MAX_PATCHES = 64

_INF = 1 << 30

Table = tuple[tuple[tuple[float, ...], ...], ...]  # [found][m][a]


@dataclass(frozen=True)
class Policy:
    """The minimax table for n patches: :meth:`step` says which trial to make next."""

    n: int
    budgets: tuple[int, ...]  # budgets[k - 1]: trials allowed besides the shared ones, k culprits
    value: Table  # least worst case of (trials from here - budget of the final k)
    mean: Table  # expected trials to the round's culprit, under the least-worst-case choices

    def step(
        self, unknown_in_span: int, unknown_after: int, found: int, spent: int = 0, weights: Sequence[float] = ()
    ) -> int:
        """1: test the span's first unknown patch alone; s >= 2: test the prefix up to its s-th unknown.

        ``spent``: trials this plan has made so far (patches alone and prefixes); ``weights``: the
        prior weight of the span's unknown patches, in order (empty: no prior). With a prior, any
        trial that keeps the budgets is allowed, and the one nearest the weight's middle is taken.
        """
        m, a = unknown_in_span, unknown_after
        if m <= 1:
            return 1
        if m + a > self.n:  # not a state of this table's game (more patches than planned): halve
            return max(2, m // 2) if m > 2 else 1
        options = _options(self.n, self.budgets, self.value, self.mean, min(found, MAX_SETS - 1), m, a)
        least = min(worst for worst, _, _ in options)
        if len(weights) == m and len(set(weights)) > 1:
            kept = [(mean, s) for worst, mean, s in options if spent + worst <= 0 or worst == least]
            half = sum(weights) / 2
            return min(kept, key=lambda o: (abs(sum(weights[: o[1]]) - half), o[0]))[1]
        return min((mean, s) for worst, mean, s in options if worst == least)[1]


@functools.lru_cache(maxsize=16)
def policy_for(n: int, prior: bool = False) -> Policy | None:
    """The table for ``n`` patches, or None past :data:`MAX_PATCHES` (the caller bisects).

    With a prior, every budget is one trial more than the least (at most n), so that the top
    suspect can be tested alone first.
    """
    if n < 1 or n > MAX_PATCHES:
        return None
    chosen = tuple(min(n, b + 1) for b in budgets(n)) if prior else budgets(n)
    value, mean = _solve(n, chosen)
    return Policy(n, chosen, value, mean)


def budgets(n: int) -> tuple[int, ...]:
    """The smallest budgets a plan can keep, single culprits first, each at most n (the naive plan)."""
    chosen = [n] * MAX_SETS
    for k in range(MAX_SETS):
        lo, hi = -1, n  # infeasible at lo (or unknown), feasible at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            trial = tuple([*chosen[:k], mid, *chosen[k + 1 :]])
            if _solve(n, trial)[0][0][n][0] <= 0:
                hi = mid
            else:
                lo = mid
        chosen[k] = hi
    return tuple(chosen)


def _solve(n: int, budget: tuple[int, ...]) -> tuple[Table, Table]:
    """Both tables for every state, filled from small spans and late rounds up."""
    value = [[[float(_INF)] * (n + 1) for _ in range(n + 1)] for _ in range(MAX_SETS)]
    mean = [[[1.0] * (n + 1) for _ in range(n + 1)] for _ in range(MAX_SETS)]
    for f in range(MAX_SETS - 1, -1, -1):
        for total in range(1, n + 1):
            for m in range(1, total + 1):
                value[f][m][total - m], mean[f][m][total - m], _ = min(
                    _options(n, budget, value, mean, f, m, total - m)
                )
    return _freeze(value), _freeze(mean)


Grid = Sequence[Sequence[Sequence[float]]]


def _options(
    n: int, budget: tuple[int, ...], value: Grid, mean: Grid, f: int, m: int, a: int
) -> list[tuple[float, float, int]]:
    """Every trial in state (f, m, a): (worst case, expected trials to this round's culprit, s)."""

    def ended(unknown: int, found: int) -> float:  # the adversary: stop at k = found, or one more
        stop = float(-budget[found - 1])
        return max(stop, value[found][unknown][0]) if found < MAX_SETS and unknown > 0 else stop

    alone = 1 + max(ended(m - 1 + a, f + 1), value[f][m - 1][a] if m > 1 else -_INF)
    options = [(alone, 1 + (m - 1) / m * (mean[f][m - 1][a] if m > 1 else 0.0), 1)]
    for s in range(2, m):
        worst = 1 + max(value[f][m - s][a], value[f][s][a + m - s])
        options.append((worst, 1 + s / m * mean[f][s][a + m - s] + (m - s) / m * mean[f][m - s][a], s))
    return options


def _freeze(table: list[list[list[float]]]) -> Table:
    return tuple(tuple(tuple(row) for row in layer) for layer in table)
