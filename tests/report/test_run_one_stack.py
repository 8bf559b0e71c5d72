"""``speedtrap run --manifest`` keeps one stack alive in every stage, the evidence stage included (slow: ~4 min).

The stack is ``speedtrap serve --target smol-moe`` launched per configuration. The manifest's probe settings
differ from the run's (``--quick``), so the evidence stage cannot take isolation's trial reports and measures
the full set and the culprit itself, against a baseline recorded for its own settings: it used to record that
baseline while the trial's server was already up (two servers alive). A watcher counts the served stacks every
0.2 s from /proc (ground truth, not speedtrap's account).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _watch import ServerWatcher, argv_has, descends_from

pytestmark = pytest.mark.slow

MANIFEST = """
[target]
launch = {launch}
health = "http://127.0.0.1:{{port}}/health"
start_timeout = 300
env = {{ OMP_NUM_THREADS = "1" }}
config_args = ["--set", "{{key}}={{value}}"]

[[patches]]
name = "hash_topk_routed_scaling"
config = {{ apply_routed_scaling_factor_on_output = "true" }}

[[patches]]
name = "fused_rmsnorm"
env = {{ SPEEDTRAP_SMOLMOE_FUSED_RMSNORM = "1" }}

[probe]
kind = "divergence"
preset = "quick"
settings = {{ lengths = [256], decode_tokens = 8 }}

[verdict]
metric = "worst.kl_p99"
bound = 0.05
repeats = 0
"""


def test_the_evidence_stage_never_has_a_second_server_alive(tmp_path: Path) -> None:
    launch = [sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", "{port}"]
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(MANIFEST.format(launch=json.dumps(launch)))
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest), "--quick", "--out", str(out)]
    with ServerWatcher(argv_has(b"serve", b"smol-moe"), descends_from(os.getpid())) as watcher:
        done = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["errors"] == [] and [c["patches"] for c in summary["verdict"]["culprits"]] == [
        ["hash_topk_routed_scaling"]
    ]
    # the evidence stage measured on its own (its settings are not isolation's), and recorded its baseline
    assert not any(p.startswith("probes/divergence") for p in summary["reused"]), summary["reused"]
    assert (out / "probes" / "reference.strec").is_file()
    assert watcher.most == 1, f"{watcher.most} servers alive at once ({len(watcher.seen)} launched): {watcher.crowd}"
