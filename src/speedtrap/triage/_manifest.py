"""The names live-process inspection (``_inspect``) imports from here; the manifest reader itself is
``speedtrap.triage.source.manifest``. Inspection moves to ``speedtrap.stack``; this goes with it."""

from speedtrap.triage.source import CONFIG, ENV, FLAG

__all__ = ["CONFIG", "ENV", "FLAG"]
