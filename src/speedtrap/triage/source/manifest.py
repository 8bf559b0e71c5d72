"""The patches of a ``speedtrap.toml`` manifest, as triage reads them.

The manifest is read once (:func:`speedtrap.manifest.load_manifest`: one set of checks); triage keeps only
what it needs of each patch, and the optional ``tree``::

    tree = "../sglang/python"          # optional: the source tree the diffs apply to

    [target]
    model = "models/DeepSeek-V3"       # optional: a folder with a config.json feeds --model reachability
    platform = "cuda"                  # optional: the hardware served on; feeds --platform reachability

    [[patches]]
    name = "mhc_bf16_gemm"
    env = { SGLANG_MHC_BF16 = "1" }    # optional: environment that switches it on
    args = ["--enable-foo"]            # optional: launch arguments that switch it on
    config = { apply_x = "true" }      # optional: model-config keys that select it
    diff = "patches/mhc.diff"          # optional: relative to the manifest
    commit = "3f2a9c1"                 # optional: a commit (or A..B) of [target] repo; its diff is read from git
    gate = "ungated"                   # optional: compiled in, no switch
    summary = "..."                    # optional
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from speedtrap._errors import ManifestError
from speedtrap.patching import Gate, GateKind

if TYPE_CHECKING:
    from speedtrap.manifest import Manifest

ENV, FLAG, CONFIG, UNGATED = GateKind.ENV, GateKind.FLAG, GateKind.CONFIG, GateKind.UNGATED


@dataclass(frozen=True)
class ManifestPatch:
    name: str
    gate: Gate | None  # None: a commit patch with no switch (triage reads its gate off the diff)
    diff_path: Path | None
    summary: str = ""
    commits: tuple[str, ...] = ()  # a commit patch: its commits (full shas) in [target] repo


def manifest_patches(manifest: Manifest) -> tuple[ManifestPatch, ...]:
    """What triage reads of each of the manifest's patches (a manifest without any is an error here)."""
    if not manifest.patches:
        raise ManifestError(
            f"manifest {str(manifest.path)!r} has no [[patches]] tables", "add one [[patches]] table per patch"
        )
    return tuple(
        ManifestPatch(p.name, None if p.gate.kind is GateKind.COMMIT else p.gate, p.diff, p.summary, p.commits)
        for p in manifest.patches
    )


def manifest_model(manifest: Manifest) -> Path | None:
    """``[target] model`` when it names the model's class: a config.json or a folder holding one (a GGUF
    file or a hub name does not, so it feeds no reachability)."""
    target = manifest.target_spec
    if target is None or not target.model:
        return None
    path = Path(target.model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    return path if path.is_file() and path.name.endswith(".json") else None
