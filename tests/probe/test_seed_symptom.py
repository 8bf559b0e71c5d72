"""The seed's symptom on smol-moe, measured by speedtrap's own recall probe: with the routed scaling
factor applied twice (``hash_topk_routed_scaling``, a patch built to do exactly that), short prompts
keep their facts and long prompts lose them; the baseline keeps them at every length."""

from __future__ import annotations

import pytest

from speedtrap.pipeline import demo_settings
from speedtrap.probe import InProcessBackend, RecallReport, RecallSettings, run_recall, wilson
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
