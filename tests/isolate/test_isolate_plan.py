"""The search's plan against the naive plan and the search it replaced, on a grid of monotone stacks.

The previous search's launches come from data/search_v1_counts.json, written by the frozen copy of
that search (``benchmarks/bench_isolate.py --freeze``), so nothing here is computed by the code
under test except the new counts.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from speedtrap.isolate import Conclusion, Judgement, Search
from speedtrap.isolate._policy import budgets

DATA = Path(__file__).parent / "data" / "search_v1_counts.json"


def naive_count(n: int, k: int) -> int:
    """Baseline, full set, n singles, everything but the culprits; with k >= 2 each culprit among the
    rest; with k >= 3 each pair among the rest (for k = 2 the pair's context is the full set)."""
    return n + 3 + (k if k >= 2 else 0) + (math.comb(k, 2) if k >= 3 else 0)


def launches(names: Sequence[str], bad: Sequence[str], plan: str = "auto", prior: Sequence[str] = ()) -> int:
    seen: set[tuple[str, ...]] = set()

    def judge(configs: Sequence[tuple[str, ...]]) -> list[Judgement]:
        seen.update(configs)
        return [Judgement(c, Conclusion.FAIL if any(b in c for b in bad) else Conclusion.PASS) for c in configs]

    result = Search(list(names), judge, plan=plan, prior=prior).run()
    assert {c.patches for c in result.culprits} == {(b,) for b in bad}
    assert not result.interactions and not result.notes  # the trial limit is far away on a monotone stack
    return len(seen)


def cells() -> list[dict[str, Any]]:
    return list(json.loads(DATA.read_text())["cells"])


@pytest.mark.parametrize("cell", cells(), ids=lambda c: f"n{c['n']}-k{c['k']}")
def test_the_search_never_exceeds_the_naive_plan(cell: dict[str, Any]) -> None:
    """Every placement of up to three single culprits (sampled past 220 placements)."""
    n, k = cell["n"], cell["k"]
    names = [f"p{i:02d}" for i in range(n)]
    new = [launches(names, bad) for bad in cell["culprits"]]
    assert max(new) <= naive_count(n, k), (n, k, max(new))


@pytest.mark.parametrize("cell", cells(), ids=lambda c: f"n{c['n']}-k{c['k']}")
def test_the_search_costs_no_more_than_the_one_it_replaced(cell: dict[str, Any]) -> None:
    """Mean and worst case per (n, k), except one culprit among n <= 8 (the next test says why)."""
    n, k = cell["n"], cell["k"]
    if k == 1 and n <= 8:
        pytest.skip("one culprit among n <= 8: the naive bound costs the old search's speed here")
    names = [f"p{i:02d}" for i in range(n)]
    new = [launches(names, bad) for bad in cell["culprits"]]
    old = cell["v1_launches"]
    assert statistics.mean(new) <= statistics.mean(old), (n, k)
    assert max(new) <= max(old), (n, k)


@pytest.mark.parametrize("n", [4, 5, 6, 8])
def test_for_few_patches_the_old_search_broke_the_naive_bound(n: int) -> None:
    """Why one culprit among n <= 8 costs up to n here: the search before issue 17 found one culprit in
    about log2(n) + 1 trials but went over the naive count with two or three (its frozen counts); the
    minimax table finds no plan of patches alone and prefixes that keeps three within the naive count
    unless a single culprit may cost n."""
    old = {c["k"]: c for c in cells() if c["n"] == n}
    assert any(max(old[k]["v1_launches"]) > naive_count(n, k) for k in (2, 3)), n
    assert budgets(n)[0] == n
    names = [f"p{i:02d}" for i in range(n)]
    assert max(launches(names, (c,)) for c in names) == naive_count(n, 1)
    # What it keeps: on average over k = 1..3 it costs less than the old search.
    new = [statistics.mean(launches(names, bad) for bad in old[k]["culprits"]) for k in (1, 2, 3)]
    assert statistics.mean(new) < statistics.mean(statistics.mean(old[k]["v1_launches"]) for k in (1, 2, 3))


@pytest.mark.parametrize("cell", [c for c in cells() if c["n"] <= 16], ids=lambda c: f"n{c['n']}-k{c['k']}")
def test_the_singles_plan_never_exceeds_the_naive_plan(cell: dict[str, Any]) -> None:
    names = [f"p{i:02d}" for i in range(cell["n"])]
    for bad in cell["culprits"]:
        assert launches(names, bad, plan="singles") <= naive_count(cell["n"], cell["k"]), bad


@pytest.mark.parametrize("n", [8, 12, 16])
def test_a_prior_keeps_the_naive_bound(n: int) -> None:
    """Triage's ranking reorders the search and widens its budgets by one, never past the naive count:
    every placement of up to three culprits, with the ranking right, wrong and shuffled."""
    names = [f"p{i:02d}" for i in range(n)]
    rankings = [names[::-1], names[n // 2 :] + names[: n // 2]]
    for k in (1, 2, 3):
        for bad in itertools.combinations(names, k):
            for prior in [*rankings, list(bad)]:
                assert launches(names, bad, prior=prior) <= naive_count(n, k), (bad, prior[:3])


def test_the_issue_example_five_patches_two_culprits() -> None:
    """Issue 17 measured 12 trials on 5 patches with 2 single culprits; the naive plan takes 10 with its checks."""
    names = [f"p{i}" for i in range(5)]
    worst = max(launches(names, (a, b)) for i, a in enumerate(names) for b in names[i + 1 :])
    assert worst <= naive_count(5, 2) == 10


def test_single_culprits_among_many_stay_near_log2_n_plus_3() -> None:
    for n in (16, 32, 64):
        names = [f"p{i:02d}" for i in range(n)]
        worst = max(launches(names, (c,)) for c in names)
        assert worst <= math.ceil(math.log2(n)) + 4, (n, worst)


@pytest.mark.parametrize("n", [8, 16, 32])
def test_a_stack_with_countless_minimal_sets_stops_at_the_trial_limit(n: int) -> None:
    """The stack fails whenever half of the patches or more are on (say, a memory budget): every half is a
    minimal failing set, far too many to list. Discovery stops at 3n + 30 configurations, says so, and
    skips the interaction checks; only the check of everything but the sets it found follows."""
    names = [f"p{i:02d}" for i in range(n)]
    seen: set[tuple[str, ...]] = set()

    def judge(configs: Sequence[tuple[str, ...]]) -> list[Judgement]:
        seen.update(configs)
        return [Judgement(c, Conclusion.FAIL if len(c) >= n // 2 else Conclusion.PASS) for c in configs]

    search = Search(names, judge)
    result = search.run()
    assert search.max_trials == 3 * n + 30
    assert any("stopped searching after" in note for note in result.notes), result.notes
    assert len(seen) <= search.max_trials + 1
    assert all(len(c.patches) == n // 2 for c in result.culprits) and result.culprits
