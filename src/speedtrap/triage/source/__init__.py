"""The diff and the sources: patches read from diff files, a git range or a manifest, laid onto the tree
they apply to."""

from __future__ import annotations

from speedtrap.triage.source.changes import ChangedFile, lay_patch
from speedtrap.triage.source.diff import DiffError, FilePatch, Hunk, apply_patch, parse_diff
from speedtrap.triage.source.index import SourceIndex
from speedtrap.triage.source.line_patterns import text_signals
from speedtrap.triage.source.manifest import CONFIG, ENV, FLAG, UNGATED
from speedtrap.triage.source.pyast import Module, callee, condition_names, last_name, position, short
from speedtrap.triage.source.sources import (
    PatchInput,
    PatchSet,
    check_rev,
    from_diff_files,
    from_git_range,
    from_manifest,
    from_target,
    run_git,
    target_patch_inputs,
)

__all__ = [
    "CONFIG",
    "ENV",
    "FLAG",
    "UNGATED",
    "ChangedFile",
    "DiffError",
    "FilePatch",
    "Hunk",
    "Module",
    "PatchInput",
    "PatchSet",
    "SourceIndex",
    "apply_patch",
    "callee",
    "check_rev",
    "condition_names",
    "from_diff_files",
    "from_git_range",
    "from_manifest",
    "from_target",
    "last_name",
    "lay_patch",
    "parse_diff",
    "position",
    "run_git",
    "short",
    "target_patch_inputs",
    "text_signals",
]
