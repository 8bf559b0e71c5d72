"""``speedtrap run --manifest`` on a launched server localizes its culprit inside that server (slow: ~3 min).

The stack is ``speedtrap serve --target smol-moe`` launched per configuration by the manifest, the patches
switched on as a server gets them (a config key on the command line, an env var). Ground truth by
construction: ``hash_topk_routed_scaling`` applies ``routed_scaling_factor`` a second time in layers 0-5, and
``fused_rmsnorm`` computes the same function. The report must name the culprit, a first divergent module in
layer 0's MoE, exponent 2 in layers 0-5 and 1 elsewhere, 1 everywhere in the base, and say where it was measured.
A watcher counts the served stacks alive every 0.2 s (ground truth from /proc): one at most, in every stage (the
evidence stage used to record its baseline while a trial's server was still up: two alive).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _watch import ServerWatcher, argv_has, descends_from
from speedtrap.report import schema_errors

pytestmark = pytest.mark.slow

MANIFEST = """
[target]
launch = {launch}
model = "model"
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

[verdict]
metric = "worst.kl_p99"
bound = 0.05
repeats = 0
"""


def test_run_on_a_server_manifest_localizes_the_culprit_inside_the_server(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()  # the served model's folder: no tokenizer, so the prompt is seeded ids
    (tmp_path / "model" / "config.json").write_text(json.dumps({"vocab_size": 49152}))
    launch = [sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", "{port}"]
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(MANIFEST.format(launch=json.dumps(launch)))
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest), "--quick", "--out", str(out)]
    with ServerWatcher(argv_has(b"serve", b"smol-moe"), descends_from(os.getpid())) as watcher:
        done = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert watcher.most == 1 and len(watcher.seen) >= 4, (watcher.most, len(watcher.seen), watcher.crowd)
    summary = json.loads(done.stdout)
    assert summary["errors"] == [] and [c["patches"] for c in summary["verdict"]["culprits"]] == [
        ["hash_topk_routed_scaling"]
    ]
    document = json.loads((out / "report.json").read_text())
    assert schema_errors(document) == []
    [loc] = document["localization"]
    assert loc["layers"]["first_divergent"] == "layers.0.mlp.gate"
    times = {r["layer"]: r["times"] for r in loc["scale"]["rows"]}
    assert times == {i: (2 if i < 6 else 1) for i in range(30)}
    assert {r["layer"]: r["times"] for r in loc["base_scale"]["rows"]} == {i: 1 for i in range(30)}
    assert "role server" in loc["measured_on"] and "agent" in loc["measured_on"]
    text = (out / "report.md").read_text()
    assert "layers 0-5: exponent ≈ 2.00, applied twice" in text
    assert "in the base configuration: layers 0-29: exponent ≈ 1.00, applied once" in text
