"""Helpers shared by the localizer's tests (importable: pytest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path

from speedtrap.targets._base import InProcessModel

USER_PATCHES = Path(__file__).with_name("user_patches.py")


def user_patch(name: str) -> str:
    """The entry point of a helper patch in user_patches.py (loaded by file path, as a user would)."""
    return f"{USER_PATCHES}:{name}"


def with_user_patches(model: InProcessModel, *names: str) -> list[str]:
    """Add helper patches to a model's catalogue (idempotent); returns their entry-point names."""
    from speedtrap.targets import load_user_patch

    specs = [user_patch(n) for n in names]
    known = {p.info.name for p in model.catalog}
    model.catalog = [*model.catalog, *(load_user_patch(s) for s in specs if s not in known)]
    return specs
