"""report.json: its published schema, validation, and the data model's JSON round trip."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from speedtrap._errors import StoreError
from speedtrap._shapes import LayerGrowth
from speedtrap.report import ReportData, ReportVerdict, load_report_data, report_schema, schema_errors, write_json

REPO = Path(__file__).resolve().parents[2]


def test_the_published_schema_is_the_one_the_package_validates_with() -> None:
    published = json.loads((REPO / "schemas" / "report.schema.json").read_text())
    assert published == report_schema()
    assert published["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert published["properties"]["schema_version"]["const"] == 1


def test_report_json_of_a_real_run_validates_and_round_trips(run_dir: Path) -> None:
    document = json.loads((run_dir / "report.json").read_text())
    assert schema_errors(document) == []
    assert document["kind"] == "speedtrap-report"
    data = ReportData.from_json(document)
    assert data.to_json() == document
    assert ReportData.from_json(json.loads(json.dumps(data.to_json()))) == data


def test_the_schema_rejects_what_a_program_could_not_read(run_dir: Path) -> None:
    document = json.loads((run_dir / "report.json").read_text())
    broken = {k: v for k, v in document.items() if k != "verdict"}
    assert any("verdict" in e for e in schema_errors(broken))
    assert schema_errors({**document, "schema_version": 2})
    cells = document["recall"][0]["cells"]
    bad_cell = {**cells[0], "accuracy": 1.5}
    bad = {**document, "recall": [{**document["recall"][0], "cells": [bad_cell]}]}
    assert any("accuracy" in e or "1.5" in e for e in schema_errors(bad))


def test_write_json_refuses_a_report_that_breaks_the_schema(run_dir: Path, tmp_path: Path) -> None:
    data = load_report_data(run_dir)
    bad = dataclasses.replace(data, verdict=ReportVerdict("certain", "a verdict the schema does not know"))
    with pytest.raises(StoreError, match="schema"):
        write_json(bad, tmp_path)
    assert not (tmp_path / "report.json").exists()
    assert write_json(data, tmp_path).exists()
    assert list(tmp_path.glob(".*tmp")) == []  # no temporary file left behind


def test_a_growth_point_with_null_figures_round_trips() -> None:
    point = {"layer": 3, "module": "model.layers.3", "rel_diff": None, "max_rel_diff": None}
    assert LayerGrowth.from_json(point).to_json() == point


def test_the_report_loads_no_stage() -> None:
    """The report reads the stages' own result types (isolate's ``Trial``, localize's ``ScaleUnit``, the
    probes' ``RecallCell`` and ``PhaseDivergence``): importing it loads their result modules only,
    neither torch (localize, the in-process probe) nor the HTTP machinery (isolate's launch, the probes'
    backends)."""
    code = (
        "import sys, speedtrap.report; print(sorted(m for m in sys.modules if m in ('torch', 'httpx')"
        " or m.startswith(('speedtrap.isolate', 'speedtrap.localize', 'speedtrap.probe'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = ["speedtrap.isolate", "speedtrap.isolate._results", "speedtrap.localize", "speedtrap.localize._results"]
    loaded += ["speedtrap.probe", "speedtrap.probe._results", "speedtrap.probe._stats"]
    assert done.stdout.strip() == str(loaded)


def test_the_report_holds_isolates_own_trials_and_writes_the_fields_it_shows() -> None:
    from speedtrap.isolate import Conclusion, Judgement, Outcome, Trial
    from speedtrap.report import IsolationSection

    trial = Trial(3, ("a", "b"), 1, "ok", Outcome.FAIL, {"worst.kl_p99": 0.5, "odd": float("nan")},
                  log_path="/x/log", report_path="/x/r.json", attempts=2, probe_s=1.5)  # fmt: skip
    judged = Judgement(("a", "b"), Conclusion.FAIL, {"worst.kl_p99": 0.5}, (3,), "pooled")
    doc = {"status": "found", "trials": [trial.to_json()], "judgements": [judged.to_json()]}
    section = IsolationSection.from_json(doc)
    assert isinstance(section.trials[0], Trial) and isinstance(section.judgements[0], Judgement)
    written = section.to_json()
    assert written["trials"] == [
        {"index": 3, "config": ["a", "b"], "repeat": 1, "status": "ok", "outcome": "fail",
         "figures": {"worst.kl_p99": 0.5}, "probe_s": 1.5, "launch_s": 0.0, "reused": False, "error": None}
    ]  # fmt: skip
    assert written["judgements"] == [{"config": ["a", "b"], "verdict": "fail", "note": "pooled"}]
    assert IsolationSection.from_json(json.loads(json.dumps(written))) == section
