"""A patch's gate: how it is switched on (env vars, launch args, config keys, by name, or not at all)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class GateKind(enum.StrEnum):
    ENV = "env"  # an environment variable switches it on (A/B by relaunching)
    FLAG = "flag"  # a launch argument switches it on
    CONFIG = "config"  # a model-config key selects it: config-conditional, harder to A/B
    UNGATED = "ungated"  # compiled in: cannot be switched off without a rebuild
    IN_PROCESS = "in-process"  # applied by name to an in-process model (a user's module:function patch)
    COMMIT = "commit"  # a commit of the stack's source: switched by the worktree a trial runs from


_ON = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class Gate:
    """How a patch is switched on: env vars, launch args, config keys, by name in-process, or not at all.

    The one gate type of the catalogue, triage and manifests. ``kind`` may be given as its string.
    """

    kind: GateKind
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    config: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", GateKind(self.kind))

    @classmethod
    def env_var(cls, key: str, value: str = "1") -> Gate:
        return cls(GateKind.ENV, env=((key, value),))

    @classmethod
    def flag(cls, *args: str) -> Gate:
        return cls(GateKind.FLAG, args=tuple(args))

    @classmethod
    def config_key(cls, key: str, value: str = "true") -> Gate:
        return cls(GateKind.CONFIG, config=((key, value),))

    @property
    def key(self) -> str:
        """The first switch's name: an env var, the launch args, or a config key."""
        if self.env:
            return self.env[0][0]
        if self.args:
            return " ".join(self.args)
        if self.config:
            return self.config[0][0]
        return ""

    @property
    def value(self) -> str:
        pairs = self.env or self.config
        return pairs[0][1] if pairs else ""

    def describe(self) -> str:
        if self.kind in (GateKind.UNGATED, GateKind.IN_PROCESS):
            return self.kind.value
        parts = [f"{k}={v}" for k, v in self.env] + list(self.args) + [f"{k}={v}" for k, v in self.config]
        return f"{self.kind.value}: {' '.join(parts)}"

    def is_on(self, environ: Mapping[str, str], config: Mapping[str, Any] | None = None) -> bool:
        """Whether this gate is switched on by an environment and a model config."""
        if self.kind is GateKind.ENV:
            return bool(self.env) and all(environ.get(k, "").strip().lower() in _ON for k, _ in self.env)
        if self.kind is GateKind.CONFIG and config is not None:
            return bool(self.config) and all(str(config.get(k, "")).strip().lower() in _ON for k, _ in self.config)
        return False

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "env": dict(self.env), "args": list(self.args), "config": dict(self.config)}
