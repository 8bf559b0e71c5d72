"""The seed's symptom on smol-moe, measured by speedtrap's own recall probe: with the routed scaling
factor applied twice (``hash_topk_routed_scaling``, a patch built to do exactly that), short prompts
keep their facts and long prompts lose them; the baseline keeps them at every length."""

from __future__ import annotations

import dataclasses

import pytest

from speedtrap.pipeline import demo_settings
from speedtrap.probe import InProcessBackend, RecallReference, RecallReport, RecallSettings, run_recall, wilson
from speedtrap.probe._sequential import length_reading
from speedtrap.targets._base import InProcessModel

CULPRIT = "hash_topk_routed_scaling"
# The demo's grid: 10 questions at each of the two lengths smol-moe is calibrated at (README,
# "Calibrating the seed bug's symptom"), so this is also what `speedtrap demo` shows.
GRID = RecallSettings(**demo_settings().recall)
SHORT, LONG = GRID.lengths


def _by_length(report: RecallReport) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for s in report.samples:
        correct, n = out.get(s.length, (0, 0))
        out[s.length] = (correct + s.correct, n + 1)
    return out


@pytest.mark.slow
def test_the_double_factor_loses_facts_in_long_prompts_only(smol: InProcessModel) -> None:
    base = _by_length(run_recall(InProcessBackend(smol), GRID, progress=False))
    bug = _by_length(run_recall(InProcessBackend(smol, [CULPRIT]), GRID, progress=False))
    print(f"\nrecall by length: baseline {base}, {CULPRIT} {bug}")
    for length in (SHORT, LONG):
        correct, n = base[length]
        assert n == 10 and correct / n >= 0.9, ("baseline", length, base)
    correct, n = bug[SHORT]
    assert correct / n >= 0.9, ("short prompts keep their facts", bug)
    correct, n = bug[LONG]
    assert correct / n <= 0.3, ("long prompts lose them", bug)
    assert wilson(correct, n)[1] < wilson(*base[LONG])[0], ("the intervals are apart", base, bug)


@pytest.mark.slow
def test_sequential_verdicts_match_the_full_grid(smol: InProcessModel) -> None:
    """The demo's grid asked sequentially against the baseline: each length of the culprit stops with
    the verdict the full grid's reading gives, on fewer questions, and the answers it asked are the
    full grid's answers (the same conversations)."""
    full_base = run_recall(InProcessBackend(smol), GRID, progress=False)
    full_bug = run_recall(InProcessBackend(smol, [CULPRIT]), GRID, progress=False)
    seq = dataclasses.replace(GRID, sequential=True)
    reference = RecallReference(InProcessBackend(smol))
    bug = run_recall(InProcessBackend(smol, [CULPRIT]), seq, progress=False, reference=reference)
    print("\n" + "\n".join(s.sentence() for s in bug.stops))
    base_n, bug_n = _by_length(full_base), _by_length(full_bug)
    for stop in bug.stops:
        full = length_reading(*base_n[stop.length], *bug_n[stop.length])
        assert stop.decision == full, (stop, full)
    assert [s.decision for s in bug.stops] == ["kept", "lost"]
    assert len(bug.samples) < len(full_bug.samples)
    answers = full_bug.answers()
    assert all(answers[k] == v for k, v in bug.answers().items())
    base_answers = full_base.answers()
    assert all(base_answers[k] == s.answer for k, s in reference.samples.items())
