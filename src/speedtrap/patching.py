"""What a speed patch is: a small object that swaps or wraps modules of a model.

A patch never adds an ``if`` inside the model. It carries the facts a serving engineer reads off a
real patch (its gate, kind, the layers and phases it touches, a unified diff) and an ``apply``
that swaps modules in and returns an :class:`Undo` that swaps them back.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from speedtrap._errors import PatchError

if TYPE_CHECKING:
    from torch import nn


class Phase(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class PatchKind(enum.StrEnum):
    PRECISION = "precision"
    SCALING = "scaling"
    CACHE = "cache"
    KERNEL = "kernel"
    SCHEDULING = "scheduling"


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


@dataclass(frozen=True)
class PatchInfo:
    """The static facts about a patch: everything triage and the report read."""

    name: str
    summary: str
    gate: Gate
    kind: PatchKind
    layers: tuple[int, ...]
    scope: str  # the layers in words: "every layer", "layers 0-2", "lm_head"
    phases: frozenset[Phase]
    diff: str
    file: str = ""  # the source file the diff applies to

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "gate": self.gate.to_json(),
            "kind": self.kind.value,
            "layers": list(self.layers),
            "scope": self.scope,
            "phases": sorted(p.value for p in self.phases),
            "file": self.file,
            "diff": self.diff,
        }


@dataclass
class Undo:
    """Restores what a patch swapped; calling it twice is harmless."""

    steps: list[Callable[[], None]] = field(default_factory=list)

    def __call__(self) -> None:
        while self.steps:
            self.steps.pop()()

    def swap(self, parent: nn.Module, attr: str, new: nn.Module) -> None:
        """Replace ``parent.attr`` with ``new`` and remember how to put the old one back."""
        old = getattr(parent, attr)
        setattr(parent, attr, new)
        self.steps.append(lambda: setattr(parent, attr, old))

    def extend(self, other: Undo) -> None:
        self.steps.extend(other.steps)
        other.steps.clear()


class Patch(Protocol):
    info: PatchInfo

    def apply(self, model: Any) -> Undo: ...


def select_patches(available: Sequence[Patch], names: Iterable[str]) -> list[Patch]:
    """The patches named, in the catalogue's order; an unknown name is a one-line error."""
    chosen = {info.name for info in select_patches_by_name([p.info for p in available], names)}
    return [p for p in available if p.info.name in chosen]


def select_patches_by_name(infos: Sequence[PatchInfo], names: Iterable[str]) -> list[PatchInfo]:
    """Like :func:`select_patches`, on patch facts alone (validates names before a model loads)."""
    by_name = {info.name: info for info in infos}
    wanted = [n.strip() for n in names if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise PatchError(
            f"unknown patch {', '.join(repr(n) for n in unknown)}",
            f"choose from: {', '.join(by_name)}",
        )
    return [info for info in infos if info.name in set(wanted)]


def apply_patches(model: Any, patches: Sequence[Patch]) -> Undo:
    """Apply patches in order; if one fails, undo the ones applied and raise a PatchError."""
    undo = Undo()
    for patch in patches:
        try:
            undo.extend(patch.apply(model))
        except PatchError:
            undo()
            raise
        except Exception as exc:  # a user patch may fail in any way; name it, no traceback
            undo()
            raise PatchError(
                f"patch {patch.info.name!r} failed to apply: {type(exc).__name__}: {exc}",
                "check that the patch matches this model's module names",
            ) from exc
    return undo


def parse_patch_list(text: str | None) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``; empty or None -> ``[]``."""
    if not text:
        return []
    return [part.strip() for part in text.split(",") if part.strip()]


def names_switched_on(
    infos: Sequence[PatchInfo], environ: Mapping[str, str], config: Mapping[str, Any] | None = None
) -> list[str]:
    """The patches whose gate is on in this environment and config (as a server would see them)."""
    return [info.name for info in infos if info.gate.is_on(environ, config)]
