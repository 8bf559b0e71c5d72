"""``speedtrap init --pid`` on the SGLang PD example's stack started by hand, then ``speedtrap run`` on what it wrote.

A ``stack`` benchmark (not in CI: a hand-started stack, then a whole hunt of about ten stack launches). The
deployment is started by hand as docs/sglang.md describes it (``sglang_pd_stack.pd_tables``' launch lines with
ports filled in, the example's SGLang checkout at its HEAD first on the model roles' ``PYTHONPATH``: the seed's
commit and the three others are in what runs; ``--chunked-prefill-size 64`` on the prefill). ``speedtrap init
--pid PREFILL --pid DECODE --pid ROUTER --since BASE`` writes the manifest; the hand-started stack is stopped (two
cores), and ``speedtrap run --manifest`` runs the manifest as written. Ground truth by construction: the only
harmful commit is the seed's (docs/sglang.md, brute force over every switch), so every culprit must be that
commit, switched on in one role.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
import sglang_pd_stack as pd
from sglang_pd_stack import example_module

from speedtrap.stack import free_port, render

single = example_module().single  # examples/sglang/build_example.py: the commits, the repository, the export
SEED = "glm4_fused_topk_scale"


def _wait(url: str, timeout: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "a hand-started role exited"
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise AssertionError(f"{url} did not answer in {timeout} s")


def start_by_hand(root: Path, python: Path, site: Path, model: Path, repo: Path) -> dict[str, subprocess.Popen[bytes]]:
    """The three roles as a person starts them: fixed ports, the checkout first on PYTHONPATH, no speedtrap."""
    tables = pd.pd_tables(python, site)
    values = {"model": str(model)}
    for role in ("prefill", "decode", "router"):
        values[f"{role}.port"] = str(free_port())
        for p in tables[f"target.roles.{role}"].get("ports", []):
            values[f"{role}.port.{p}"] = str(free_port())
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SPEEDTRAP_", "PYTHONPATH"))}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for role in ("prefill", "decode", "router"):
        table = tables[f"target.roles.{role}"]
        own = {**values, "port": values[f"{role}.port"]}
        own |= {f"port.{p}": values[f"{role}.port.{p}"] for p in table.get("ports", [])}
        argv = render(table["launch"], own)
        if role == "prefill":
            argv += ["--chunked-prefill-size", "64"]  # a speed flag the deployment runs with
        env = {**clean, **tables["target"]["env"], **table.get("env", {})}
        if role != "router":
            env["PYTHONPATH"] = f"{repo}{os.pathsep}{site}"  # the checkout at HEAD: every commit in
        log = (root / f"hand.{role}.log").open("wb")
        procs[role] = subprocess.Popen(argv, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)  # fmt: skip
        if role == "decode":
            for r in ("prefill", "decode"):
                _wait(f"http://127.0.0.1:{values[f'{r}.port']}/health", 900, list(procs.values()))
    _wait(f"http://127.0.0.1:{values['router.port']}/health", 120, list(procs.values()))
    return procs


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_init_from_the_hand_started_pd_stack_then_run_names_the_seed_in_a_role(tmp_path: Path) -> None:
    t0 = time.monotonic()
    python, site = pd.ensure_python(), pd.ensure_packages()
    model = single.export_model(tmp_path / "model")
    repo = tmp_path / "sglang-src"
    shas = single.build_repo(python, repo)
    procs = start_by_hand(tmp_path, python, site, model, repo)
    manifest = tmp_path / "speedtrap.toml"
    try:
        up_s = time.monotonic() - t0
        pids = [a for role in ("prefill", "decode", "router") for a in ("--pid", str(procs[role].pid))]
        t1 = time.monotonic()
        argv = [sys.executable, "-m", "speedtrap", "init", *pids, "--since", shas["base"], "--out", str(manifest)]
        done = subprocess.run([*argv, "--json"], capture_output=True, text=True, check=False)
        init_s = time.monotonic() - t1
        assert done.returncode == 0, done.stderr
    finally:
        _stop(procs)
    text = manifest.read_text()
    print(f"hand stack up in {up_s:.0f} s; init {init_s:.1f} s\n{text}", flush=True)
    assert "# TODO" not in text
    data = tomllib.loads(text)
    assert list(data["target"]["roles"]) == ["prefill", "decode", "router"]
    seed = next(p["name"] for p in data["patches"] if p.get("commit") == shas[SEED])
    run_dir = tmp_path / "run"
    t2 = time.monotonic()
    argv = [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest), "--out", str(run_dir), "--quick"]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, check=False)
    run_s = time.monotonic() - t2
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((run_dir / "report.json").read_text())
    isolation = report["isolation"]
    culprits = [tuple(c["patches"]) for c in isolation["culprits"]]
    print(json.dumps({"init_s": round(init_s, 1), "run_s": round(run_s), "trials": len(isolation["trials"]),
                      "culprits": culprits, "seed_patch": seed}), flush=True)  # fmt: skip
    assert culprits, "no culprit named"
    assert all(len(c) == 1 and c[0] in (f"{seed}@prefill", f"{seed}@decode") for c in culprits), culprits
