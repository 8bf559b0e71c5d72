"""The documented command on the real vLLM example: ``speedtrap run --manifest examples/vllm/speedtrap.toml``.

A ``stack`` benchmark (outside CI: a launch per trial, then the live localize of each culprit). Ground truth by
construction for the constructed culprit ``double_norm_gain`` (the example plugin applies
``post_attention_layernorm``'s gain again to the MLP input in layers 2-4): it is named, and its live localize
(the agent as a vLLM general plugin in the worker) starts in layer 2's MLP, nothing before it. Whatever else the
search names (the precision patches may cross the bound) is localized too. A watcher: one vLLM server alive at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import vllm_stack

from _watch import ServerWatcher, argv_has, descends_from

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "vllm" / "speedtrap.toml"
CULPRIT = "double_norm_gain"


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_run_on_the_vllm_example_names_and_localizes_the_constructed_culprit(tmp_path: Path) -> None:
    vllm_stack.ensure_stack()
    out = tmp_path / "run"
    watcher = ServerWatcher(argv_has(b"vllm.entrypoints.openai.api_server"), descends_from(os.getpid()))
    with watcher:
        t0 = time.monotonic()
        argv = [sys.executable, "-m", "speedtrap", "run", "--manifest", str(EXAMPLE), "--quick", "--out", str(out)]
        done = subprocess.run([*argv, "--json"], capture_output=True, text=True, check=False, cwd=ROOT)
        seconds = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-4000:]
    assert watcher.most <= 1, watcher.most
    report = json.loads((out / "report.json").read_text())
    culprits = [tuple(c["patches"]) for c in report["isolation"]["culprits"]]
    assert (CULPRIT,) in culprits, culprits
    found = {tuple(loc["patches"]): loc for loc in report["localization"]}
    assert set(found) == set(culprits)
    first = found[(CULPRIT,)]["layers"]["first_divergent"]
    assert first is not None and first.startswith("model.layers.2.mlp"), first
    stages = {s["name"]: s["seconds"] for s in report["run"]["stages"]}
    print(f"speedtrap run (vLLM example): {seconds:.0f} s, culprits {culprits}, stages {stages}", flush=True)
    print({k: v["layers"]["first_divergent"] for k, v in found.items()}, flush=True)
