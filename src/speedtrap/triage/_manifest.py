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

ENV, FLAG, CONFIG, UNGATED = "env", "flag", "config", "ungated"


@dataclass(frozen=True)
class GateSpec:
    """How a patch is switched on: env vars, launch args, config keys, or nothing (ungated)."""

    kind: str
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    config: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        if self.env:
            return self.env[0][0]
        if self.args:
            return " ".join(self.args)
        if self.config:
            return self.config[0][0]
        return ""

    def describe(self) -> str:
        if self.kind == UNGATED:
            return "ungated"
        parts = [f"{k}={v}" for k, v in self.env] + list(self.args) + [f"{k}={v}" for k, v in self.config]
        return f"{self.kind}: {' '.join(parts)}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "env": dict(self.env), "args": list(self.args), "config": dict(self.config)}


@dataclass(frozen=True)
class ManifestPatch:
    name: str
    gate: GateSpec | None
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


def load_manifest(path: Path) -> Manifest:
    """Read and check a manifest's patches (isolate's reader: the same checks, the same messages)."""
    from speedtrap.isolate import resolve_commits_in
    from speedtrap.isolate._manifest import parse_patches

    path = Path(path)
    data = read_manifest_toml(path)
    if data.get("patches") is None:
        raise ManifestError(f"manifest {str(path)!r} has no [[patches]] tables", "add one [[patches]] table per patch")
    specs = parse_patches(data.get("patches"), path.parent, required=True)
    repo, base = _commits(data, path.parent, specs)
    if repo is not None:
        repo, base, specs = resolve_commits_in(repo, base, specs)
    patches = tuple(
        ManifestPatch(p.name, _gate(p.gate, p.env, p.args, p.config), p.diff, p.summary, p.commits) for p in specs
    )
    tree = data.get("tree")
    if tree is not None and not isinstance(tree, str):
        raise ManifestError("tree must be a path string", 'write tree = "path/to/source"')
    return Manifest(path, patches, (path.parent / tree) if tree else None, repo=repo, base=base)


def _gate(kind: str, env: Any, args: Any, config: Any) -> GateSpec | None:
    if kind == "commit":  # no switch declared: triage reads the gate off the diff
        return None
    return GateSpec(kind if kind != "in-process" else UNGATED, env, args, config)


def _commits(data: dict[str, Any], base: Path, specs: Any) -> tuple[Path | None, str | None]:
    from speedtrap.isolate import commit_target_fields

    target = data.get("target")
    fields = commit_target_fields(target if isinstance(target, dict) else {}, base)
    repo = fields["repo"]
    if repo is None and any(p.commit is not None for p in specs):
        raise ManifestError(
            "the manifest's patches are commits but [target] names no repository",
            'add repo = "path/to/checkout" and base = "<sha>" to [target]',
        )
    return repo, fields["base"]
