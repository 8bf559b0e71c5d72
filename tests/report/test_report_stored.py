"""A report built from a stored run directory: the same report.json as the code that wrote the fixture.

``data/probe_run`` holds probe parts as the probes write them and as older versions wrote them
(recall without pooled figures or a cell's ``correct``, divergence phases as a list with ``buckets``,
null and missing figures); ``data/probe_run_report.json`` is the report the code at 2d4b1b2 (the
report's own copies of the probe types) built from it. The report now holds the probes' own types.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from speedtrap.probe import KLStats, PhaseDivergence, RecallCell
from speedtrap.report import ReportData, load_report_data, schema_errors

DATA = Path(__file__).parent / "data"


def _stable(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without what changes from run to run (the time, the version, the folder)."""
    out = {k: v for k, v in doc.items() if k not in ("generated_at", "speedtrap_version")}
    out["run"] = {k: v for k, v in doc["run"].items() if k != "run_dir"}
    return out


def test_a_stored_run_gives_the_same_report_json_as_before() -> None:
    document = load_report_data(DATA / "probe_run").to_json()
    expected = (DATA / "probe_run_report.json").read_text(encoding="utf-8")  # written from the repository root
    text = json.dumps(_stable(document), indent=1).replace(str(DATA / "probe_run"), "tests/report/data/probe_run")
    assert text + "\n" == expected  # the same text, key order included
    assert schema_errors(document) == []


def test_the_report_holds_the_probes_own_types_and_round_trips() -> None:
    data = load_report_data(DATA / "probe_run")
    recall, divergence = data.recall, data.divergence
    assert [r.label for r in recall] == ["baseline", "all patches"]
    assert all(isinstance(c, RecallCell) for r in recall for c in (r.overall, *r.cells))
    older = recall[1]  # no pooled figures: pooled from the cells; a cell without 'correct': from its accuracy
    assert (older.overall.n, older.overall.correct) == (4, 1) and older.cells[0].correct == 1
    assert older.cells[0].prompt_tokens is None and recall[0].cells[0].prompt_tokens == 250
    phases = {r.label: r.phases for r in divergence}
    assert list(phases["all patches"]) == ["prefill", "decode"]  # the probe wrote decode first
    prefill = phases["all patches"]["prefill"]
    assert isinstance(prefill, PhaseDivergence) and isinstance(prefill.overall, KLStats)
    assert math.isnan(prefill.by_bucket[1].stats.kl_max)  # null in the part: NaN here, null in report.json
    assert math.isnan(phases["p1"]["decode"].overall.same_top1) and phases["p1"]["decode"].by_bucket == []
    again = ReportData.from_json(json.loads(json.dumps(data.to_json())))
    assert again.to_json() == data.to_json()
    assert again == data


def test_a_divergence_reading_reaches_the_report(tmp_path: Path) -> None:
    """The probe's reading (where the figures place the fault) is carried into report.json, the Markdown and the
    HTML, under the divergence table; a part without one adds nothing (the test above)."""
    import shutil

    from speedtrap.report._html import render_html
    from speedtrap.report._markdown import markdown_text

    run = tmp_path / "run"
    shutil.copytree(DATA / "probe_run", run)
    part = run / "probes" / "divergence-p1.json"
    doc = json.loads(part.read_text())
    said = "the fault is on the decode side <here>"
    doc["result"]["reading"] = said
    part.write_text(json.dumps(doc))
    data = load_report_data(run)
    document = data.to_json()
    assert {d["label"]: d.get("reading") for d in document["divergence"]} == {"p1": said, "all patches": None}
    assert schema_errors(document) == []
    assert f"Reading of p1: {said}." in markdown_text(data, [])
    html = render_html(data, tmp_path / "html").read_text()
    assert "Reading of p1: the fault is on the decode side &lt;here&gt;." in html
