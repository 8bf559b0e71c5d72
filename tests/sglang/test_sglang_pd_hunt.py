"""The hunt on SGLang prefill/decode-disaggregated: ``speedtrap run`` over examples/sglang-pd, against brute force.

A ``stack`` benchmark (not in CI: about 15 stack launches). The example (``examples/sglang-pd/build_example.py``)
is built into a temporary folder; ``speedtrap run --manifest`` runs the whole pipeline (recall by length, the
search with divergence against a recording of the base, the evidence, the report); then brute force measures
every single switch the run did not measure alone, against the run's own recording, one stack at a time. The
role the seed's commit breaks is whatever brute force says: the test asserts that the run names the same.
A watcher counts ``sglang.launch_server`` processes this test started: at most one stack (two servers) alive.
The first brute-force stack is inspected live (``inspect --manifest``): every role's pids, gates and flags.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sglang_pd_stack import example_module
from typer.testing import CliRunner

from _watch import ServerWatcher, argv_has, descends_from
from speedtrap.cli import app
from speedtrap.isolate import ServerOracle, TrialRequest
from speedtrap.manifest import load_manifest

pd_example = example_module()  # examples/sglang-pd/build_example.py

SEED = "glm4_fused_topk_scale"


def _servers() -> ServerWatcher:
    return ServerWatcher(argv_has(b"sglang.launch_server"), descends_from(os.getpid()))


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_run_names_the_seeds_commit_with_its_role_as_brute_force_does(tmp_path: Path) -> None:
    t0 = time.monotonic()
    manifest_path = pd_example.build(tmp_path / "example")
    manifest = load_manifest(manifest_path)
    names = [p.name for p in manifest.patches]
    assert {f"{SEED}@prefill", f"{SEED}@decode"} <= set(names)
    print(f"built in {time.monotonic() - t0:.0f} s: {names}", flush=True)
    run_dir = tmp_path / "run"
    with _servers() as watcher:
        t1 = time.monotonic()
        argv = [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest_path), "--out", str(run_dir)]
        done = subprocess.run([*argv, "--quick", "--json"], capture_output=True, text=True, check=False)
        run_s = time.monotonic() - t1
        print(f"speedtrap run: {run_s:.0f} s, exit {done.returncode}", flush=True)
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads((run_dir / "report.json").read_text())
        isolation = report["isolation"]
        culprits = [tuple(c["patches"]) for c in isolation["culprits"]]
        bound = manifest.verdict.bound
        figures = {tuple(t["config"]): t["figures"].get("worst.kl_p99") for t in isolation["trials"]}
        brute = {c[0]: v > bound for c, v in figures.items() if len(c) == 1 and v is not None}
        measured = dict(brute)
        recording = next(run_dir.rglob("reference.strec"))
        probe = dataclasses.replace(manifest.probe, reference=str(recording))
        oracle = ServerOracle(manifest.target, manifest.patches, probe)
        oracle.prepare(None)
        inspected: dict[str, Any] | None = None
        t2 = time.monotonic()
        for name in names:
            if name in brute:
                continue
            config = oracle_config(manifest, name)
            request = TrialRequest(config, 0, tmp_path / "brute", f"brute-{name}")
            t = time.monotonic()
            stack, launch_s = oracle.start(config, tmp_path / "brute" / f"brute-{name}.log")
            with stack:
                if inspected is None:
                    out = CliRunner().invoke(app, ["inspect", "--manifest", str(manifest_path), "--json"])
                    assert out.exit_code == 0, out.output
                    inspected = {"config": config, "report": json.loads(out.output), "pids": stack.pids()}
                got, _ = oracle._probe(stack, request)
            brute[name] = got["worst.kl_p99"] > bound
            print(f"brute {name} ({'+'.join(config)}): launch {launch_s:.0f} s, "
                  f"worst.kl_p99 {got['worst.kl_p99']:.4g}, {time.monotonic() - t:.0f} s", flush=True)  # fmt: skip
        oracle.close()
    brute_s = time.monotonic() - t2
    harmful = [n for n in names if brute[n]]
    print(json.dumps({"run_s": round(run_s), "brute_s": round(brute_s), "culprits": culprits, "harmful": harmful,
                      "launches": isolation["launches"], "measured_by_the_run": measured, "most_servers": watcher.most,
                      "server_pids": len(watcher.seen)}), flush=True)  # fmt: skip
    assert harmful and all(n.startswith(SEED) for n in harmful), harmful  # by construction, measured
    assert sorted(culprits) == sorted((n,) for n in harmful), (culprits, harmful)  # each harmful alone: a culprit
    assert watcher.most <= 2, f"{watcher.most} SGLang servers alive at once (a stack is two)"
    assert [r["label"] for r in report["recall"]] and all(r["cells"] for r in report["recall"])  # recall by length
    assert all({"prefill", "decode"} <= {p["phase"] for p in d["phases"]} for d in report["divergence"])  # by phase
    assert inspected is not None
    _check_inspect(inspected, manifest)
    # the live localize of each culprit, in the role it is switched on in (SGLang's dumper there, the agent's scale)
    localized = {tuple(loc["patches"]): loc for loc in report["localization"]}
    assert set(localized) == set(culprits), (list(localized), culprits)
    for (name,), loc in localized.items():
        role = name.rsplit("@", 1)[1]
        assert f"role {role}" in loc["measured_on"] and "SGLang's own dumper" in loc["measured_on"], loc
        first = loc["layers"]["first_divergent"]
        assert first is not None and ".mlp." in first, (name, first)
        print(f"localized {name}: {loc['measured_on']}; first divergent {first}", flush=True)


def oracle_config(manifest: Any, name: str) -> tuple[str, ...]:
    """``name`` alone, with the commits it needs to apply (``topk_comment_more`` edits ``topk_comment``'s line)."""
    needs = {"topk_comment_more": ("topk_comment",)}
    return tuple(sorted((*needs.get(name, ()), name)))


def _check_inspect(inspected: dict[str, Any], manifest: Any) -> None:
    roles = {r["role"]: r for r in inspected["report"]["roles"]}
    assert set(roles) == {"prefill", "decode", "router"}
    for role, guard in inspected["pids"].items():
        assert roles[role]["guard_pid"] == guard
    for role in ("prefill", "decode"):
        leader = roles[role]["leader"]
        assert leader["env_readable"], leader
        assert any(p["pid"] != leader["pid"] for p in roles[role]["processes"]), roles[role]  # the scheduler
    text = json.dumps(roles["prefill"])
    assert "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER" in text and "--disaggregation-mode" in text
    for role in ("prefill", "decode"):
        on = [n for n in inspected["config"] if role in (manifest.patch(n).roles or ("prefill", "decode"))]
        assert sorted(roles[role]["patches_on"]) == sorted(on), (role, roles[role]["patches_on"], on)
