"""Fixtures for the localizer's tests: tiny transformers models (cheap) and short smol-moe inputs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from speedtrap.localize import default_ids
from speedtrap.targets._base import InProcessModel


def _load(spec: str) -> InProcessModel:
    from speedtrap.targets import resolve_target

    return resolve_target(spec).load()


@pytest.fixture(scope="session")
def hf_v4() -> Iterator[InProcessModel]:
    model = _load("hf:deepseek_v4")
    yield model
    model.set_patches([])


@pytest.fixture(scope="session")
def hf_v3() -> Iterator[InProcessModel]:
    model = _load("hf:deepseek_v3")
    yield model
    model.set_patches([])


@pytest.fixture(scope="session")
def hf_mixtral() -> Iterator[InProcessModel]:
    model = _load("hf:mixtral")
    yield model
    model.set_patches([])


@pytest.fixture(scope="session")
def smol_ids(smol: InProcessModel) -> list[int]:
    """64 tokens of the shipped prose: short, so a paired smol-moe run costs two 64-token forwards."""
    return default_ids(smol, 64)
