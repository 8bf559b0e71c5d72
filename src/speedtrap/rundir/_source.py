"""What a run was about: the source every stage and the report read from the run record."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Source:
    """What a run was about: a built-in target (``--target``) or a manifest file (``--manifest``)."""

    target: str | None = None
    manifest: str | None = None
    symbol: str | None = "routed_scaling_factor"  # the factor triage traces and the scale check probes
    quick: bool = True
    sets: tuple[tuple[str, str], ...] = ()  # in-process config overrides (``--set key=value``)
    patches: tuple[str, ...] = ()  # in-process: the patches searched (empty: the target's own catalogue)
    symbol_given: bool = False  # --symbol was passed: the scale check measures it, not the factor triage read

    @property
    def flag(self) -> str:
        if self.manifest:
            return f"--manifest {shlex.quote(self.manifest)}"
        sets = "".join(f" --set {shlex.quote(f'{k}={v}')}" for k, v in self.sets)
        return f"--target {shlex.quote(self.target or 'smol-moe')}{sets}"

    @property
    def in_process(self) -> bool:
        return not self.manifest

    @property
    def name(self) -> str:
        return self.target or (self.manifest or "run")

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "manifest": self.manifest,
            "symbol": self.symbol,
            "quick": self.quick,
            "sets": [list(kv) for kv in self.sets],
            **({"patches": list(self.patches)} if self.patches else {}),
            **({"symbol_given": True} if self.symbol_given else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Source:
        sets = tuple((str(k), str(v)) for k, v in d.get("sets") or [])
        patches = tuple(str(p) for p in d.get("patches") or [])
        return cls(
            d.get("target"),
            d.get("manifest"),
            d.get("symbol", "routed_scaling_factor"),
            d.get("quick", True),
            sets,
            patches,
            bool(d.get("symbol_given", False)),
        )
