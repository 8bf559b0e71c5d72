"""The divergence probe's exact early stop: brute force over value lists, a constructed culprit, a harmless run.

Ground truth is never the decision under test: the brute-force test compares with numpy's quantile (and plain
mean and share) of the full value list, and the smol-moe tests compare with the full grid's figures.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from probe_helpers import Server, free_port, serve_argv, start_server, stop_server

from speedtrap.probe import (
    DivergenceGoal,
    DivergenceReport,
    DivergenceSettings,
    HttpBackend,
    InProcessBackend,
    adivergence_against,
    record,
    run_divergence,
)
from speedtrap.probe._divergence_stop import QUANTILES, phase_fails, quantile_need
from speedtrap.spec import Bound
from speedtrap.targets._base import InProcessModel

KL = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


@settings(max_examples=400, deadline=None)
@given(
    seen=st.lists(st.tuples(KL, st.booleans()), max_size=40),
    rest=st.lists(st.tuples(KL, st.booleans()), max_size=40),
    slack=st.integers(min_value=0, max_value=20),
    bound=st.sampled_from([0.0, 0.05, 0.5, 1.0, 2.5]),
    stat=st.sampled_from([*QUANTILES, "kl_mean", "same_top1"]),
)
def test_a_decided_fail_is_the_full_lists_verdict(
    seen: list[tuple[float, bool]], rest: list[tuple[float, bool]], slack: int, bound: float, stat: str
) -> None:
    """The seen values are a prefix of the full list (a random truncation point); the rest is anything, and the
    grid could have held ``slack`` more positions than it did (``M_max`` above the final count)."""
    full = seen + rest
    m_max = len(full) + slack
    kl, same = [v for v, _ in seen], [s for _, s in seen]
    if not phase_fails(stat, bound, kl, same, m_max):
        return
    values = np.array([v for v, _ in full]) if full else np.array([0.0])
    if stat in QUANTILES:
        assert float(np.quantile(values, QUANTILES[stat])) > bound
    elif stat == "kl_mean":
        assert float(values.mean()) > bound
    else:
        share = sum(s for _, s in full) / len(full) if full else 1.0  # no position: KLStats's 1.0
        assert share < bound


@given(q=st.sampled_from(list(QUANTILES.values())), m=st.integers(min_value=1, max_value=5000))
def test_the_need_never_falls_as_the_grid_grows(q: float, m: int) -> None:
    """The monotonicity the decision rests on: deciding at M_max decides for every smaller final count."""
    assert quantile_need(q, m + 1) >= quantile_need(q, m)


def test_a_p99_with_enough_positions_above_is_decided_and_one_short_is_not() -> None:
    m_max = 399  # 383 prefill positions + 16 decode steps, say
    need = m_max - int(0.99 * (m_max - 1))  # 399 - 394 = 5
    assert need == 5
    assert phase_fails("kl_p99", 0.05, [1.0] * need + [0.0] * 100, [], m_max)
    assert not phase_fails("kl_p99", 0.05, [1.0] * (need - 1) + [0.0] * 100, [], m_max)
    assert not phase_fails("kl_p99", 0.05, [], [], m_max)  # nothing seen: a pass is never decided early


def test_goals_the_stop_cannot_decide_run_the_full_grid() -> None:
    assert DivergenceGoal.of("worst.rms_dp", 0.1, "above") is None
    assert DivergenceGoal.of("prefill.bucket.kl_p99", 0.1, "above") is None
    assert DivergenceGoal.of("worst.kl_p99", 0.05, "above") is not None
    assert DivergenceGoal.of("worst.same_top1", 0.9, "below") is not None


# -- smol-moe, in process ------------------------------------------------------------------------------

SETTINGS = DivergenceSettings(lengths=(272,), sequences=2, decode_tokens=8, bucket_size=64)
GOAL = DivergenceGoal("worst.kl_p99", 0.05, "above")
CULPRIT = "hash_topk_routed_scaling"  # routed-expert weights scaled: KL far above 0.05 (by construction)


def _verdict(report: DivergenceReport) -> bool:
    return Bound.of(GOAL.metric, GOAL.bound, "above").fails(report.figures()[GOAL.metric])


def test_a_culprit_stops_after_the_prefill_with_the_full_grids_verdict(smol: InProcessModel, tmp_path: Path) -> None:
    base = InProcessBackend(smol)
    full = run_divergence(base, InProcessBackend(smol, [CULPRIT]), SETTINGS, progress=False)
    assert full.stopped is None and set(full.phases) == {"prefill", "decode"}
    results = tmp_path / "d.jsonl"
    early = run_divergence(base, InProcessBackend(smol, [CULPRIT]), SETTINGS, progress=False, goal=GOAL,
                           results_path=results)  # fmt: skip
    assert early.stopped is not None and early.stopped.startswith("stopped after the prefill of 2 of 2 sequences")
    assert early.unmeasured == ["decode"] and set(early.phases) == {"prefill"}
    assert "decode.kl_p99" not in early.figures()
    assert _verdict(full) and _verdict(early)  # the same verdict: fails
    assert early.phases["prefill"].to_json() == full.phases["prefill"].to_json()  # the same positions measured
    again = DivergenceReport.from_json(json.loads(json.dumps(early.to_json())))
    assert again.to_json() == early.to_json() and again.stopped == early.stopped
    # resume: the prefill rows written are reused; the stop is decided again without measuring anything new
    resumed = run_divergence(base, InProcessBackend(smol, [CULPRIT]), SETTINGS, progress=False, goal=GOAL,
                             results_path=results, resume=True)  # fmt: skip
    assert resumed.stopped == early.stopped
    # the same results file resumed without the goal measures the decodes and gives the full grid's figures
    completed = run_divergence(base, InProcessBackend(smol, [CULPRIT]), SETTINGS, progress=False,
                               results_path=results, resume=True)  # fmt: skip
    assert completed.figures() == full.figures()


def test_a_harmless_config_runs_the_whole_grid(smol: InProcessModel) -> None:
    base = InProcessBackend(smol)
    report = run_divergence(base, InProcessBackend(smol, []), SETTINGS, progress=False, goal=GOAL)
    assert report.stopped is None and report.unmeasured == []
    assert report.phases["decode"].overall.tokens == SETTINGS.decode_tokens * SETTINGS.sequences
    assert not _verdict(report)


def test_an_old_report_without_the_stop_fields_loads() -> None:
    doc = {"baseline": "a", "candidate": "b", "settings": SETTINGS.to_json(), "phases": {}}
    report = DivergenceReport.from_json(doc)
    assert report.stopped is None and report.goal is None and report.unmeasured == []


@pytest.mark.parametrize("stat", ["kl_p99", "kl_max"])
def test_goal_round_trips(stat: str) -> None:
    goal = DivergenceGoal(f"worst.{stat}", 0.05, "above")
    assert DivergenceGoal(**goal.to_json()) == goal


def test_against_a_recording_the_culprit_stops_and_a_harmless_config_does_not(
    smol: InProcessModel, tmp_path: Path
) -> None:
    recording = record(InProcessBackend(smol), tmp_path / "base.strec", divergence=SETTINGS, progress=False)
    culprit = InProcessBackend(smol, [CULPRIT])
    full = asyncio.run(adivergence_against(recording, culprit, progress=False))
    early = asyncio.run(adivergence_against(recording, culprit, progress=False, goal=GOAL))
    assert full.stopped is None and early.stopped is not None and early.unmeasured == ["decode"]
    assert early.phases["prefill"].to_json() == full.phases["prefill"].to_json()
    assert _verdict(full) and _verdict(early)
    harmless = asyncio.run(adivergence_against(recording, InProcessBackend(smol), progress=False, goal=GOAL))
    assert harmless.stopped is None and not _verdict(harmless)
    assert harmless.phases["decode"].overall.tokens == SETTINGS.decode_tokens * SETTINGS.sequences


def test_over_http_the_culprit_stops_and_the_baseline_runs_the_grid(served: Server, tmp_path: Path) -> None:
    """``speedtrap serve`` with the culprit's config gate on against the baseline server (top-k logprobs)."""
    port = free_port()
    patched = start_server(serve_argv(port, "--set", "apply_routed_scaling_factor_on_output=true"), port,
                           tmp_path / "patched.log")  # fmt: skip
    try:
        http = DivergenceSettings(lengths=(128,), sequences=2, decode_tokens=8, bucket_size=64, top_k=10)
        base, cand = HttpBackend(served.url, "smol-moe"), HttpBackend(patched.url, "smol-moe")
        full = run_divergence(base, cand, http, progress=False)
        early = run_divergence(base, cand, http, progress=False, goal=GOAL)
        assert full.stopped is None and early.stopped is not None and set(early.phases) == {"prefill"}
        assert early.phases["prefill"].to_json() == full.phases["prefill"].to_json()
        assert _verdict(full) and _verdict(early)
        same = run_divergence(base, base, http, progress=False, goal=GOAL)
        assert same.stopped is None and not _verdict(same) and same.phases["decode"].overall.tokens == 16
    finally:
        stop_server(patched)
