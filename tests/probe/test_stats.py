"""Wilson intervals, quantiles and KL summaries against known values and brute force."""

from __future__ import annotations

import asyncio
import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speedtrap.probe import KLStats, build_conversation, wilson
from speedtrap.probe._conversations import assemble, filler_turns, plant_facts
from speedtrap.probe._divergence import approx_kl
from speedtrap.probe._results import PhaseDivergence
from speedtrap.probe._stats import PositionStat, quantile


@pytest.mark.parametrize(
    ("correct", "n", "low", "high"),
    [  # published Wilson 95% intervals (z = 1.96), e.g. Newcombe (1998) table I and standard references
        (0, 10, 0.0, 0.2775),
        (1, 10, 0.0179, 0.4042),
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
    ],
)
def test_wilson_matches_known_values(correct: int, n: int, low: float, high: float) -> None:
    got = wilson(correct, n)
    assert got == pytest.approx((low, high), abs=1e-4)


@given(st.integers(1, 10_000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_the_estimate_and_narrows_with_n(case: tuple[int, int]) -> None:
    correct, n = case
    low, high = wilson(correct, n)
    assert 0.0 <= low <= correct / n <= high <= 1.0
    low4, high4 = wilson(4 * correct, 4 * n)
    assert high4 - low4 < high - low + 1e-12


def test_wilson_edge_cases() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(3, 2)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=200), st.floats(0, 1))
def test_quantile_is_numpys_linear_percentile(values: list[float], q: float) -> None:
    assert quantile(sorted(values), q) == pytest.approx(float(np.quantile(values, q)), rel=1e-9, abs=1e-6)


def test_kl_stats_summary_by_brute_force() -> None:
    kl = [float(i) for i in range(101)]
    stats = KLStats.of(kl, [i % 4 != 0 for i in range(101)], [0.1] * 50 + [-0.1] * 51)
    assert stats.kl_mean == 50 and stats.kl_median == 50 and stats.kl_max == 100
    assert stats.kl_p90 == pytest.approx(90) and stats.kl_p99 == pytest.approx(99)
    assert stats.same_top1 == pytest.approx(75 / 101)
    assert stats.rms_dp == pytest.approx(0.1)
    assert KLStats.from_json(stats.to_json()) == stats


def test_buckets_split_positions() -> None:
    stats = [PositionStat(p, float(p), True, 0.0) for p in range(1, 300)]
    phase = PhaseDivergence.of(stats, 128)
    got = [(b.start, b.end, b.stats.tokens) for b in phase.by_bucket]
    assert got == [(0, 128, 127), (128, 256, 128), (256, 384, 44)]
    assert phase.overall.tokens == 299
    assert PhaseDivergence.from_json(phase.to_json()) == phase


def _dist(logits: list[float]) -> dict[str, float]:
    z = math.log(sum(math.exp(v) for v in logits))
    return {f"t{i}": v - z for i, v in enumerate(logits)}


@given(
    st.lists(st.floats(-5, 5), min_size=3, max_size=12).flatmap(
        lambda p: st.tuples(st.just(p), st.lists(st.floats(-5, 5), min_size=len(p), max_size=len(p)))
    ),
    st.integers(1, 12),
)
def test_topk_kl_is_a_lower_bound_of_the_full_kl(case: tuple[list[float], list[float]], k: int) -> None:
    p, q = _dist(case[0]), _dist(case[1])
    full = sum(math.exp(lp) * (lp - q[t]) for t, lp in p.items())
    top_p = dict(sorted(p.items(), key=lambda kv: -kv[1])[:k])
    top_q = dict(sorted(q.items(), key=lambda kv: -kv[1])[:k])
    with_all_q = approx_kl(top_p, q)  # candidate probabilities known: coarse-graining can only lose KL
    assert with_all_q <= full + 1e-9
    assert approx_kl(p, q) == pytest.approx(max(full, 0.0), abs=1e-9)  # everything listed: exact
    assert approx_kl(top_p, top_p) == 0.0
    assert approx_kl(top_p, top_q) >= 0.0


@given(st.integers(64, 3000), st.integers(0, 10**6), st.integers(2, 9), st.integers(0, 40))
def test_conversation_length_search_matches_brute_force(length: int, seed: int, chars: int, overhead: int) -> None:
    """The filler-turn search finds the largest conversation that fits, as trying every count does."""

    async def count(messages: list[dict[str, str]]) -> int:  # a monotone stand-in tokenizer
        return sum(len(m["content"]) // chars + overhead + (hash(m["content"]) % 3) for m in messages)

    conv, tokens = asyncio.run(build_conversation("c", length, (0.3, 0.7), seed, count))
    rng = random.Random(seed)
    facts = plant_facts(rng, (0.3, 0.7))
    pool = filler_turns(rng, max(1, length // 16))
    question = {"role": "user", "content": max(facts, key=lambda f: len(f.question())).question()}
    sizes = [asyncio.run(count([*assemble(facts, pool[:n]), question])) for n in range(len(pool) + 1)]
    fits = [n for n, t in enumerate(sizes) if t <= length]
    best = max(fits) if fits else 0
    assert conv.turns == assemble(facts, pool[:best])
    assert tokens == sizes[best]
