"""The pipeline's stored stages: a rerun after a kill measures only what was not finished."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from _report_run import CULPRIT, small_settings

from speedtrap.pipeline import run_pipeline
from speedtrap.report import Source
from speedtrap.targets._base import InProcessModel


def test_a_rerun_after_a_kill_reuses_every_finished_stage(run_copy: Path, smol: InProcessModel) -> None:
    # What a kill during localization leaves: the search's result not yet written, no localization.
    trials_before = json.loads((run_copy / "isolate" / "result.json").read_text())["trials"]
    (run_copy / "isolate" / "result.json").unlink()
    shutil.rmtree(run_copy / "localize")
    record = json.loads((run_copy / "run.json").read_text())
    record["stages"]["isolate"]["status"] = "running"
    (run_copy / "run.json").write_text(json.dumps(record))

    result = run_pipeline(run_copy, Source(target="smol-moe"), small_settings(), model=smol)  # type: ignore[arg-type]

    assert result.errors == []
    assert sorted(result.computed) == [
        "isolate/result.json", f"localize/layers-{CULPRIT.replace('_', '-')}.json",
        f"localize/scale-{CULPRIT.replace('_', '-')}.json",
    ]  # fmt: skip
    assert "triage.json" in result.reused and "probes/recall-baseline.json" in result.reused
    iso = json.loads((run_copy / "isolate" / "result.json").read_text())
    assert iso["launches"] == 0 and iso["reused"] == len(trials_before)  # every trial came from the store
    assert [c.patches for c in result.data.verdict.culprits] == [(CULPRIT,)]
    assert result.data.missing == ()


def test_other_settings_are_measured_again_not_reused(run_copy: Path, smol: InProcessModel) -> None:
    import dataclasses

    settings = dataclasses.replace(small_settings(), localize_tokens=20)  # type: ignore[type-var]
    result = run_pipeline(run_copy, Source(target="smol-moe"), settings, model=smol)
    assert [p for p in result.computed if p.startswith("localize/")] == [
        f"localize/layers-{CULPRIT.replace('_', '-')}.json", f"localize/scale-{CULPRIT.replace('_', '-')}.json",
    ]  # fmt: skip
    assert not [p for p in result.computed if not p.startswith("localize/")]
    layers = json.loads((run_copy / "localize" / f"layers-{CULPRIT.replace('_', '-')}.json").read_text())
    assert layers["result"]["tokens"] == 20 and "--tokens 20" in layers["command"]


def test_a_sequential_recall_shares_its_baseline_and_says_where_it_stopped(
    tmp_path: Path, smol: InProcessModel
) -> None:
    """The recall asked in rounds against the baseline: the baseline's part holds exactly the questions
    its candidates needed, each candidate's part where it stopped, the report says so, and a rerun
    measures nothing."""
    import dataclasses

    recall = {"lengths": (160,), "depths": (0.2, 0.5, 0.8), "samples": 2, "sequential": True}
    from speedtrap.pipeline import PipelineSettings

    base_settings = small_settings()
    assert isinstance(base_settings, PipelineSettings)
    settings = dataclasses.replace(base_settings, recall=recall, localize=False)
    out = tmp_path / "run"
    result = run_pipeline(out, Source(target="smol-moe"), settings, model=smol)
    assert result.errors == []
    probes = out / "probes"
    base = json.loads((probes / "recall-baseline.json").read_text())["result"]
    runs = [json.loads(p.read_text())["result"] for p in sorted(probes.glob("recall-*.json"))]
    candidates = [r for r in runs if r.get("stops")]
    assert candidates, "every patched recall run is sequential"
    asked = {s["conversation"] + str(s["depth"]) for r in candidates for s in r["samples"]}
    assert {s["conversation"] + str(s["depth"]) for s in base["samples"]} == asked  # what they needed, no more
    for r in candidates:
        (stop,) = r["stops"]
        assert stop["asked"] == len(r["samples"]) <= stop["maximum"] == 6
        assert stop["decision"] in ("lost", "kept", "undecided")
    markdown = (out / "report.md").read_text()
    assert "Sequential verdicts" in markdown and "questions: " in markdown
    again = run_pipeline(out, Source(target="smol-moe"), settings, model=smol)
    assert not [p for p in again.computed if p.startswith("probes/")]
