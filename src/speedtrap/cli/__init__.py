"""The ``speedtrap`` command line. The library never imports this package."""

from __future__ import annotations

from speedtrap.cli import _targets as _targets
from speedtrap.cli import _triage as _triage  # noqa: F401
from speedtrap.cli._app import app, main

__all__ = ["app", "main"]
