"""The ``speedtrap`` command line. The library never imports this package."""

from __future__ import annotations

from speedtrap.cli import _demo as _demo
from speedtrap.cli import _init as _init
from speedtrap.cli import _isolate as _isolate
from speedtrap.cli import _localize as _localize
from speedtrap.cli import _probe as _probe
from speedtrap.cli import _record as _record
from speedtrap.cli import _repeat as _repeat
from speedtrap.cli import _report as _report
from speedtrap.cli import _targets as _targets
from speedtrap.cli import _triage as _triage
from speedtrap.cli._app import app, main

__all__ = ["app", "main"]
