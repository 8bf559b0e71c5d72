"""The manifest's typed contents: target, patches, probe, verdict (read by ``_manifest``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXECUTORS = ("local", "ray")
PROBE_KINDS = ("divergence", "recall", "command")
RULES = ("threshold", "recall_drop")
DIRECTIONS = ("above", "below")
DEFAULT_HEALTH = "http://127.0.0.1:{port}/health"


@dataclass(frozen=True)
class PatchSpec:
    """One patch: how to switch it on (env vars, launch args, config keys) and how it relates to others."""

    name: str
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    config: tuple[tuple[str, str], ...] = ()
    ungated: bool = False
    diff: Path | None = None
    summary: str = ""
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()

    @property
    def gate(self) -> str:
        if self.ungated:
            return "ungated"
        return "env" if self.env else "flag" if self.args else "config" if self.config else "in-process"

    def switch(self) -> dict[str, Any]:
        """What turns it on: part of a trial's identity (changing a switch changes the trial)."""
        return {"env": dict(self.env), "args": list(self.args), "config": dict(self.config), "ungated": self.ungated}

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gate": self.gate,
            **self.switch(),
            "diff": str(self.diff) if self.diff else None,
            "summary": self.summary,
            "requires": list(self.requires),
            "conflicts": list(self.conflicts),
        }


@dataclass(frozen=True)
class TargetSpec:
    """An in-process target (``name``) or a server launched per configuration (``launch``)."""

    name: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    launch: tuple[str, ...] = ()
    model: str | None = None
    health: str = DEFAULT_HEALTH
    served_model: str | None = None
    start_timeout: float = 120.0
    stop_timeout: float = 10.0
    env: tuple[tuple[str, str], ...] = ()
    config_args: tuple[str, ...] = ("--set", "{key}={value}")
    retries: int = 1
    cwd: Path | None = None

    @property
    def in_process(self) -> bool:
        return not self.launch

    def identity(self) -> dict[str, Any]:
        if self.in_process:
            return {"in_process": self.name, "overrides": dict(self.overrides)}
        return {
            "launch": list(self.launch),
            "model": _file_identity(self.model),
            "served_model": self.served_model,
            "env": dict(self.env),
            "config_args": list(self.config_args),
        }

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name} if self.in_process else {}
        if self.in_process:
            out["overrides"] = dict(self.overrides)
            return out
        out.update(
            launch=list(self.launch),
            model=self.model,
            health=self.health,
            served_model=self.served_model,
            start_timeout=self.start_timeout,
            stop_timeout=self.stop_timeout,
            env=dict(self.env),
            config_args=list(self.config_args),
            retries=self.retries,
            cwd=str(self.cwd) if self.cwd else None,
        )
        return out


@dataclass(frozen=True)
class ProbeSpec:
    kind: str = "divergence"
    preset: str | None = "quick"
    settings: Mapping[str, Any] = field(default_factory=dict)
    argv: tuple[str, ...] = ()  # kind = "command"
    timeout: float = 600.0  # kind = "command": seconds

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind, "preset": self.preset, "settings": dict(self.settings), "argv": list(self.argv)}


@dataclass(frozen=True)
class VerdictSpec:
    """When a configuration fails: a figure against a bound, or a recall drop with Wilson intervals."""

    rule: str = "threshold"
    metric: str = "decode.kl_p99"
    bound: float = 0.5
    direction: str = "above"
    near: float = 0.25
    repeats: int = 2
    margin: float = 0.0  # recall_drop: extra drop (absolute) needed on top of non-overlapping intervals
    origin: str = ""  # how the bound was chosen when not given (e.g. derived from a noise floor)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "metric": self.metric,
            "bound": self.bound,
            "direction": self.direction,
            "near": self.near,
            "repeats": self.repeats,
            "margin": self.margin,
        }
        if self.origin:
            out["origin"] = self.origin
        return out


@dataclass(frozen=True)
class IsolateManifest:
    path: Path | None
    target: TargetSpec
    patches: tuple[PatchSpec, ...]
    probe: ProbeSpec = ProbeSpec()
    verdict: VerdictSpec = VerdictSpec()
    prior: tuple[str, ...] = ()
    parallel: int = 1  # trials at once (servers on threads, or Ray workers; Ray's default: what fits)
    executor: str = "local"  # local | ray
    address: str | None = None  # executor = "ray": the cluster (None: a local one started for the run)
    resources: tuple[tuple[str, float], ...] = ()  # executor = "ray": what one trial reserves

    def patch(self, name: str) -> PatchSpec:
        for p in self.patches:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path) if self.path else None,
            "target": self.target.to_json(),
            "patches": [p.to_json() for p in self.patches],
            "probe": {**self.probe.identity(), "timeout": self.probe.timeout},
            "verdict": self.verdict.to_json(),
            "prior": list(self.prior),
            "parallel": self.parallel,
            "executor": self.executor,
            "address": self.address,
            "resources": dict(self.resources),
        }


def _file_identity(path: str | None) -> Any:
    """A model file's identity without hashing gigabytes: path, size and modification time."""
    if not path:
        return None
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return {"path": path}
    return {"path": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
