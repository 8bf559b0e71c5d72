"""The patches of a ``speedtrap.toml`` manifest, as triage reads them.

The ``[[patches]]`` tables are read by isolate's parser (one set of checks); triage keeps only
what it needs of each patch, and the optional ``tree``::

    tree = "../sglang/python"          # optional: the source tree the diffs apply to

    [[patches]]
    name = "mhc_bf16_gemm"
    env = { SGLANG_MHC_BF16 = "1" }    # optional: environment that switches it on
    args = ["--enable-foo"]            # optional: launch arguments that switch it on
    config = { apply_x = "true" }      # optional: model-config keys that select it
    diff = "patches/mhc.diff"          # optional: relative to the manifest
    gate = "ungated"                   # optional: compiled in, no switch
    summary = "..."                    # optional
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError
from speedtrap._toml import read_manifest_toml
from speedtrap.patching import Gate, GateKind

ENV, FLAG, CONFIG, UNGATED = GateKind.ENV, GateKind.FLAG, GateKind.CONFIG, GateKind.UNGATED


@dataclass(frozen=True)
class ManifestPatch:
    name: str
    gate: Gate
    diff_path: Path | None
    summary: str = ""


@dataclass(frozen=True)
class Manifest:
    path: Path
    patches: tuple[ManifestPatch, ...]
    tree: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def load_manifest(path: Path) -> Manifest:
    """Read and check a manifest's patches (isolate's reader: the same checks, the same messages)."""
    from speedtrap.isolate import parse_patches

    path = Path(path)
    data = read_manifest_toml(path)
    if data.get("patches") is None:
        raise ManifestError(f"manifest {str(path)!r} has no [[patches]] tables", "add one [[patches]] table per patch")
    specs = parse_patches(data.get("patches"), path.parent, required=True)
    patches = tuple(
        ManifestPatch(p.name, p.gate,
                      p.diff, p.summary)
        for p in specs
    )  # fmt: skip
    tree = data.get("tree")
    if tree is not None and not isinstance(tree, str):
        raise ManifestError("tree must be a path string", 'write tree = "path/to/source"')
    return Manifest(path, patches, (path.parent / tree) if tree else None)
