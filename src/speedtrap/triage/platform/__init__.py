"""Platform: which changed code the served platform (``--platform cuda``) can select, read off the code."""

from __future__ import annotations

from speedtrap.triage.platform.placement import PlatformReach

__all__ = ["PlatformReach"]
