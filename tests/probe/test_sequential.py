"""The sequential recall test's error rates, checked by brute force: Bernoulli losses drawn at the
hypotheses' edges, the test run on each sequence, the stops counted (no model)."""

from __future__ import annotations

import dataclasses
import math
import random
import re

import pytest

from speedtrap._errors import ProbeError, UsageError
from speedtrap.probe import ChatAnswer, LengthStop, RecallReference, RecallReport, RecallSettings, Sprt, run_recall
from speedtrap.probe._sequential import length_reading, paired_decision

RUNS = 20_000


def _stop_rate(test: Sprt, q: float, wanted: str, maximum: int, seed: int) -> float:
    """The share of ``RUNS`` sequences (each trial a loss with probability ``q``, at most ``maximum``
    trials) on which the test stops with ``wanted``."""
    rng = random.Random(seed)
    hits = 0
    for _ in range(RUNS):
        losses = keeps = 0
        for _ in range(maximum):
            if rng.random() < q:
                losses += 1
            else:
                keeps += 1
            decision = test.decide(losses, keeps)
            if decision is not None:
                hits += decision == wanted
                break
    return hits / RUNS


def _mc_error(rate: float) -> float:
    return 3 * math.sqrt(max(rate * (1 - rate), 1e-4) / RUNS)


@pytest.mark.parametrize("alpha, beta", [(0.05, 0.2), (0.01, 0.1), (0.2, 0.3)])
@pytest.mark.parametrize("maximum", [10, 400])
def test_error_rates_hold_by_simulation(alpha: float, beta: float, maximum: int) -> None:
    test = Sprt(alpha=alpha, beta=beta)
    false_lost = _stop_rate(test, test.q0, "lost", maximum, seed=1)
    false_kept = _stop_rate(test, test.q1, "kept", maximum, seed=2)
    assert false_lost <= alpha + _mc_error(alpha)
    assert false_kept <= beta + _mc_error(beta)
    # inside H0 and H1 the rates only fall (the likelihood ratio is monotone in q)
    assert _stop_rate(test, test.q0 / 3, "lost", maximum, seed=3) <= alpha + _mc_error(alpha)
    assert _stop_rate(test, (1 + test.q1) / 2, "kept", maximum, seed=4) <= beta + _mc_error(beta)


def test_the_test_has_power_where_the_answer_is_plain() -> None:
    test = Sprt()
    assert _stop_rate(test, 0.0, "kept", 10, seed=5) == 1.0  # keeps every fact: kept within 10
    assert _stop_rate(test, 0.9, "lost", 10, seed=6) > 0.99  # loses 9 in 10: lost within 10


def test_boundaries_by_hand() -> None:
    test = Sprt()  # log(1/0.05) = 3.00; log(0.2) = -1.61; a loss +1.20, a keep -0.53
    assert test.decide(0, 3) is None and test.decide(0, 4) == "kept"
    assert test.decide(2, 0) is None and test.decide(3, 0) == "lost"
    assert test.decide(3, 1) == "lost" and test.decide(3, 2) is None  # 3.08 >= 3.00; 2.55 is not
    assert math.isclose(test.llr(3, 1), 3 * math.log(0.5 / 0.15) + math.log(0.5 / 0.85))


def test_a_stop_needs_the_full_grids_reading_too() -> None:
    test = Sprt()
    # three losses cross the test's boundary, but 0/3 against 3/3 is not Wilson-apart: ask on
    assert paired_decision(test, [(True, False)] * 3) is None
    assert length_reading(3, 3, 0, 3) is None
    assert paired_decision(test, [(True, False)] * 5) == "lost"  # 0/5 against 5/5: apart
    assert paired_decision(test, [(True, False)] * 5 + [(True, True)]) == "lost"  # 1/6 against 6/6
    assert paired_decision(test, [(True, True)] * 4) == "kept"
    assert paired_decision(test, [(False, False)] * 8) is None  # the reference knew none: nothing to test


def test_bad_error_rates_are_one_line() -> None:
    with pytest.raises(UsageError, match="alpha must lie in"):
        Sprt(alpha=0.0)
    with pytest.raises(UsageError, match="beta must lie in"):
        Sprt(beta=0.7)


def test_stop_sentence() -> None:
    stop = LengthStop(1280, "lost", 6, 10, 1, 6, 0.05, 0.2)
    assert stop.sentence() == "stopped after 6 of 10 questions: 1/6 against 6/6 at 1,280 tokens, lost (alpha 0.05)"
    assert LengthStop.from_json(stop.to_json()) == stop
    assert LengthStop(128, "undecided", 10, 10, 8, 10, 0.05, 0.2).sentence().startswith("undecided after all 10")


