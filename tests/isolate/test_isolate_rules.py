"""Verdict rules: thresholds with a narrowing band, recall drops with Wilson intervals."""

from __future__ import annotations

import math

import pytest

from speedtrap.isolate import Outcome, RecallDropRule, ThresholdRule, wilson
from speedtrap.probe import wilson as probe_wilson


def test_wilson_matches_the_probe_package() -> None:
    for correct, n in [(0, 8), (3, 8), (8, 8), (17, 40), (1, 1)]:
        assert wilson(correct, n) == pytest.approx(probe_wilson(correct, n), abs=1e-4)


def test_a_threshold_band_narrows_with_repeats() -> None:
    rule = ThresholdRule("kl", bound=1.0, direction="above", near=0.4)
    assert rule.judge({"kl": 1.5}, None) is Outcome.FAIL
    assert rule.judge({"kl": 0.5}, None) is Outcome.PASS
    assert rule.judge({"kl": 1.3}, None) is Outcome.NEAR
    pooled = rule.pool([{"kl": 1.3}, {"kl": 1.2}, {"kl": 1.4}, {"kl": 1.3}])
    assert pooled["kl"] == pytest.approx(1.3) and pooled["repeats"] == 4
    assert rule.judge(pooled, None) is Outcome.FAIL  # band 1 ± 0.4/sqrt(4) = 0.8..1.2
    assert rule.judge({"kl": math.nan}, None) is Outcome.FAIL
    below = ThresholdRule("same_top1", bound=0.9, direction="below", near=0.0)
    assert below.judge({"same_top1": 0.85}, None) is Outcome.FAIL
    assert below.judge({"same_top1": 0.95}, None) is Outcome.PASS


def test_a_recall_drop_needs_non_overlapping_intervals() -> None:
    rule = RecallDropRule()
    base = rule.pool([{"correct": 16, "n": 16}])
    assert rule.judge(base, None) is Outcome.PASS  # the baseline is the reference
    assert rule.judge(rule.pool([{"correct": 3, "n": 16}]), base) is Outcome.FAIL
    assert rule.judge(rule.pool([{"correct": 15, "n": 16}]), base) is Outcome.PASS
    near = rule.pool([{"correct": 11, "n": 16}])
    _low, high = probe_wilson(11, 16)
    b_low, _ = probe_wilson(16, 16)
    assert high >= b_low and b_low > 11 / 16  # intervals overlap, the point estimate is below: repeat
    assert rule.judge(near, base) is Outcome.NEAR
    # Repeats add up answers, so the interval narrows and the call is made.
    pooled = rule.pool([{"correct": 11, "n": 16}, {"correct": 10, "n": 16}, {"correct": 11, "n": 16}])
    assert pooled["n"] == 48 and pooled["correct"] == 32
    assert rule.judge(pooled, base) is Outcome.FAIL
