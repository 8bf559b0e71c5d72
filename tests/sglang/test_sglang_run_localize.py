"""The documented hunt on real SGLang, localized inside the engine: ``speedtrap run --manifest`` over the SGLang
example (``examples/sglang/build_example.py``: the seed's commit ``glm4_fused_topk_scale`` among three other
commits and three flags), and the same localize on the prefill/decode-disaggregated example.

``stack`` benchmarks (outside CI: about 12 launches of an SGLang server for the first, 3 stacks for the second).
Ground truth by construction: the commit makes the top-k apply ``routed_scaling_factor`` while the MoE block
still multiplies by it, so in every MoE layer the routed output goes as the factor squared (exponent 2), and
as the factor (exponent 1) in the base. Each example is built into a temporary folder (nothing written into the
clone); a watcher counts ``sglang.launch_server`` processes this test started the whole time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sglang_stack import ROOT, ensure_python

from _watch import ServerWatcher, argv_has, descends_from
from speedtrap.localize import localize_manifest
from speedtrap.manifest import load_manifest

sys.path.insert(0, str(ROOT / "examples" / "sglang"))
import build_example

SEED = "glm4_fused_topk_scale"
pytestmark = [pytest.mark.stack, pytest.mark.slow]


def _servers() -> ServerWatcher:
    return ServerWatcher(argv_has(b"sglang.launch_server"), descends_from(os.getpid()))


def _moe_layers(model: Path) -> list[int]:
    config = json.loads((model / "config.json").read_text())
    return list(range(int(config.get("first_k_dense_replace", 0)), int(config["num_hidden_layers"])))


@pytest.mark.timeout(5400)
def test_run_on_the_sglang_example_localizes_the_seeds_commit_in_the_engine(tmp_path: Path) -> None:
    python = ensure_python()
    model = build_example.export_model(tmp_path / "model")
    repo = tmp_path / "sglang-src"
    shas = build_example.build_repo(python, repo)
    manifest = tmp_path / "speedtrap.toml"
    manifest.write_text(build_example.manifest_text(python, model, shas, repo=repo))
    run_dir = tmp_path / "run"
    with _servers() as watcher:
        t0 = time.monotonic()
        argv = [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest), "--out", str(run_dir)]
        done = subprocess.run([*argv, "--quick", "--json"], capture_output=True, text=True, check=False)
        seconds = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-4000:]
    assert watcher.most <= 1, watcher.most  # one SGLang server alive at a time, localize included
    report = json.loads((run_dir / "report.json").read_text())
    assert [c["patches"] for c in report["isolation"]["culprits"]] == [[SEED]]
    [loc] = report["localization"]
    moe = _moe_layers(model)
    first = loc["layers"]["first_divergent"]
    assert first is not None and first.startswith(f"model.layers.{moe[0]}.mlp"), first
    assert {r["layer"]: r["times"] for r in loc["scale"]["rows"]} == {i: 2 for i in moe}
    assert {r["layer"]: r["times"] for r in loc["base_scale"]["rows"]} == {i: 1 for i in moe}
    assert "SGLang's own dumper" in loc["measured_on"]
    # where, measured in the worker (no --symbol: the factor is the one triage read in the culprit's diff): the
    # top-k that now applies it and the block's own multiply, both in SGLang's code
    twice = [e for e in report["verdict"]["evidence"] if "applied twice: `" in e]
    assert twice and "topk.py:" in twice[0] and "glm4_moe.py:" in twice[0], report["verdict"]["evidence"]
    assert any("applied once: `glm4_moe.py:" in e for e in report["verdict"]["evidence"]), report["verdict"]
    stages = {s["name"]: s["seconds"] for s in report["run"]["stages"]}
    print(f"speedtrap run: {seconds:.0f} s, stages {stages}, first divergent {first}", flush=True)
    print("report:", (run_dir / "report.md").read_text().split("## Localization")[1][:1500], flush=True)


@pytest.mark.timeout(3600)
def test_the_seeds_halves_are_localized_in_their_roles_on_the_pd_stack(tmp_path: Path) -> None:
    from sglang_pd_stack import example_module

    manifest = example_module().build(tmp_path / "example")
    culprits = [(f"{SEED}@prefill",), (f"{SEED}@decode",)]
    with _servers() as watcher:
        t0 = time.monotonic()
        results = localize_manifest(load_manifest(manifest), culprits, tmp_path / "live", tokens=96, decode=2)
        seconds = time.monotonic() - t0
    assert watcher.most <= 2, watcher.most  # prefill and decode of one stack
    prefill, decode = results
    assert prefill.role == "prefill" and decode.role == "decode"
    assert prefill.launches == 2 and decode.launches == 1  # the base stack once, then each half
    first = prefill.shown.layers.first_divergent
    assert first is not None and ".mlp" in first, first
    assert prefill.shown.scale is not None and set(prefill.shown.scale.times_by_layer().values()) == {2}
    assert prefill.shown.base_scale is not None and set(prefill.shown.base_scale.times_by_layer().values()) == {1}
    assert decode.shown.layers.first_divergent is not None
    # the factor's sites, measured in the prefill's worker: the top-k and the block's multiply; the base: one
    for scale, files in (
        (prefill.shown.scale, {"topk.py", "glm4_moe.py"}),
        (prefill.shown.base_scale, {"glm4_moe.py"}),
    ):
        for unit in scale.units:
            assert {s.where.split(":")[0] for s in unit.applying} == files, unit.sites_words()
            assert sum(s.applies for s in unit.applying) == len(files), unit.sites_words()
    print("prefill sites:", prefill.shown.scale.units[0].sites_words(), flush=True)
    print(f"PD live localize: {seconds:.0f} s", {r.culprit: r.extra() for r in results}, flush=True)
