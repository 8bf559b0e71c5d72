"""Triage: rank speed patches from their diffs, trace a factor's sites.

It reads code and runs no model::

    from speedtrap.triage import from_target, triage, render_plan
    report = triage(from_target("smol-moe", None), symbol="routed_scaling_factor")
    print(render_plan(report))
"""

from __future__ import annotations

from pathlib import Path

from speedtrap._redact import redact_argv, redact_env, secret_name
from speedtrap.triage._diff import DiffError, FilePatch, Hunk, apply_patch, parse_diff
from speedtrap.triage._index import SourceIndex
from speedtrap.triage._init import InitResult, init_manifest
from speedtrap.triage._manifest import Manifest, load_manifest
from speedtrap.triage._plan import render_plan
from speedtrap.triage._run import PatchReport, TriageReport, triage
from speedtrap.triage._sources import (
    PatchInput,
    PatchSet,
    from_diff_files,
    from_git_range,
    from_manifest,
    from_target,
    target_patch_inputs,
)
from speedtrap.triage._trace import CountWarning, DoubleApplication, Site, TraceResult, trace_tree

__all__ = [
    "CountWarning",
    "DiffError",
    "DoubleApplication",
    "FilePatch",
    "Hunk",
    "InitResult",
    "Manifest",
    "PatchInput",
    "PatchReport",
    "PatchSet",
    "Site",
    "TraceResult",
    "TriageReport",
    "apply_patch",
    "from_diff_files",
    "from_git_range",
    "from_manifest",
    "from_target",
    "init_manifest",
    "load_manifest",
    "parse_diff",
    "redact_argv",
    "redact_env",
    "render_plan",
    "secret_name",
    "target_patch_inputs",
    "trace_symbol",
    "triage",
]


def trace_symbol(tree: Path, symbol: str) -> TraceResult:
    """Every site of ``symbol`` in ``tree`` (no patches)."""
    sites, scanned = trace_tree(SourceIndex(Path(tree)), symbol)
    return TraceResult(symbol, sites, files_scanned=scanned)
