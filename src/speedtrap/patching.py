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
from speedtrap.spec import Gate as Gate  # the gate is the spec's; re-exported for the catalogue
from speedtrap.spec import GateKind as GateKind

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
