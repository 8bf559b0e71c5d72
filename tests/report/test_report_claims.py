"""The report says what was measured and no more: every evidence sentence needs its stage's data.

Run directories are cut down from one real run (no triage, no diffs, no recall, no divergence, no
isolation, no localization, and combinations); whatever is left, no sentence may claim a stage
that is not there, and the page and the Markdown say the same.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from speedtrap.report import render_run, schema_errors

# The sentence that each stage's evidence starts with, and what in the run directory it needs.
CLAIMS = {
    "triage": "Triage",
    "recall": "Planted-fact recall",
    "divergence": "Teacher-forced divergence",
    "isolate": "Isolation ran",
    "localize": ("Layer diff", "Scale check"),
}
CUTS = ("no_triage", "no_diffs", "no_recall", "no_divergence", "no_isolation", "no_localization")


def _cut(run: Path, cut: str) -> None:
    if cut == "no_triage":
        (run / "triage.json").unlink()
    elif cut == "no_diffs":  # triage ran but was given no diff for any patch
        part = json.loads((run / "triage.json").read_text())
        for patch in part["result"]["patches"]:
            patch["diff"] = ""
            patch["diff_given"] = False
        (run / "triage.json").write_text(json.dumps(part))
    elif cut in ("no_recall", "no_divergence"):
        kind = cut.removeprefix("no_")
        for f in (run / "probes").glob(f"{kind}-*.json"):
            f.unlink()
    elif cut == "no_isolation":
        shutil.rmtree(run / "isolate")
    elif cut == "no_localization":
        shutil.rmtree(run / "localize", ignore_errors=True)


def _starts(evidence: list[str], words: str | tuple[str, ...]) -> list[str]:
    return [line for line in evidence if line.startswith(words)]


PAIRS = [
    ("no_diffs", "no_recall"),
    ("no_triage", "no_isolation"),
    ("no_recall", "no_divergence"),
    ("no_isolation", "no_localization"),
    ("no_diffs", "no_localization"),
]


@pytest.mark.parametrize("cuts", [(c,) for c in CUTS] + PAIRS)
def test_no_sentence_claims_a_stage_that_is_not_there(run_copy: Path, cuts: tuple[str, ...]) -> None:
    for cut in cuts:
        _cut(run_copy, cut)
    data, paths = render_run(run_copy)
    document = json.loads(paths.json.read_text())
    assert schema_errors(document) == []
    evidence = list(data.verdict.evidence)
    if "no_triage" in cuts or "no_diffs" in cuts:
        assert _starts(evidence, CLAIMS["triage"]) == [], evidence
    if "no_recall" in cuts:
        assert _starts(evidence, CLAIMS["recall"]) == [], evidence
    if "no_divergence" in cuts:
        assert _starts(evidence, CLAIMS["divergence"]) == [], evidence
    if "no_isolation" in cuts:
        assert _starts(evidence, CLAIMS["isolate"]) == [], evidence
        assert data.verdict.culprits == (), "no isolation, so no culprit may be named"
    if "no_localization" in cuts:
        assert _starts(evidence, CLAIMS["localize"]) == [], evidence
    lines = paths.markdown.read_text().splitlines()
    listed = [line.split(". ", 1)[1] for line in lines if ". " in line[:4] and line.split(".", 1)[0].isdigit()]
    claims = _all_claims()
    assert [x for x in listed if x.startswith(claims)] == [e for e in evidence if e.startswith(claims)]


def _all_claims() -> tuple[str, ...]:
    out: list[str] = []
    for words in CLAIMS.values():
        out.extend((words,) if isinstance(words, str) else words)
    return tuple(out)


def test_a_run_whose_triage_read_no_diff_says_so(run_copy: Path) -> None:
    _cut(run_copy, "no_diffs")
    part = json.loads((run_copy / "triage.json").read_text())
    assert all(not p["diff_given"] for p in part["result"]["patches"])
    data, _ = render_run(run_copy)
    assert data.triage is not None
    assert all(not row.diff_given for row in data.triage.rows)
