"""Secrets never reach a run directory or a report: planted in the environment, the manifest's launch
line and its env table, and a credential in a URL, then every file the run wrote is searched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
PLANTED = {
    "HF_TOKEN": "hf_PLANTEDenvironment0001",  # the caller's environment (servers inherit it)
    "OPENAI_API_KEY": "sk-PLANTEDenvironment0002",
}
IN_MANIFEST_ENV = "PLANTED-manifest-env-0003"
IN_LAUNCH = "PLANTED-launch-arg-0004"
IN_URL = "PLANTEDurlpassword0005"

MANIFEST = """
[target]
launch = [{python}, {server}, "--port", "{{port}}", "--api-key", "{launch_secret}"]
health = "http://127.0.0.1:{{port}}/health"
start_timeout = 30
env = {{ TINY_BROKEN = "bad_gemm", MODEL_API_TOKEN = "{env_secret}", HTTPS_PROXY = "http://me:{url_secret}@proxy:1" }}

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
"""


def test_no_planted_secret_is_in_any_file_the_run_wrote(tmp_path: Path) -> None:
    manifest = tmp_path / "speedtrap.toml"
    q = json.dumps
    manifest.write_text(
        MANIFEST.format(
            python=q(sys.executable),
            server=q(str(HERE / "_report_tiny_server.py")),
            probe=q(str(HERE / "_report_tiny_probe.py")),
            launch_secret=IN_LAUNCH,
            env_secret=IN_MANIFEST_ENV,
            url_secret=IN_URL,
        )
    )
    out = tmp_path / "run"
    env = {**os.environ, **PLANTED}
    argv = [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest), "--out", str(out), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)
    summary = json.loads(done.stdout)
    assert [c["patches"] for c in summary["verdict"]["culprits"]] == [["bad_gemm"]], done.stderr[-2000:]
    secrets = [*PLANTED.values(), IN_MANIFEST_ENV, IN_LAUNCH, IN_URL]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 10, "the run wrote its parts, trials, logs and report"
    leaks = [(str(p.relative_to(out)), s) for p in files for s in secrets if s.encode() in p.read_bytes()]
    assert leaks == [], leaks
    for s in secrets:
        assert s not in done.stdout and s not in done.stderr
    # The redaction is visible where the launch line is shown, not silently dropped.
    assert (
        "<redacted>" in (out / "report.json").read_text()
        or "<redacted>" in (out / "isolate" / "result.json").read_text()
    )