class _Fake:
    """A backend that answers by construction: it reads the planted fact back from the conversation,
    except in prompts longer than ``forget_above`` tokens (about four characters a token) or, with
    ``blind``, never. Counts the questions it is asked."""

    def __init__(self, name: str, forget_above: int = 10**9, blind: bool = False) -> None:
        self.name, self.forget_above, self.blind, self.asked = name, forget_above, blind, 0

    async def count_tokens(self, messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"]) // 4 + 4 for m in messages)

    async def chat(self, messages: list[dict[str, str]], max_tokens: int) -> ChatAnswer:
        self.asked += 1
        tokens = await self.count_tokens(messages)
        key = messages[-1]["content"]
        text = "I do not know."
        if not self.blind and tokens <= self.forget_above:
            for m in messages:
                for hit in re.finditer(r"the access code for (.+?) is (\d+)\.", m["content"]):
                    if hit.group(1) in key:
                        text = hit.group(2)
        return ChatAnswer(text, tokens)


GRID = RecallSettings(lengths=(128, 1280), depths=(0.1, 0.3, 0.5, 0.7, 0.9), samples=2, sequential=True)


def test_rounds_stop_each_length_once_decided_and_share_the_reference() -> None:
    base = _Fake("base")
    reference = RecallReference(base)  # type: ignore[arg-type]
    long_loser = _Fake("bug", forget_above=600)  # loses every fact beyond 600 tokens, by construction
    report = run_recall(long_loser, GRID, reference=reference)  # type: ignore[arg-type]
    stops = {s.length: s for s in report.stops}
    assert (stops[128].decision, stops[128].asked, stops[128].correct) == ("kept", 4, 4)
    assert (stops[1280].decision, stops[1280].asked, stops[1280].correct) == ("lost", 4, 0)
    assert stops[1280].reference_correct == 4 and stops[1280].maximum == 10
    assert long_loser.asked == 8 and base.asked == 8 and len(report.samples) == 8
    # a second candidate reuses the reference's answers: the baseline is asked nothing new
    fine = _Fake("fine")
    again = run_recall(fine, GRID, reference=reference)  # type: ignore[arg-type]
    assert [s.decision for s in again.stops] == ["kept", "kept"] and base.asked == 8
    # the report keeps where it stopped
    assert RecallReport.from_json(report.to_json()).stops == report.stops
    assert reference.report(GRID).overall.n == 8


def test_an_undecided_length_runs_to_the_grid() -> None:
    blind = _Fake("blind", blind=True)
    reference = RecallReference(_Fake("blind-base", blind=True))  # type: ignore[arg-type]
    report = run_recall(blind, GRID, reference=reference)  # type: ignore[arg-type]
    assert [(s.decision, s.asked) for s in report.stops] == [("undecided", 10), ("undecided", 10)]
    assert len(report.samples) == 20


def test_a_full_grid_without_a_reference_is_unchanged() -> None:
    full = dataclasses.replace(GRID, sequential=False)
    report = run_recall(_Fake("bug", forget_above=600), full)  # type: ignore[arg-type]
    assert len(report.samples) == 20 and not report.stops
    assert "sequential" not in full.to_json()  # a full grid's stored settings read as before
    assert RecallSettings.from_json(GRID.to_json()) == GRID


def test_a_reference_of_known_answers_alone_decides_as_a_live_one_and_names_a_missing_answer() -> None:
    """A server's baseline is measured with its whole grid and stopped before the candidate starts: the
    candidate is asked in rounds against those answers (no server behind the reference), with the verdicts
    and stops a live reference gives; a question the answers lack is an error naming it, not a loss."""
    full = dataclasses.replace(GRID, sequential=False)
    baseline = run_recall(_Fake("base"), full)  # type: ignore[arg-type]
    known = RecallReference(None, baseline.samples)
    live = run_recall(_Fake("bug", forget_above=600), GRID, reference=RecallReference(_Fake("base")))  # type: ignore[arg-type]
    bug = _Fake("bug", forget_above=600)
    report = run_recall(bug, GRID, reference=known)  # type: ignore[arg-type]
    assert report.stops == live.stops and bug.asked == 8
    assert [s.decision for s in report.stops] == ["kept", "lost"]
    short = RecallReference(None, [s for s in baseline.samples if s.length != 1280])
    with pytest.raises(ProbeError) as caught:
        run_recall(_Fake("bug", forget_above=600), GRID, reference=short)  # type: ignore[arg-type]
    assert "holds no answer to" in caught.value.one_line() and "whole grid" in caught.value.one_line()
