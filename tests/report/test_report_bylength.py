"""Recall by prompt length: the symptom sentence is said only when the cells show it, and the figure draws it."""

from __future__ import annotations

from speedtrap._stats import wilson
from speedtrap.probe import RecallCell
from speedtrap.report import _figures
from speedtrap.report._bylength import SYMPTOM, by_length, length_patterns
from speedtrap.report._model import RecallRun
from speedtrap.report._verdict import build_verdict


def _run(label: str, patches: tuple[str, ...], cells: dict[int, list[tuple[int, int]]]) -> RecallRun:
    """``cells``: length -> [(correct, n) per depth]."""
    out = []
    for length, per_depth in cells.items():
        for k, (correct, n) in enumerate(per_depth):
            out.append(RecallCell(length, 0.2 + 0.6 * k, n, correct, correct / n, *wilson(correct, n)))
    total, n = sum(c.correct for c in out), sum(c.n for c in out)
    return RecallRun(label, patches, RecallCell(0, -1.0, n, total, total / n, *wilson(total, n)), tuple(out))


BASE = _run("baseline", (), {128: [(8, 8), (8, 8)], 512: [(8, 8), (7, 8)], 1024: [(8, 8), (8, 8)]})


def test_depths_are_pooled_per_length() -> None:
    rows = by_length(BASE)
    assert [(r.length, r.correct, r.n) for r in rows] == [(128, 16, 16), (512, 15, 16), (1024, 16, 16)]
    assert rows[1].low == wilson(15, 16)[0]


def test_the_symptom_is_said_when_short_keeps_and_long_loses() -> None:
    bug = _run("culprit", ("p",), {128: [(8, 8), (7, 8)], 512: [(6, 8), (5, 8)], 1024: [(1, 8), (2, 8)]})
    (pattern,) = length_patterns([BASE, bug])
    assert pattern.kept == (128,) and pattern.lost == (1024,) and pattern.symptom
    assert (
        SYMPTOM in pattern.sentence() and "3/16 at 1,024 tokens (baseline 16/16, intervals apart)" in pattern.sentence()
    )
    evidence = "\n".join(build_verdict(None, [BASE, bug], [], None, []).evidence)
    assert SYMPTOM in evidence


def test_no_symptom_when_every_length_loses_or_none_does_or_the_order_is_wrong() -> None:
    everywhere = _run("a", ("p",), {128: [(0, 8), (1, 8)], 512: [(0, 8), (0, 8)], 1024: [(1, 8), (0, 8)]})
    nowhere = _run("b", ("q",), {128: [(8, 8), (8, 8)], 512: [(7, 8), (8, 8)], 1024: [(7, 8), (8, 8)]})
    reversed_ = _run("c", ("r",), {128: [(0, 8), (1, 8)], 512: [(8, 8), (8, 8)], 1024: [(8, 8), (8, 8)]})
    noisy = _run("d", ("s",), {128: [(2, 2), (2, 2)], 512: [(2, 2), (1, 2)], 1024: [(1, 2), (1, 2)]})
    patterns = length_patterns([BASE, everywhere, nowhere, reversed_, noisy])
    assert [p.symptom for p in patterns] == [False, False, False, False]
    assert "loses facts at every length" in patterns[0].sentence()
    assert "no drop from the baseline" in patterns[1].sentence()
    assert "not in order of length" in patterns[2].sentence()
    assert patterns[3].lost == ()  # 2/4 against 4/4: the intervals overlap, so no loss is claimed
    text = "\n".join(build_verdict(None, [BASE, everywhere, nowhere, reversed_, noisy], [], None, []).evidence)
    assert SYMPTOM not in text


def test_one_length_or_no_baseline_says_nothing_by_length() -> None:
    one = _run("baseline", (), {512: [(8, 8)]})
    assert length_patterns([one, _run("x", ("p",), {512: [(0, 8)]})]) == []
    assert length_patterns([_run("x", ("p",), {128: [(8, 8)], 1024: [(0, 8)]})]) == []


def test_the_figure_has_one_line_per_run_with_interval_bars() -> None:
    bug = _run("culprit", ("p",), {128: [(8, 8), (7, 8)], 512: [(6, 8), (5, 8)], 1024: [(1, 8), (2, 8)]})
    fig = _figures.recall_by_length([BASE, bug])
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["baseline", "culprit"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["128", "512", "1,024"]
    assert len(_figures.png(fig)) > 1000
