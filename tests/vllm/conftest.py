"""Fixtures of the vLLM tests: the venv (built once into the clone), the exported model, one server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_stack import ensure_stack, start_vllm

from speedtrap.stack import Server


@pytest.fixture(scope="session")
def stack() -> tuple[Path, Path]:
    """The vLLM venv's python (with the example plugin) and the exported SmolLM2 folder."""
    return ensure_stack()


@pytest.fixture(scope="module")
def vllm_server(stack: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One vLLM with the example plugin loaded and its harmless SiLU patch switched on."""
    python, model = stack
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with start_vllm(python, model, log, SPEEDTRAP_VLLM_SILU_NATIVE="1") as server:
        yield server
