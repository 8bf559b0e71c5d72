"""Run directories that are not whole: a killed run, an older version, hand-damaged files. The report
renders what is there and lists what is missing with the command that produces it; never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _report_run import CULPRIT

from speedtrap._errors import UsageError
from speedtrap.report import load_report_data, render_run, schema_errors


def _render(run: Path) -> tuple[object, dict[str, object]]:
    data, paths = render_run(run)
    document = json.loads(paths.json.read_text())
    assert schema_errors(document) == []
    assert paths.html.exists() and paths.markdown.exists()
    return data, document


def _missing(document: dict[str, object]) -> dict[str, dict[str, str]]:
    return {m["part"]: m for m in document["missing"]}  # type: ignore[attr-defined, index]


def test_isolation_killed_before_its_result_shows_the_stored_trials(run_copy: Path) -> None:
    finished = json.loads((run_copy / "isolate" / "result.json").read_text())
    (run_copy / "isolate" / "result.json").unlink()
    _, doc = _render(run_copy)
    iso = doc["isolation"]
    assert iso["status"] == "incomplete"
    assert [t["config"] for t in iso["trials"]] == [t["config"] for t in finished["trials"] if not t["reused"]]
    missing = _missing(doc)["isolation result"]
    assert "stopped after" in missing["reason"]
    assert missing["command"].startswith("speedtrap bisect --target smol-moe") and "--resume" in missing["command"]
    assert doc["verdict"]["status"] == "unknown"
    assert "Missing" in (run_copy / "report.html").read_text()


def test_a_half_written_probe_file_is_named_and_the_rest_renders(run_copy: Path) -> None:
    path = run_copy / "probes" / "recall-baseline.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    _, doc = _render(run_copy)
    broken = _missing(doc)["recall probe (recall-baseline)"]
    assert "cut off" in broken["reason"] and broken["command"].startswith("speedtrap probe recall")
    assert "recall probe: baseline" in _missing(doc)
    assert [r["label"] for r in doc["recall"]] == ["all patches", CULPRIT]
    assert doc["verdict"]["status"] == "culprit"  # the verdict does not need the baseline's recall


def test_a_run_from_before_run_json_existed(run_copy: Path) -> None:
    (run_copy / "run.json").unlink()
    shutil.rmtree(run_copy / "localize")
    _, doc = _render(run_copy)
    assert any("no run.json" in n for n in doc["notes"])
    missing = _missing(doc)
    assert missing[f"layer diff: {CULPRIT}"]["command"] == (
        f"speedtrap diff layers --target smol-moe --patches {CULPRIT} --json"
    )
    assert missing[f"scale check: {CULPRIT}"]["command"].startswith("speedtrap check scale --target smol-moe")
    assert doc["localization"] == []


def test_an_older_run_json_version_is_read_and_said(run_copy: Path) -> None:
    record = json.loads((run_copy / "run.json").read_text())
    record["run_schema_version"] = 0
    del record["settings"]
    record["stages"]["isolate"] = {"status": "running"}  # killed mid-stage
    (run_copy / "run.json").write_text(json.dumps(record))
    _, doc = _render(run_copy)
    assert any("older speedtrap" in n for n in doc["notes"])
    stage = {s["name"]: s for s in doc["run"]["stages"]}["isolate"]
    assert stage["status"] == "partial" and "killed" in stage["detail"]


def test_garbage_where_a_result_should_be(run_copy: Path) -> None:
    (run_copy / "isolate" / "result.json").write_text("{not json")
    (run_copy / "triage.json").write_text(json.dumps({"kind": "speedtrap-part", "stage": "triage", "result": {}}))
    _, doc = _render(run_copy)
    missing = _missing(doc)
    assert "unreadable" in missing["isolation result"]["reason"]
    assert "'patches' missing" in missing["triage (tiers, reasons, plan)"]["reason"]
    assert doc["isolation"]["status"] == "incomplete" and doc["isolation"]["trials"]


def test_an_empty_directory_lists_every_part(tmp_path: Path) -> None:
    _, doc = _render(tmp_path)
    parts = set(_missing(doc))
    assert {"triage (tiers, reasons, plan)", "recall probe: baseline", "isolation (culprit search)"} <= parts
    assert doc["verdict"]["status"] == "unknown" and doc["figures"] == []


def test_a_bare_bisect_directory(run_copy: Path) -> None:
    data = load_report_data(run_copy / "isolate")
    assert data.isolation is not None and data.isolation.status == "found"
    assert [c.patches for c in data.verdict.culprits] == [(CULPRIT,)]
    assert any("bare `speedtrap bisect`" in n for n in data.notes)


def test_no_such_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_report_data(tmp_path / "nope")
