"""Isolate's divergence trials stop once the verdict is decided, and name the same culprit as the full grid.

Ground truth by construction: ``hash_topk_routed_scaling`` scales the routed experts' weights (KL of nats), the
other patches are harmless or far below the bound (bf16 lm_head: p99 about 0.002).
"""

from __future__ import annotations

from pathlib import Path

from speedtrap.isolate import Status, isolate, manifest_for_target
from speedtrap.manifest import ProbeSpec, VerdictSpec
from speedtrap.targets._base import InProcessModel

PROBE = ProbeSpec("divergence", None, {"lengths": [128], "decode_tokens": 16, "bucket_size": 64})
PATCHES = ["fused_rmsnorm", "moe_fused_experts", "hash_topk_routed_scaling", "lm_head_bf16"]
CULPRIT = ("hash_topk_routed_scaling",)


def test_the_stop_names_the_same_culprit_with_fewer_positions(smol: InProcessModel, tmp_path: Path) -> None:
    runs = {}
    for sequential in (False, True):
        verdict = VerdictSpec(metric="worst.kl_p99", bound=0.05, repeats=0, sequential=sequential)
        manifest = manifest_for_target("smol-moe", PATCHES, probe=PROBE, verdict=verdict)
        runs[sequential] = isolate(manifest, tmp_path / f"run-{sequential}", model=smol)
    full, early = runs[False], runs[True]
    assert full.status is early.status is Status.FOUND
    assert full.culprit_names == early.culprit_names == [CULPRIT]
    assert not any(t.stopped for t in full.trials)
    stopped = [t for t in early.trials if t.stopped]
    assert stopped and all(CULPRIT[0] in t.config for t in stopped)  # only failing trials stop early
    assert all("stopped after the prefill" in str(t.stopped) for t in stopped)
    assert all("decode.kl_p99" not in t.figures for t in stopped)
    assert any(n.startswith(f"trial {stopped[0].index} ") for n in early.notes)  # the report says where
    assert [(t.config, t.outcome) for t in full.trials] == [(t.config, t.outcome) for t in early.trials]
