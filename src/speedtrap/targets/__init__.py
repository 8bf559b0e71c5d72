"""Targets: what speedtrap runs in-process (servers are described by manifests).

Every stage gets its model the same way::

    from speedtrap.targets import load_target
    model = load_target("hf:deepseek_v4", patches=["mypkg.patches:double_factor"])

``load_target`` resolves the name (``smol-moe``, ``hf:<model type | directory | file.gguf>``),
imports the user's ``module:function`` patches first (a bad entry point fails before the slow
load), and loads the model with them in its catalogue beside the target's own patches.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from speedtrap._errors import UsageError
from speedtrap.patching import names_switched_on
from speedtrap.targets._base import CausalLM, InProcessModel, Target
from speedtrap.targets._lockstep import LockstepStats
from speedtrap.targets._userpatch import UserPatch, is_entry_point, load_user_patch

__all__ = [
    "CausalLM",
    "InProcessModel",
    "LockstepStats",
    "Target",
    "UserPatch",
    "is_entry_point",
    "known_targets",
    "load_target",
    "load_user_patch",
    "parse_overrides",
    "patches_switched_on",
    "resolve_target",
    "user_patches",
]


def known_targets() -> list[Target]:
    from speedtrap.targets.smolmoe import SmolMoETarget

    return [SmolMoETarget()]


def resolve_target(spec: str) -> Target:
    """A target by name: ``smol-moe``, or ``hf:<model type | local directory | file.gguf>``."""
    if spec.startswith("hf:"):
        from speedtrap.targets.hf import HFTarget

        return HFTarget(spec.removeprefix("hf:"))
    for target in known_targets():
        if target.name == spec:
            return target
    names = ", ".join(t.name for t in known_targets())
    raise UsageError(f"unknown target {spec!r}", f"choose one of: {names}, or hf:<model type | directory | file.gguf>")


def user_patches(names: Sequence[str]) -> list[UserPatch]:
    """The ``module:function`` patches among ``names``, imported (catalogue names are left out)."""
    seen: dict[str, UserPatch] = {}
    for name in names:
        if is_entry_point(name) and name not in seen:
            seen[name] = load_user_patch(name)
    return list(seen.values())


def load_target(
    spec: str | Target, overrides: Mapping[str, str] | None = None, patches: Sequence[str] = ()
) -> InProcessModel:
    """Load a target with the user patches among ``patches`` added to its catalogue.

    ``patches`` may mix catalogue names and entry points; only the entry points are imported here
    (choosing which patches are on is the caller's, by name, with ``InProcessModel.set_patches``).
    """
    target = resolve_target(spec) if isinstance(spec, str) else spec
    extra = user_patches(patches)
    return target.load(dict(overrides) if overrides else None, extra)


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    """``--set`` / ``target.overrides``: ``["key=value", ...]`` -> ``{"key": "value"}``; a bad item is one line."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects key=value, got {item!r}", "pass e.g. --set routed_scaling_factor=1.5")
        out[key.strip()] = value.strip()
    return out


def patches_switched_on(model: InProcessModel, environ: Mapping[str, str] | None = None) -> list[str]:
    """The patches a command turns on when none are named: those whose env var or config key is on."""
    return names_switched_on(model.patch_infos(), os.environ if environ is None else environ, model.config)
