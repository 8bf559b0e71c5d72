"""The manifest: one typed reading of a ``speedtrap.toml``, handed to every stage.

::

    from speedtrap.manifest import load_manifest
    manifest = load_manifest(Path("speedtrap.toml"))   # every problem: one ManifestError naming the key
    manifest.target, manifest.patches, manifest.probe, manifest.verdict, manifest.tree

``[target]`` and ``[[patches]]`` are parsed by the stack package (what is launched and how each patch is
switched); this package adds the probe, the verdict, the search and the checks of the top level.
"""

from __future__ import annotations

from speedtrap.manifest._parse import TABLES, check_tables, load_manifest, parse_manifest
from speedtrap.manifest._spec import (
    DIRECTIONS,
    EXECUTORS,
    PROBE_APIS,
    PROBE_KINDS,
    REFERENCE_MODES,
    RULES,
    Manifest,
    ProbeSpec,
    VerdictSpec,
)

__all__ = [
    "DIRECTIONS",
    "EXECUTORS",
    "PROBE_APIS",
    "PROBE_KINDS",
    "REFERENCE_MODES",
    "RULES",
    "TABLES",
    "Manifest",
    "ProbeSpec",
    "VerdictSpec",
    "check_tables",
    "load_manifest",
    "parse_manifest",
]
