"""The patches of a ``speedtrap.toml`` manifest, as triage reads them.

The ``[[patches]]`` tables are read by isolate's parser (one set of checks); triage keeps only
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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError
from speedtrap._toml import read_manifest_toml
from speedtrap.patching import Gate, GateKind
from speedtrap.spec import Platform

ENV, FLAG, CONFIG, UNGATED = GateKind.ENV, GateKind.FLAG, GateKind.CONFIG, GateKind.UNGATED


@dataclass(frozen=True)
class ManifestPatch:
    name: str
    gate: Gate | None  # None: a commit patch with no switch (triage reads its gate off the diff)
    diff_path: Path | None
    summary: str = ""
    commits: tuple[str, ...] = ()  # a commit patch: its commits (full shas) in [target] repo


@dataclass(frozen=True)
class Manifest:
    path: Path
    patches: tuple[ManifestPatch, ...]
    tree: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    repo: Path | None = None  # commit patches: [target] repo and its base (a full sha)
    base: str | None = None
    model: Path | None = None  # [target] model, where it is a config.json or a folder holding one
    platform: Platform | None = None  # [target] platform


def load_manifest(path: Path) -> Manifest:
    """Read and check a manifest's patches (isolate's reader: the same checks, the same messages)."""
    from speedtrap.stack import manifest_stack, parse_patches, resolve_commits_in

    path = Path(path)
    data = read_manifest_toml(path)
    if data.get("patches") is None:
        raise ManifestError(f"manifest {str(path)!r} has no [[patches]] tables", "add one [[patches]] table per patch")
    specs = parse_patches(data.get("patches"), path.parent, required=True, stack=manifest_stack(data, path))
    repo, base = _commits(data, path.parent, specs)
    if repo is not None:
        repo, base, specs = resolve_commits_in(repo, base, specs)
    patches = tuple(
        ManifestPatch(p.name, None if p.gate.kind is GateKind.COMMIT else p.gate, p.diff, p.summary, p.commits)
        for p in specs
    )
    tree = data.get("tree")
    if tree is not None and not isinstance(tree, str):
        raise ManifestError("tree must be a path string", 'write tree = "path/to/source"')
    return Manifest(
        path,
        patches,
        (path.parent / tree) if tree else None,
        repo=repo,
        base=base,
        model=_model(data, path.parent),
        platform=_platform(data),
    )


def _platform(data: dict[str, Any]) -> Platform | None:
    """``[target] platform``, checked by the one parser (a bad value names ``target.platform``)."""
    target = data.get("target")
    if not isinstance(target, dict) or "platform" not in target:
        return None
    return Platform.parse(target["platform"], "target.platform", ManifestError)


def _model(data: dict[str, Any], base: Path) -> Path | None:
    """``[target] model`` when it names the model's class: a config.json or a folder holding one (a GGUF
    file or a hub name does not, so it feeds no reachability)."""
    target = data.get("target")
    raw = target.get("model") if isinstance(target, dict) else None
    if not isinstance(raw, str) or not raw:
        return None
    path = Path(raw).expanduser()
    path = path if path.is_absolute() else base / path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    return path if path.is_file() and path.name.endswith(".json") else None


def _commits(data: dict[str, Any], base: Path, specs: Any) -> tuple[Path | None, str | None]:
    from speedtrap.stack import commit_target_fields

    target = data.get("target")
    fields = commit_target_fields(target if isinstance(target, dict) else {}, base)
    repo = fields["repo"]
    if repo is None and any(p.commit is not None for p in specs):
        raise ManifestError(
            "the manifest's patches are commits but [target] names no repository",
            'add repo = "path/to/checkout" and base = "<sha>" to [target]',
        )
    return repo, fields["base"]
