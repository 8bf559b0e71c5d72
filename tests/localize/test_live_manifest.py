"""Live localize through the CLI on a manifest's stack: ``speedtrap serve --target smol-moe`` launched per
configuration, the base once, then the patch; one server alive at a time.

Ground truth by construction: ``hash_topk_routed_scaling`` (a config key on the server's command line, as
the manifest switches it) applies ``routed_scaling_factor`` a second time in layers 0-5 of smol-moe, so the
live scale check must say twice there and once elsewhere, once everywhere in the base, and the layer diff
must start in layer 0's MoE router. A second command on the same --run-dir reuses the base's capture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtrap.cli import app

HASH = set(range(6))  # the layers hash_topk_routed_scaling patches


def _manifest(tmp: Path) -> Path:
    folder = tmp / "model"  # the served model's folder: no tokenizer here, so the prompt is seeded ids
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 49152}))
    launch = [sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", "{port}"]
    text = f"""
[target]
launch = {json.dumps(launch)}
model = {json.dumps(str(folder))}
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
"""
    path = tmp / "speedtrap.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _manifest(tmp_path_factory.mktemp("live-manifest"))


def test_check_scale_and_diff_layers_with_a_manifest(manifest: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = ["--manifest", str(manifest), "--patches", "hash_topk_routed_scaling", "--tokens", "24"]
    scale = CliRunner().invoke(app, ["check", "scale", *argv, "--run-dir", str(run), "--json"])
    assert scale.exit_code == 0, scale.output
    doc = json.loads(scale.stdout)
    times = {int(u["layer"]): u["times"] for u in doc["units"]}
    assert times == {i: (2 if i in HASH else 1) for i in range(30)}
    assert {int(u["layer"]): u["times"] for u in doc["base"]["units"]} == {i: 1 for i in range(30)}
    live = doc["live"]
    assert live["launches"] == 2 and live["role"] == "server" and live["mechanism"] == "agent"
    assert "role server" in live["measured_on"] and live["capture_bytes"]["server"] > 0

    layers = CliRunner().invoke(app, ["diff", "layers", *argv, "--run-dir", str(run), "--json"])
    assert layers.exit_code == 0, layers.output
    diff = json.loads(layers.stdout)
    assert diff["first_divergent"] == "layers.0.mlp.gate"
    assert diff["live"]["launches"] == 1  # the base's capture was kept in --run-dir: only the patch launched

    harmless = CliRunner().invoke(app, ["diff", "layers", "--manifest", str(manifest), "--patches", "fused_rmsnorm",
                                        "--tokens", "24", "--run-dir", str(run)])  # fmt: skip
    assert harmless.exit_code == 0, harmless.output
    assert "no module over rel_diff" in harmless.output and "measured live" in harmless.output


def test_bad_patch_names_are_one_line(manifest: Path) -> None:
    out = CliRunner().invoke(app, ["diff", "layers", "--manifest", str(manifest), "--patches", "nope"])
    assert out.exit_code == 2 and "nope is not one" in out.output and "Traceback" not in out.output
