"""smol-moe's one config dataclass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from speedtrap._errors import UsageError


@dataclass(frozen=True)
class SmolMoEConfig:
    # The dense model it is built from (SmolLM2-135M-Instruct).
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    max_positions: int = 8192
    # DeepSeek-V4's shape on top of it.
    num_experts: int = 8
    top_k: int = 2
    # Calibrated so that the seed bug (the factor applied twice, ``hash_topk_routed_scaling``) keeps
    # facts in short prompts and loses them in long ones (README, "Calibrating the seed bug's symptom").
    num_hash_layers: int = 6
    routed_scaling_factor: float = 5.0
    routed_fraction: float = 0.07  # share of the dense MLP's neurons that the routed experts hold
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 6
    seed: int = 0
    # Config-conditional switches that real deployments flip (patches read them).
    apply_routed_scaling_factor_on_output: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def routed_neurons(self) -> int:
        return round(self.intermediate_size * self.routed_fraction)

    def with_overrides(self, overrides: dict[str, str | float | int | bool]) -> SmolMoEConfig:
        """A copy with some fields replaced; values given as strings are parsed by field type."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        parsed: dict[str, Any] = {}
        for key, raw in overrides.items():
            if key not in fields:
                raise UsageError(f"smol-moe has no config key {key!r}", f"choose from: {', '.join(fields)}")
            current = getattr(self, key)
            parsed[key] = _parse_like(current, raw, key)
        return dataclasses.replace(self, **parsed)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _parse_like(current: object, raw: object, key: str) -> object:
    if not isinstance(raw, str):
        return raw
    try:
        if isinstance(current, bool):
            if raw.lower() in {"1", "true", "yes", "on"}:
                return True
            if raw.lower() in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
    except ValueError:
        raise UsageError(
            f"config value {raw!r} for {key!r} is not a {type(current).__name__}",
            f"give {key}=<{type(current).__name__}>",
        ) from None
    return raw
