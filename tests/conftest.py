"""Shared fixtures: smol-moe is loaded once per test run (about 5 s from the converted-weights cache)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from speedtrap.targets._base import InProcessModel


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread per process: tests run servers beside the test process on 2 cores, and
    two processes each spinning two OpenMP threads run 20-30x slower than one thread each."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def smol() -> Iterator[InProcessModel]:
    """smol-moe with its eight patches plus the extra constructed ones; tests leave no patch applied."""
    from speedtrap.targets.smolmoe import SmolMoETarget

    model = SmolMoETarget().load()
    yield model
    model.set_patches([])


@pytest.fixture(autouse=True)
def _no_patch_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that used ``smol`` must leave it unpatched for the next one."""
    yield
    if "smol" in request.fixturenames:
        model: InProcessModel = request.getfixturevalue("smol")
        assert model.active == (), f"test left patches applied: {model.active}"
