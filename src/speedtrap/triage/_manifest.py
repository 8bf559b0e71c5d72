"""The patches of a ``speedtrap.toml`` manifest, as triage reads them.

Small on purpose, so it can be swapped for the shared manifest reader::

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
    gate: GateSpec
    diff_path: Path | None
    summary: str = ""


@dataclass(frozen=True)
class Manifest:
    path: Path
    patches: tuple[ManifestPatch, ...]
    tree: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def _str_table(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ManifestError(f'{where} must be a table of NAME = "value"', 'write e.g. env = { VAR = "1" }')
    out = []
    for k, v in value.items():
        if not isinstance(v, (str, int, float, bool)):
            raise ManifestError(f"{where}.{k} must be a string", "quote the value")
        out.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
    return tuple(out)


def load_manifest(path: Path) -> Manifest:
    """Read and check a manifest; every problem is a :class:`ManifestError` naming the field."""
    path = Path(path)
    data = read_manifest_toml(path)
    raw = data.get("patches")
    if not isinstance(raw, list) or not raw:
        raise ManifestError(f"manifest {str(path)!r} has no [[patches]] tables", "add one [[patches]] table per patch")
    base = path.parent
    patches: list[ManifestPatch] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"patches[{i}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where} must be a table", "write [[patches]] tables")
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ManifestError(f"{where}.name is missing or not a string", "give every patch a name")
        if name in seen:
            raise ManifestError(f"{where}.name {name!r} is used twice", "give every patch its own name")
        seen.add(name)
        env = _str_table(entry.get("env", {}), f"{where}.env")
        config = _str_table(entry.get("config", {}), f"{where}.config")
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ManifestError(f"{where}.args must be a list of strings", 'write e.g. args = ["--enable-foo"]')
        gate_word = entry.get("gate")
        if gate_word not in (None, UNGATED):
            raise ManifestError(f'{where}.gate must be "ungated" when given', 'drop it, or set gate = "ungated"')
        if gate_word == UNGATED and (env or args or config):
            raise ManifestError(f"{where} is marked ungated but has env/args/config", "drop gate or the switches")
        kind = ENV if env else FLAG if args else CONFIG if config else UNGATED
        diff = entry.get("diff")
        if diff is not None and not isinstance(diff, str):
            raise ManifestError(f"{where}.diff must be a path string", 'write diff = "patches/x.diff"')
        summary = entry.get("summary", "")
        patches.append(
            ManifestPatch(name, GateSpec(kind, env, tuple(args), config), (base / diff) if diff else None, str(summary))
        )
    tree = data.get("tree")
    if tree is not None and not isinstance(tree, str):
        raise ManifestError("tree must be a path string", 'write tree = "path/to/source"')
    return Manifest(path, tuple(patches), (base / tree) if tree else None)
