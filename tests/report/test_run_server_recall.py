"""``speedtrap run --manifest``: a server's planted-fact recall stops once decided (slow: ~5 min).

The stack is ``speedtrap serve --target smol-moe`` launched per configuration, one at a time. The baseline's
recall is measured with its whole grid (its server then stopped); every patched configuration is asked in
rounds against those answers and stops each length once the sequential test decides it (the manifest's
``[verdict] sequential``, default on). Ground truth by construction: ``hash_topk_routed_scaling`` applies the
routed scaling factor twice, which keeps the planted facts of 128-token chats and loses those of 1,280-token
ones (the demo's calibration: 1/10 on the full grid, against the baseline's 10/10); ``fused_rmsnorm`` is
harmless. The culprit's own recall (the evidence stage) must stop *lost* at 1,280 tokens after fewer questions
than the grid holds, and *kept* at 128.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_run_one_stack import MANIFEST  # the same two patches over speedtrap serve

from speedtrap.pipeline import PipelineSettings, run_pipeline
from speedtrap.report import load_part
from speedtrap.rundir import Source, recall_path

pytestmark = pytest.mark.slow

GRID = {"lengths": [128, 1280], "depths": [0.1, 0.3, 0.5, 0.7, 0.9], "samples": 2}


@pytest.mark.timeout(1800)
def test_a_servers_recall_asks_in_rounds_against_the_baseline_measured_whole(tmp_path: Path) -> None:
    launch = [sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", "{port}"]
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(MANIFEST.format(launch=json.dumps(launch)))
    out = tmp_path / "run"
    settings = PipelineSettings(quick=True, recall=GRID, localize=False)
    result = run_pipeline(out, Source(manifest=str(manifest)), settings)
    assert result.errors == [], result.errors
    base = load_part(recall_path(out, ())).result
    assert len(base["samples"]) == 20 and not base.get("stops")  # the reference: its whole grid
    culprit = load_part(recall_path(out, ("hash_topk_routed_scaling",))).result
    stops = {s["length"]: s for s in culprit["stops"]}
    assert stops[128]["decision"] == "kept" and stops[1280]["decision"] == "lost", stops
    assert stops[1280]["asked"] < 10 and len(culprit["samples"]) < 20, stops
    for part in (culprit, load_part(recall_path(out, ("hash_topk_routed_scaling", "fused_rmsnorm"))).result):
        assert part["settings"]["sequential"] is True
    report = (out / "report.md").read_text()
    assert "stopped after" in report and "lost (alpha 0.05)" in report, report[:3000]
