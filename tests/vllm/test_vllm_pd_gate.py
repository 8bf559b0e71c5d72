"""The real prefill/decode-disaggregated vLLM stack (examples/vllm-pd/): a fresh KV folder per trial, and the CI
gate ``check --against REC --manifest F --bisect-on-fail`` with the build launched and stopped by check itself.

Both share one baseline launch (module fixture): the example's stack with no patch on, recorded through its
entry, and a copy of the KV folder its prefill wrote (vLLM's ExampleConnector: one folder per prompt-prefix
hash, one safetensors file per layer). Ground truth is by construction: the culprit is the example plugin's
MLP x1.5 on the prefill only (a prefill-path kernel bug); the stale folder is the baseline's own KV, copied.

Why a stale folder hides it (vLLM 0.32.0's code): a request with ``prompt_logprobs`` never reads external KV
(``SamplingParams.skip_reading_prefix_cache``), so the prefill phase is always computed by the patched prefill;
a plain completion (the probe's decode phase) finds the prompt's hash folder on disk and loads it, in the
prefill and in the decode alike. With the baseline's folder left in place, the decode phase is the
baseline's to the last digit; only a fresh folder makes the decode read the patched prefill's KV.

A watcher (test_vllm_pd.py's) counts vLLM API servers in /proc: at most one stack (two servers) alive.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import vllm_stack
from test_vllm_pd import CULPRIT, EXAMPLE, MARKER, ROOT, ApiServers

from speedtrap.isolate import ServerOracle, TrialRequest
from speedtrap.manifest import load_manifest
from speedtrap.probe import DivergenceSettings, HttpBackend, record

BOUND = 0.05  # the example's verdict bound (worst.kl_p99), here read on the decode phase too


@dataclasses.dataclass(frozen=True)
class Baseline:
    recording: Path  # the no-patch stack's answers, recorded through the router
    stale_kv: Path  # a copy of the KV folder that stack's prefill wrote while it was recorded
    seconds: float


def _manifest_text(*, kv_folder: Path | None, verdict: bool) -> str:
    """The example's manifest with absolute paths; ``kv_folder``: a fixed KV folder instead of ``{scratch.kv}``;
    ``verdict=False``: without its ``[verdict]`` table."""
    text = EXAMPLE.read_text()
    text = text.replace('model = "../../.vllm-model"', f'model = "{ROOT / ".vllm-model"}"')
    text = text.replace('cwd = "../.."', f'cwd = "{ROOT}"')
    if kv_folder is not None:
        where = '"shared_storage_path":"{scratch.kv}"'
        assert text.count(where) == 2  # prefill and decode
        text = text.replace(where, f'"shared_storage_path":"{kv_folder}"')
        text = "\n".join(line for line in text.splitlines() if not line.startswith("scratch ="))
    if not verdict:
        head, sep, _ = text.partition("\n[verdict]")
        assert sep, "the example has a [verdict] table"
        text = head + "\n"
    return text


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Baseline]:
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("pd-baseline")
        mp.setenv(MARKER, folder.name + str(os.getpid()))
        vllm_stack.ensure_stack()  # the venv (minutes, once per machine), the plugin, the model
        assert ApiServers().count() == 0, "a vLLM server is already running: the watcher would count it"
        manifest = load_manifest(EXAMPLE)
        settings = dataclasses.replace(DivergenceSettings.quick(), **manifest.probe.settings)  # the example's probe
        oracle = ServerOracle(manifest.target, manifest.patches, manifest.probe)
        t0 = time.monotonic()
        stack, _ = oracle.start((), folder / "baseline.log")
        with stack:
            backend = HttpBackend(f"http://127.0.0.1:{stack.port}", "smollm2", api="vllm")
            rec = record(backend, folder / "base.strec", divergence=settings, progress=False)
            assert stack.scratch is not None
            shutil.copytree(stack.scratch / "kv", folder / "stale-kv")
        assert not (folder / "baseline.scratch").exists(), "the scratch folder outlived its stack"
        written = [p for p in (folder / "stale-kv").iterdir() if p.is_dir()]
        assert written, "the baseline's prefill wrote no KV into {scratch.kv}: the connector is not in use"
        yield Baseline(rec.path, folder / "stale-kv", time.monotonic() - t0)


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.timeout(1800)  # the baseline and two trials: 3 stack launches
def test_each_trial_gets_a_fresh_kv_folder_a_stale_one_hides_the_prefill_culprit(
    baseline: Baseline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARKER, tmp_path.name + str(os.getpid()))
    t0 = time.monotonic()
    request = TrialRequest((CULPRIT,), 0, tmp_path / "trials", "fresh")
    # The baseline's KV at the very place this trial's {scratch.kv} will be (a launch that died before removing
    # it, or a run resumed in the same folder): speedtrap must start the trial on an empty folder anyway.
    leftover = tmp_path / "trials" / "fresh.scratch" / "kv"
    shutil.copytree(baseline.stale_kv, leftover)
    manifest = load_manifest(EXAMPLE)
    probe = dataclasses.replace(manifest.probe, reference=str(baseline.recording))
    with ApiServers() as watcher:
        oracle = ServerOracle(manifest.target, manifest.patches, probe)
        oracle.prepare(None)
        fresh = oracle.measure(request, 1).figures
        assert not leftover.parent.exists(), "the trial's scratch folder outlived its stack"
        # The construction: the same trial with the KV folder a fixed path, holding the baseline's KV.
        stale_path = tmp_path / "stale.toml"
        stale_path.write_text(_manifest_text(kv_folder=baseline.stale_kv, verdict=True))
        stale_manifest = load_manifest(stale_path)
        assert stale_manifest.target.stack is not None and not stale_manifest.target.stack.scratch
        oracle = ServerOracle(stale_manifest.target, stale_manifest.patches, probe)
        oracle.prepare(None)
        stale = oracle.measure(TrialRequest((CULPRIT,), 0, tmp_path / "trials", "stale"), 1).figures
    seconds = time.monotonic() - t0
    shown = {k: round(v, 4) for k, v in (("fresh", fresh["decode.kl_p99"]), ("stale", stale["decode.kl_p99"]))}
    print(
        f"decode.kl_p99 {shown}; prefill.kl_p99 fresh {fresh['prefill.kl_p99']:.4f} stale "
        f"{stale['prefill.kl_p99']:.4f}; baseline {baseline.seconds:.0f} s, two trials {seconds:.0f} s"
    )
    assert fresh["decode.kl_p99"] > BOUND, fresh  # a fresh folder: the decode reads the patched prefill's KV
    assert stale["decode.kl_p99"] < 1e-3, stale  # the stale one: the baseline's KV, the culprit invisible
    # The prompt logprobs never read external KV: the prefill phase shows the patch either way.
    assert fresh["prefill.kl_p99"] > BOUND and stale["prefill.kl_p99"] > BOUND
    assert watcher.most == 2, f"{watcher.most} vLLM API servers alive at once (a stack is two)"


@pytest.mark.stack
@pytest.mark.slow
@pytest.mark.timeout(3600)  # the checked build and the hunt's trials: about 5 stack launches
def test_the_gate_launches_the_pd_build_stops_it_and_hunts_with_the_failed_bound(
    baseline: Baseline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARKER, tmp_path.name + str(os.getpid()))
    path = tmp_path / "speedtrap.toml"
    path.write_text(_manifest_text(kv_folder=None, verdict=False))
    assert "[verdict]" not in path.read_text() and "{scratch.kv}" in path.read_text()
    argv = [sys.executable, "-m", "speedtrap", "check", "--against", str(baseline.recording), "--manifest", str(path),
            "--bisect-on-fail", "--run-dir", str(tmp_path / "hunt"), "--json"]  # fmt: skip
    t0 = time.monotonic()
    with ApiServers() as watcher:  # from the check's launch to the end of the hunt
        done = subprocess.run(argv, capture_output=True, text=True, timeout=3300, check=False)
    seconds = time.monotonic() - t0
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(done.stdout)
    failed = [c for c in doc["checks"] if c["probe"] == "divergence"]
    assert [c["passed"] for c in failed] == [False], failed
    assert doc["bisect"] is not None and "bisect_error" not in doc, doc.get("bisect_error")
    trials = doc["bisect"]["trials"]
    print(
        f"gate + hunt {seconds:.0f} s, {len(trials)} trials: "
        + "; ".join(f"{'+'.join(t['config']) or 'baseline'} {t['outcome']}" for t in trials)
    )
    assert [c["patches"] for c in doc["bisect"]["culprits"]] == [[CULPRIT]]
    singles = {tuple(t["config"]): t["outcome"] for t in trials if len(t["config"]) == 1}
    assert singles.get((CULPRIT,), "fail") == "fail"
    for name in ("prefill_mlp_scale@decode", "decode_chunked_256", "silu_native"):
        assert singles.get((name,)) in (None, "pass"), singles  # where measured alone, the others pass
    assert watcher.most <= 2, f"{watcher.most} vLLM API servers alive at once: two stacks"
    assert watcher.most == 2  # the watcher did see the stack
    assert ApiServers().count() == 0, "a vLLM server outlived the gate"
