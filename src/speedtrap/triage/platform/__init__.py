"""Platform: which changed code the served platform (``--platform cuda``) can select, read off the code; and the
runtime phase of a batch (decode, prefill, a speculative step) a changed line runs under, which is not a switch."""

from __future__ import annotations

from speedtrap.triage.platform.phases import RuntimePhase, phase_of, runtime_phase
from speedtrap.triage.platform.placement import PlatformReach

__all__ = ["PlatformReach", "RuntimePhase", "phase_of", "runtime_phase"]
