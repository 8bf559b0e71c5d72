"""Triage: rank speed patches from their diffs, trace a factor's sites.

It reads code and runs no model::

    from speedtrap.triage import from_target, triage, render_plan
    report = triage(from_target("smol-moe", None), symbol="routed_scaling_factor")
    print(render_plan(report))
"""

from __future__ import annotations

from pathlib import Path

from speedtrap._redact import redact_argv, redact_env, secret_name
from speedtrap.triage.flow import CountWarning, DoubleApplication, Site, TraceResult, trace_tree
from speedtrap.triage.ranking import InitResult, PatchReport, TriageReport, init_manifest, render_plan, triage
from speedtrap.triage.source import (
    DiffError,
    FilePatch,
    Hunk,
    PatchInput,
    PatchSet,
    SourceIndex,
    apply_patch,
    from_diff_files,
    from_git_range,
    from_manifest,
    from_target,
    parse_diff,
    target_patch_inputs,
)

__all__ = [
    "CountWarning",
    "DiffError",
    "DoubleApplication",
    "FilePatch",
    "Hunk",
    "InitResult",
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
