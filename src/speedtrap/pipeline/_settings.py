"""What a pipeline run measures, and the key that tells whether a stored stage output can be reused."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from speedtrap.spec import DivergenceProbe, RecallProbe

# Measured on smol-moe on the 2-core CPU machine (see the README's demo section): the quick demo
# fits in 5 minutes from a fresh clone, GGUF conversion included.
QUICK_LOCALIZE_TOKENS = 96
FULL_LOCALIZE_TOKENS = 512


@dataclass(frozen=True)
class PipelineSettings:
    """Probe presets and sizes of one run (``quick`` for the demo's time budget)."""

    quick: bool = True
    recall: Mapping[str, Any] = field(default_factory=dict)  # fields of probe.RecallSettings over the preset
    divergence: Mapping[str, Any] = field(default_factory=dict)  # fields of probe.DivergenceSettings
    patches: tuple[str, ...] | None = None  # in-process: search only these (default: the target's own)
    overrides: Mapping[str, str] = field(default_factory=dict)  # in-process: model config overrides
    symbol: str | None = "routed_scaling_factor"  # the factor triage traces and the scale check probes
    localize_tokens: int | None = None  # tokens of the layer diff and scale check (default by preset)
    scale_values: tuple[float, ...] | None = None  # values of the factor the scale check tries (None: its default)
    probe_culprits: bool = True  # recall and divergence of each culprit set alone
    localize: bool = True
    use_triage_prior: bool = True  # the search tries triage's tier 1 first

    @property
    def preset(self) -> str:
        return "quick" if self.quick else "default"

    @property
    def tokens(self) -> int:
        if self.localize_tokens is not None:
            return self.localize_tokens
        return QUICK_LOCALIZE_TOKENS if self.quick else FULL_LOCALIZE_TOKENS

    def probe(self, kind: Literal["divergence", "recall"]) -> DivergenceProbe | RecallProbe:
        """The spec's typed probe of ``kind`` this run measures: the preset, then the settings' fields
        (a bad key or value is one line naming it)."""
        from speedtrap.spec import DivergenceProbe, RecallProbe, parse_probe

        fields = self.recall if kind == "recall" else self.divergence
        typed = parse_probe({"kind": kind, "preset": self.preset, "settings": dict(fields)}, f"pipeline.{kind}")
        assert isinstance(typed, DivergenceProbe | RecallProbe)
        return typed

    def to_json(self) -> dict[str, Any]:
        return {
            "quick": self.quick,
            "recall": dict(self.recall),
            "divergence": dict(self.divergence),
            "patches": None if self.patches is None else list(self.patches),
            "overrides": dict(self.overrides),
            "symbol": self.symbol,
            "localize_tokens": self.tokens,
            "scale_values": None if self.scale_values is None else list(self.scale_values),
            "probe_culprits": self.probe_culprits,
            "localize": self.localize,
            "use_triage_prior": self.use_triage_prior,
        }


def stable_key(*parts: Any) -> str:
    """A short hash of JSON-able parts (sorted keys): equal inputs, equal key."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# The demo's recall grid: a short prompt and a long one, at most 10 questions each (5 depths x 2
# conversations, one fact each): the lengths smol-moe is calibrated at (benchmarks/calibrate_smolmoe.py,
# README), where the seed bug keeps 10/10 short and 1/10 long, a Wilson interval apart from the
# baseline's 10/10. Asked sequentially: each length stops once its verdict against the baseline is
# decided (probe._sequential; benchmarks/bench_sequential.py compares it with the full grid).
DEMO_RECALL: dict[str, Any] = {
    "lengths": [128, 1280],
    "depths": [0.1, 0.3, 0.5, 0.7, 0.9],
    "samples": 2,
    "sequential": True,
}


def demo_settings(quick: bool = False) -> PipelineSettings:
    """The demo's settings, sized for 2 minutes on a 2-core CPU: recall by length (:data:`DEMO_RECALL`),
    the divergence probe's quick preset; ``quick`` also skips the culprit's own recall probe and
    localizes on fewer tokens."""
    if quick:
        return PipelineSettings(quick=True, recall=DEMO_RECALL, probe_culprits=False, localize_tokens=48)
    return PipelineSettings(quick=True, recall=DEMO_RECALL)
