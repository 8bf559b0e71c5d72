"""The CI gate through the entry of a multi-role stack: ``check --against REC --manifest F --bisect-on-fail``.

The stack: two ``speedtrap serve`` roles (prefill, decode) behind examples/vllm-pd/proxy.py. The build is
launched by check itself (no --target), stopped before the hunt; a watcher counts the serve processes the
whole time (ground truth from /proc: at most one stack, two model servers, alive at any moment). The
manifest has no [verdict]: the failed bound is the hunt's rule. The culprit is constructed (smol-moe's
``hash_topk_routed_scaling``); ``lm_head_bf16`` stays within the bound (measured by the single trials).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _toml_text import toml_text

from _watch import ServerWatcher, argv_has, marked
from speedtrap.isolate import ServerOracle
from speedtrap.manifest import load_manifest
from speedtrap.probe import DivergenceSettings, HttpBackend, record

ROOT = Path(__file__).resolve().parents[2]
MARKER = "SPEEDTRAP_TEST_STACK"  # set by the test, inherited by every role it launches: the watcher's filter
PROXY = ROOT / "examples" / "vllm-pd" / "proxy.py"
SERVE = [sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", "{port}", "--threads", "1"]
SETTINGS = DivergenceSettings(lengths=(64,), sequences=1, decode_tokens=8, bucket_size=64)


def serve_stack(tmp_path: Path) -> Path:
    tables = {
        "target": {"served_model": "smol-moe", "start_timeout": 300, "stop_timeout": 10,
                   "env": {"OMP_NUM_THREADS": "1"}},
        "target.roles.prefill": {"launch": SERVE},
        "target.roles.decode": {"launch": SERVE},
        "target.roles.router": {
            "launch": [sys.executable, str(PROXY), "--port", "{port}", "--prefill", "http://127.0.0.1:{prefill.port}",
                       "--decode", "http://127.0.0.1:{decode.port}"],
            "after": ["prefill", "decode"], "entry": True, "runs_model": False,
        },
        "probe": {"kind": "divergence", "settings": {"lengths": [64], "decode_tokens": 8, "bucket_size": 64}},
    }  # fmt: skip
    patches = [
        {"name": "hash_topk_routed_scaling", "args": ["--set", "apply_routed_scaling_factor_on_output=true"]},
        {"name": "lm_head_bf16", "env": {"SPEEDTRAP_SMOLMOE_LM_HEAD_BF16": "1"}},
    ]
    path = tmp_path / "speedtrap.toml"
    path.write_text(toml_text(tables, patches))
    return path


def Watcher() -> ServerWatcher:
    """The most `speedtrap serve` processes alive at once that this test launched (its marker in their env)."""
    return ServerWatcher(argv_has(b"speedtrap", b"serve", b"smol-moe"), marked(MARKER, os.environ.get(MARKER, "")))


@pytest.mark.stack
@pytest.mark.slow
def test_check_launches_the_stack_itself_stops_it_and_hunts_with_the_failed_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARKER, tmp_path.name + str(os.getpid()))
    path = serve_stack(tmp_path)
    text = path.read_text()
    assert "[verdict]" not in text
    # The baseline, recorded through the stack's entry (one launch, stopped).
    with_bound = path.with_name("recording.toml")
    with_bound.write_text(text + '\n[verdict]\nmetric = "worst.kl_p99"\nbound = 0.1\n')
    loaded = load_manifest(with_bound)
    oracle = ServerOracle(loaded.target, loaded.patches, loaded.probe)
    with Watcher() as watcher:
        stack, _ = oracle.start((), tmp_path / "baseline" / "b.log")
        with stack:
            rec = record(HttpBackend(f"http://127.0.0.1:{stack.port}", "smol-moe"), tmp_path / "base.strec",
                         divergence=SETTINGS, progress=False)  # fmt: skip
        argv = [sys.executable, "-m", "speedtrap", "check", "--against", str(rec.path), "--manifest", str(path),
                "--bisect-on-fail", "--run-dir", str(tmp_path / "hunt"), "--json"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert [c["passed"] for c in doc["checks"] if c["probe"] == "divergence"] == [False]
    assert doc["bisect"] is not None and "bisect_error" not in doc, doc.get("bisect_error")
    assert [c["patches"] for c in doc["bisect"]["culprits"]] == [["hash_topk_routed_scaling"]]
    singles = {tuple(t["config"]): t["outcome"] for t in doc["bisect"]["trials"] if len(t["config"]) == 1}
    assert singles.get(("lm_head_bf16",)) in (None, "pass")  # brute force where measured: the other passes
    assert watcher.most <= 2, f"{watcher.most} speedtrap serve processes alive at once: two stacks"
    assert watcher.most == 2  # the watcher did see a stack


@pytest.mark.slow
def test_check_launches_the_named_build_judges_it_through_the_entry_and_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check --against REC --manifest F --config P`` without a hunt: the build launched with P on, probed with the
    client a trial uses (the stack's entry), exit 1, and no role left running."""
    monkeypatch.setenv(MARKER, tmp_path.name + str(os.getpid()))
    path = serve_stack(tmp_path)
    with_bound = path.with_name("recording.toml")  # the loader wants a rule; check's is the failed bound
    with_bound.write_text(path.read_text() + '\n[verdict]\nmetric = "worst.kl_p99"\nbound = 0.1\n')
    loaded = load_manifest(with_bound)
    oracle = ServerOracle(loaded.target, loaded.patches, loaded.probe)
    with Watcher() as watcher:
        stack, _ = oracle.start((), tmp_path / "baseline" / "b.log")
        with stack:
            rec = record(oracle.backend(stack), tmp_path / "base.strec", divergence=SETTINGS, progress=False)
        argv = [sys.executable, "-m", "speedtrap", "check", "--against", str(rec.path), "--manifest", str(path),
                "--config", "hash_topk_routed_scaling", "--run-dir", str(tmp_path / "check"), "--json"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        left = watcher.count()
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert [c["passed"] for c in doc["checks"] if c["probe"] == "divergence"] == [False]
    assert doc["target"].startswith("http://127.0.0.1:") and doc["bisect"] is None
    assert doc["reading"] is None  # the culprit changes the prefill's math too: not a decode-side fault
    assert left == 0 and watcher.most == 2, (left, watcher.most)  # one stack at a time, none left behind


def test_a_url_target_with_bisect_on_fail_needs_a_stop_command(tmp_path: Path) -> None:
    path = serve_stack(tmp_path)
    argv = [sys.executable, "-m", "speedtrap", "check", "--against", str(tmp_path / "x.strec"), "--target",
            "http://127.0.0.1:9", "--manifest", str(path), "--bisect-on-fail"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "two stacks at once" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_the_hunt_asks_the_target_the_way_the_manifest_says(tmp_path: Path) -> None:
    """The hunt's probe keeps ``probe.api`` / ``probe.model``: a vLLM router whose prompt logprobs are the prefill's
    (``api = "vllm"``), asked the OpenAI way (``echo``), answers them from its decode and hides a prefill-only
    culprit (measured on the real vLLM stack: tests/vllm/test_vllm_pd_gate.py named the decode's half)."""
    from types import SimpleNamespace

    from speedtrap.regress import Bound, Check, hunt_manifest

    path = serve_stack(tmp_path)
    path.write_text(path.read_text().replace('kind = "divergence"', 'kind = "divergence"\napi = "vllm"\nmodel = "m"'))
    recording = SimpleNamespace(divergence=SETTINGS, path=tmp_path / "base.strec")
    limit = Bound("worst.kl_p99", "<=", 0.1)
    failed = Check("divergence worst.kl_p99", "divergence", 1.4, "<= 0.1", False, "", limit)
    manifest = hunt_manifest(load_manifest(path), recording, [failed])
    assert (manifest.probe.api, manifest.probe.model) == ("vllm", "m")
    assert manifest.probe.reference == str(recording.path) and manifest.verdict.bound == 0.1
