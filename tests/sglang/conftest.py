"""Fixtures of the SGLang tests: the venv (built once per machine, outside the clone), the model, one server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sglang_stack import SECRET, ensure_stack, start_sglang

from speedtrap.stack import Server


@pytest.fixture(scope="session")
def stack() -> tuple[Path, Path]:
    """The SGLang venv's python and the exported SmolLM2 folder (the dense one)."""
    return ensure_stack()


@pytest.fixture(scope="module")
def sglang_server(stack: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real SGLang serving the exported SmolLM2 as measured in sglang-cpu.md (about 80 s to start)."""
    python, model = stack
    log = tmp_path_factory.mktemp("sglang") / "sglang.log"
    with start_sglang(python, model, log, **{SECRET[0]: SECRET[1]}) as server:
        yield server
