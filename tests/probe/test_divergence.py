"""The divergence probe in-process: zero against itself, precision and decode-only patches, sensitivity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from probe_helpers import MLP_X15

from speedtrap.probe import (
    DivergenceReport,
    DivergenceSettings,
    InProcessBackend,
    RecallReport,
    RecallSettings,
    run_divergence,
    run_recall,
)
from speedtrap.targets._base import InProcessModel

# One 272-token conversation (chunked_prefill cuts it at 256); the last 8 tokens decoded one by one.
SETTINGS = DivergenceSettings(lengths=(272,), sequences=1, decode_tokens=8, bucket_size=64)
HARMLESS = ("fused_rmsnorm", "moe_fused_experts", "chunked_prefill")
# The margin the sensitivity test demands: the 1.5x change's mean KL over the harmless patches' worst p99.
SENSITIVITY_MARGIN = 100.0


@pytest.fixture(scope="module")
def base(smol_scaled: InProcessModel) -> InProcessBackend:
    """The baseline; it keeps its logits, so each comparison below computes only the candidate."""
    return InProcessBackend(smol_scaled)


def _divergence(base: InProcessBackend, model: InProcessModel, patches: list[str]) -> DivergenceReport:
    return run_divergence(base, InProcessBackend(model, patches), SETTINGS, progress=False)


def test_baseline_against_itself_is_exactly_zero(base: InProcessBackend, smol_scaled: InProcessModel) -> None:
    report = _divergence(base, smol_scaled, [])
    assert report.approximation is None and set(report.phases) == {"prefill", "decode"}
    assert report.sequence_tokens == [272]
    for phase in report.phases.values():
        s = phase.overall
        assert (s.kl_max, s.same_top1, s.rms_dp) == (0.0, 1.0, 0.0)
    assert report.phases["decode"].overall.tokens == SETTINGS.decode_tokens
    assert report.phases["prefill"].overall.tokens == report.sequence_tokens[0] - 1
    assert DivergenceReport.from_json(json.loads(json.dumps(report.to_json()))).to_json() == report.to_json()


def test_a_precision_patch_diverges_in_every_position_bucket(
    base: InProcessBackend, smol_scaled: InProcessModel
) -> None:
    report = _divergence(base, smol_scaled, ["lm_head_bf16"])
    prefill = report.phases["prefill"]
    assert 0 < prefill.overall.kl_mean < 0.05
    assert len(prefill.by_bucket) == 5  # positions 1-271 in buckets of 64
    assert all(b.stats.kl_mean > 0 and b.stats.tokens > 0 for b in prefill.by_bucket)
    assert prefill.overall.kl_max >= prefill.overall.kl_p99 >= prefill.overall.kl_p90 >= prefill.overall.kl_median
    assert report.phases["decode"].overall.kl_mean > 0


def test_a_decode_only_patch_is_invisible_to_prefill(base: InProcessBackend, smol_scaled: InProcessModel) -> None:
    report = _divergence(base, smol_scaled, ["fp8_kv_cache"])
    assert report.phases["prefill"].overall.kl_max == 0.0
    assert report.phases["decode"].overall.kl_mean > 1e-4
    # The JSON carries the figures a verdict reads: worst = the worse phase, here decode's (prefill is exactly 0).
    worst = report.to_json()["worst"]
    decode = report.phases["decode"].overall
    assert worst["kl_p99"] == decode.kl_p99 > 0 and worst["kl_mean"] == decode.kl_mean
    assert worst["same_top1"] == min(decode.same_top1, report.phases["prefill"].overall.same_top1)


def test_a_change_recall_cannot_see_stands_out_in_divergence(
    base: InProcessBackend, smol_scaled: InProcessModel
) -> None:
    scaled = _divergence(base, smol_scaled, [MLP_X15])
    harmless = {name: _divergence(base, smol_scaled, [name]) for name in HARMLESS}
    noise = max(r.phases[p].overall.kl_p99 for r in harmless.values() for p in ("prefill", "decode"))
    signal = min(scaled.phases[p].overall.kl_mean for p in ("prefill", "decode"))
    figures = {n: {p: r.phases[p].overall.kl_p99 for p in r.phases} for n, r in harmless.items()}
    assert signal > SENSITIVITY_MARGIN * noise, (signal, figures)
    assert all(r.phases[p].overall.same_top1 >= 0.99 for r in harmless.values() for p in r.phases)


@pytest.mark.slow
def test_the_same_change_is_invisible_to_recall(smol_scaled: InProcessModel, grid_baseline: RecallReport) -> None:
    """The other half of the sensitivity claim, measured (anchors.md: 8/8 at every length)."""
    settings = RecallSettings(lengths=(1024,), depths=(0.1, 0.9), samples=2, seed=0)  # a subset of the grid
    scaled = run_recall(InProcessBackend(smol_scaled, [MLP_X15]), settings, progress=False)
    same = [s for s in grid_baseline.samples if s.length == 1024 and s.depth in settings.depths]
    assert len(same) == 4
    assert scaled.overall.accuracy >= 0.75, scaled.answers()
    assert scaled.overall.correct >= sum(s.correct for s in same) - 1


class InterruptedAfter(InProcessBackend):
    """A real in-process candidate interrupted (as by Ctrl-C) when its ``after + 1``-th sequence starts."""

    def __init__(self, model: InProcessModel, patches: list[str], after: int) -> None:
        super().__init__(model, patches)
        self.after, self.calls = after, 0

    def prefill_logits(self, ids: list[int]) -> object:  # type: ignore[override]
        if self.calls >= self.after:
            raise KeyboardInterrupt
        self.calls += 1
        return super().prefill_logits(ids)


def test_an_interrupted_divergence_keeps_its_sequences_and_resumes(smol: InProcessModel, tmp_path: Path) -> None:
    from speedtrap._errors import UsageError

    settings = DivergenceSettings(lengths=(64,), sequences=3, decode_tokens=4, bucket_size=16)
    results = tmp_path / "divergence.jsonl"
    base = InProcessBackend(smol)
    with pytest.raises(KeyboardInterrupt):
        first = InterruptedAfter(smol, ["lm_head_bf16"], 2)
        run_divergence(base, first, settings, results_path=results, progress=False)
    assert len(results.read_text().splitlines()) == 1 + 2  # header + the two finished sequences
    with pytest.raises(UsageError, match="already exists"):
        run_divergence(base, InProcessBackend(smol, ["lm_head_bf16"]), settings, results_path=results, progress=False)
    second = InterruptedAfter(smol, ["lm_head_bf16"], 100)
    resumed = run_divergence(base, second, settings, results_path=results, resume=True, progress=False)
    assert second.calls == 1  # only the missing sequence ran
    whole = run_divergence(base, InProcessBackend(smol, ["lm_head_bf16"]), settings, progress=False)
    assert resumed.sequence_tokens == whole.sequence_tokens
    for phase in ("prefill", "decode"):
        assert resumed.phases[phase].to_json() == whole.phases[phase].to_json()
    assert resumed.phases["prefill"].overall.kl_mean > 0
