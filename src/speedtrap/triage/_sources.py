"""The names live-process inspection (``_inspect``) imports from here; the sources themselves are
``speedtrap.triage.source.sources``. Inspection moves to ``speedtrap.stack``; this goes with it."""

from speedtrap.triage.source import PatchInput

__all__ = ["PatchInput"]
