"""Shared fixtures: smol-moe is loaded once per test run (about 5 s from the converted-weights cache)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from speedtrap.targets._base import InProcessModel


@pytest.fixture(scope="session")
def smol() -> Iterator[InProcessModel]:
    """smol-moe with its eight patches plus the extra constructed ones; tests leave no patch applied."""
    from speedtrap.targets.smolmoe import SmolMoETarget

    model = SmolMoETarget().load(extra_patches=True)
    yield model
    model.set_patches([])


@pytest.fixture(autouse=True)
def _no_patch_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that used ``smol`` must leave it unpatched for the next one."""
    yield
    if "smol" in request.fixturenames:
        model: InProcessModel = request.getfixturevalue("smol")
        assert model.active == (), f"test left patches applied: {model.active}"
