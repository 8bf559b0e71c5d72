"""Targets: what speedtrap runs. In-process models now; servers are described by manifests."""

from __future__ import annotations

from speedtrap._errors import UsageError
from speedtrap.targets._base import CausalLM, InProcessModel, Target

__all__ = ["CausalLM", "InProcessModel", "Target", "known_targets", "resolve_target"]


def known_targets() -> list[Target]:
    from speedtrap.targets.smolmoe import SmolMoETarget

    return [SmolMoETarget()]


def resolve_target(spec: str) -> Target:
    """A target by name: ``smol-moe``, or ``hf:<model type | local directory | file.gguf>``."""
    if spec.startswith("hf:"):
        from speedtrap.targets.hf import HFTarget

        return HFTarget(spec.removeprefix("hf:"))
    for target in known_targets():
        if target.name == spec:
            return target
    names = ", ".join(t.name for t in known_targets())
    raise UsageError(f"unknown target {spec!r}", f"choose one of: {names}, or hf:<model type | directory | file.gguf>")
