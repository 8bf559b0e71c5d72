"""``speedtrap bisect`` over the vLLM example against brute force: one vLLM launched per configuration.

Slow: each launch is 30-40 s on two idle cores (up to 3 minutes with the cores shared). The brute force
and the search share measurements (a memo around the real server oracle), so a configuration is
launched once; the search still goes through its own store and verdicts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from vllm_stack import ROOT

from speedtrap.isolate import Measurement, Outcome, ServerOracle, Status, ThresholdRule, TrialRequest, isolate
from speedtrap.manifest import load_manifest

pytestmark = [pytest.mark.slow, pytest.mark.stack]  # a whole hunt on a real vLLM: a benchmark, out of CI

MANIFEST = ROOT / "examples" / "vllm" / "speedtrap.toml"
CULPRIT = "double_norm_gain"  # applies a norm's gain twice in layers 2-4 (examples/vllm/plugin)
HARMLESS = ("silu_native",)  # SiLU-and-multiply in plain torch ops: the same function
# The example's patches this test searches: two of the plugin's and two exact flags. Left out to keep
# the launches few (each 35 s to 3 min here, with the cores shared): rmsnorm_native, fp8_kv_cache, bf16
# and compiled (README: bench_vllm.py runs all eight).
SEARCHED = (CULPRIT, *HARMLESS, "prefix_caching", "chunked_prefill_256")


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
    example = load_manifest(MANIFEST)
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
