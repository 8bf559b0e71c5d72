"""Where the divergence's figures place the fault: the first decode step that leaves the baseline, and the
decode-side reading (a decode that did not receive the prefill's KV), on figures built by construction.

The real case (a PD stack whose KV transfer moves nothing) is ``tests/sglang/test_sglang_pd.py``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speedtrap.probe import PhaseDivergence
from speedtrap.probe._divergence import Departure, DivergenceReport, DivergenceSettings, decode_side_reading
from speedtrap.probe._stats import PositionStat

START = 300  # the decode's first position


def _steps(same: list[bool], kls: list[float]) -> list[PositionStat]:
    return [PositionStat(START + i, kl, s, None) for i, (s, kl) in enumerate(zip(same, kls, strict=True))]


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 50)), max_size=12))
def test_the_departure_is_the_first_step_whose_argmax_differs(steps: list[tuple[bool, float]]) -> None:
    found = Departure.of(_steps([s for s, _ in steps], [k for _, k in steps]))
    brute = [(i, kl) for i, (same, kl) in enumerate(steps) if not same]
    assert (found is None) == (not brute)
    if found is not None:
        assert (found.step, found.kl) == brute[0]


def _phases(prefill_same: list[bool], prefill_kl: list[float]) -> dict[str, PhaseDivergence]:
    prefill = [PositionStat(i + 1, kl, s, None) for i, (s, kl) in enumerate(zip(prefill_same, prefill_kl, strict=True))]
    return {"prefill": PhaseDivergence.of(prefill, 64), "decode": PhaseDivergence.of([], 64)}


AGREES = _phases([True] * 5, [0.0, 1e-4, 2e-3, 0.0, 1e-5])


def test_a_decode_wrong_from_its_first_kv_step_while_the_prefill_agrees_is_read_as_the_decode_side() -> None:
    text = decode_side_reading(AGREES, [Departure(1, 9.5), Departure(1, 7.25)])
    assert text is not None
    assert "decode step 1 in 2 of 2" in text and "KL 7.25-9.5" in text and "largest KL 0.002" in text
    assert "did not receive the prefill's KV" in text and len(text) < 400


def test_a_bit_identical_prompt_and_a_decode_that_leaves_it_later_is_read_as_the_decode_side() -> None:
    exact = _phases([True] * 4, [0.0] * 4)
    text = decode_side_reading(exact, [Departure(2, 2.13), None])
    assert text is not None and "bit-identical" in text and "at step 2 (1 of 2 sequence(s), KL 2.13)" in text
    assert "did not receive" not in text  # step 2: not the first KV read
    assert "first token read from the KV cache" in str(decode_side_reading(exact, [Departure(1, 0.5)]))
    assert decode_side_reading(exact, [None, None]) is None  # the decode never left the baseline


def test_no_reading_unless_every_condition_was_measured() -> None:
    assert decode_side_reading(AGREES, [Departure(2, 9.5)]) is None  # the first KV step agreed
    assert decode_side_reading(AGREES, [Departure(0, 9.5)]) is None  # the prefill's own token already differs
    assert decode_side_reading(AGREES, [Departure(1, 9.5), None]) is None  # one sequence never left
    assert decode_side_reading(AGREES, [Departure(1, 1e-3)]) is None  # no worse than a prefill position
    assert decode_side_reading(AGREES, []) is None
    assert decode_side_reading(_phases([True, False], [0.0, 0.5]), [Departure(1, 9.5)]) is None  # prefill differs
    assert decode_side_reading(_phases([], []), [Departure(1, 9.5)]) is None  # no prefill measured


def test_the_reading_and_the_departures_survive_json() -> None:
    report = DivergenceReport("base", "cand", DivergenceSettings.quick(), AGREES, departures=[Departure(1, 9.5)])
    doc = report.to_json()
    assert doc["departures"] == [{"step": 1, "kl": 9.5}] and doc["reading"] == report.reading() is not None
    again = DivergenceReport.from_json(doc)
    assert again.departures == report.departures and again.to_json() == doc
    old = {k: v for k, v in doc.items() if k not in ("departures", "reading")}  # a report written before them
    assert DivergenceReport.from_json(old).reading() is None


def test_the_gate_prints_the_reading_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from speedtrap.cli._record import _print_gate
    from speedtrap.regress import Check, GateResult

    text = str(decode_side_reading(AGREES, [Departure(1, 9.5)]))
    failed = Check("worst.kl_p99", "divergence", 9.5, "worst.kl_p99<=0.1", False, "regression: worst.kl_p99 = 9.5")
    _print_gate(GateResult("base.strec", "http://127.0.0.1:1", [failed], reading=text), None)
    lines = capsys.readouterr().out.splitlines()
    assert f"reading: {text}" in lines  # whole, whatever the terminal's width: a line to grep in a CI log
