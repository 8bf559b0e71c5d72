"""Names of a package loaded on first use: the package's ``__getattr__`` built from a table.

A package lists the names it exports in ``__all__`` and imports the light ones at once; the names
whose modules pull in heavy machinery (torch, httpx, pydantic) are in a table of name -> module and
come from this ``__getattr__`` the first time they are read (PEP 562). A name exported under another
name than its module's (``RECORDING_FORMAT`` for ``_recording_format.FORMAT``) is written
``"module:attribute"``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``table[name]`` (a module's full name, or ``module:attribute``)
    imported on first use."""

    def __getattr__(name: str) -> Any:
        if name in table:
            module, _, attribute = table[name].partition(":")
            return getattr(importlib.import_module(module), attribute or name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
