"""The public-incident corpus's split into a development half and a held-out half
(benchmarks/triage_incidents/split.py): fixed by a rule over the order incidents were added, recorded in full,
and kept when incidents are appended."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from triage_incidents.corpus import CASES, ORDER  # noqa: E402
from triage_incidents.split import DEV, HELD_OUT, by_rule, check, half_of  # noqa: E402


def test_recorded_halves_are_the_rule_over_the_order() -> None:
    assert by_rule(ORDER) == (DEV, HELD_OUT)
    check(ORDER)  # does not raise


def test_halves_cover_every_incident_once_and_are_halves() -> None:
    ids = {c.id for c in CASES}
    assert set(DEV) | set(HELD_OUT) == ids
    assert not set(DEV) & set(HELD_OUT)
    assert abs(len(DEV) - len(HELD_OUT)) <= 1


def test_appending_keeps_every_incident_in_its_half() -> None:
    dev, held = by_rule((*ORDER, "new-a", "new-b", "new-c"))
    assert dev[: len(DEV)] == DEV and held[: len(HELD_OUT)] == HELD_OUT
    assert "new-a" in (dev if len(ORDER) % 2 == 0 else held)


def test_a_reorder_that_moves_an_incident_is_refused() -> None:
    moved = (ORDER[1], ORDER[0], *ORDER[2:])  # the first two swap halves
    with pytest.raises(SystemExit, match="append new incidents at the end"):
        check(moved)
    with pytest.raises(SystemExit):
        check(ORDER[1:])  # one removed from the front shifts every later one


def test_half_of_names_each_half() -> None:
    assert half_of(DEV[0]) == "dev" and half_of(HELD_OUT[0]) == "heldout"
    with pytest.raises(KeyError):
        half_of("no-such-incident")


def test_bench_refuses_a_held_out_incident_without_the_held_out_half() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH / "bench_triage_incidents.py"), "--only", HELD_OUT[0]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert "--half heldout" in run.stderr and "Traceback" not in run.stderr
