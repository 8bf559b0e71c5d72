"""``speedtrap init --pid`` on a real ``speedtrap serve`` of smol-moe, then ``speedtrap bisect`` on what it wrote.

Slow (a real model server, then a search that launches it per configuration). The server runs with the seed's
config patch (``--set apply_routed_scaling_factor_on_output=true``: smol-moe's hash top-k applies the factor
twice, the demo's culprit) and one env-gated kernel patch (``SPEEDTRAP_SMOLMOE_FUSED_RMSNORM=1``). init must make
both switches, and the search must name the config patch alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from _serving import serving


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_init_from_speedtrap_serve_then_bisect_names_the_config_patch(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEEDTRAP_SMOLMOE_")}
    env["SPEEDTRAP_SMOLMOE_FUSED_RMSNORM"] = "1"
    manifest = tmp_path / "speedtrap.toml"
    with serving(tmp_path, env, "--set", "apply_routed_scaling_factor_on_output=true") as (proc, _port):
        init = [sys.executable, "-m", "speedtrap", "init", "--pid", str(proc.pid), "--out", str(manifest)]
        done = subprocess.run(init, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
    data = tomllib.loads(manifest.read_text())
    assert data["probe"]["api"] == "vllm" and data["target"]["launch"][-2:] == ["--threads", "1"]
    by = {p["name"]: p for p in data["patches"]}
    assert by["apply_routed_scaling_factor_on_output_true"]["args"] == [
        "--set", "apply_routed_scaling_factor_on_output=true"]  # fmt: skip
    assert by["fused_rmsnorm"]["env"] == {"SPEEDTRAP_SMOLMOE_FUSED_RMSNORM": "1"}
    t0 = time.monotonic()
    run = [sys.executable, "-m", "speedtrap", "bisect", "--manifest", str(manifest), "--run-dir", str(tmp_path / "r")]
    done = subprocess.run([*run, "--json"], capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(done.stdout)
    culprits = [tuple(c["patches"]) if isinstance(c, dict) else tuple(c) for c in result["culprits"]]
    print(json.dumps({"bisect_s": round(time.monotonic() - t0), "culprits": culprits}), flush=True)
    assert culprits == [("apply_routed_scaling_factor_on_output_true",)], result
