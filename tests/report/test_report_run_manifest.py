"""``speedtrap run --manifest FILE``: the pipeline on a launched server, in a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from speedtrap.report import schema_errors

HERE = Path(__file__).parent

MANIFEST = """
[target]
launch = [{python}, {server}, "--port", "{{port}}"]
health = "http://127.0.0.1:{{port}}/health"
start_timeout = 30
env = {{ TINY_BROKEN = "bad_gemm" }}

[probe]
kind = "command"
argv = [{python}, {probe}, "{{base_url}}"]
timeout = 60

[verdict]
rule = "threshold"
metric = "metric"
bound = 0.5
near = 0.0
repeats = 0

[[patches]]
name = "fast_norm"
env = {{ TINY_P_FAST_NORM = "1" }}

[[patches]]
name = "bad_gemm"
env = {{ TINY_P_BAD_GEMM = "1" }}

[[patches]]
name = "kv_cache"
env = {{ TINY_P_KV_CACHE = "1" }}
"""


def test_run_on_a_manifest_names_the_culprit_and_reports_what_it_could_not_measure(tmp_path: Path) -> None:
    manifest = tmp_path / "speedtrap.toml"
    q = json.dumps
    manifest.write_text(
        MANIFEST.format(
            python=q(sys.executable),
            server=q(str(HERE / "_report_tiny_server.py")),
            probe=q(str(HERE / "_report_tiny_probe.py")),
        )
    )
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest), "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    # The recall probe cannot talk to a stack without a chat API: that stage fails, the rest goes on.
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    summary = json.loads(done.stdout)
    assert [(c["patches"], c["confirmed"]) for c in summary["verdict"]["culprits"]] == [(["bad_gemm"], True)]
    assert any(e.startswith("probes:") for e in summary["errors"])
    document = json.loads((out / "report.json").read_text())
    assert schema_errors(document) == []
    stages = {s["name"]: s["status"] for s in document["run"]["stages"]}
    assert stages["probes"] == "failed" and stages["isolate"] == "done" and stages["localize"] == "skipped"
    # live localize needs the served model's folder (its prompt comes from its tokenizer): skipped, and why
    detail = {s["name"]: s.get("detail", "") for s in document["run"]["stages"]}["localize"]
    assert "served model's folder" in detail and not any(e.startswith("localize:") for e in summary["errors"])
    assert document["isolation"]["trials"] and document["triage"] is not None
    missing = {m["part"] for m in document["missing"]}
    assert "recall probe: baseline" in missing
    assert (out / "report.html").exists()
