"""Fixtures of the probe tests: real servers on loopback (``speedtrap serve``, llama.cpp), shared runs.

The servers these tests start use one torch thread, like the test process (tests/conftest.py): two
spinning OpenMP threads per process on a shared 2-core machine make a decode step 10-20x slower.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from probe_helpers import GRID, HTTP_GRID, MLP_X15, Server, free_port, serve_argv, start_server, stop_server
from torch import Tensor, nn

from speedtrap.patching import Gate, GateKind, PatchInfo, PatchKind, Phase, Undo
from speedtrap.probe import InProcessBackend, RecallReport, run_recall
from speedtrap.targets._base import InProcessModel


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``speedtrap serve`` with every patch gate off (the baseline), started as a user would."""
    port = free_port()
    server = start_server(serve_argv(port), port, tmp_path_factory.mktemp("serve") / "serve.log")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def grid_baseline(smol: InProcessModel) -> RecallReport:
    """The baseline's recall on the grid up to 1,024 tokens."""
    return run_recall(InProcessBackend(smol), GRID, progress=False)


@pytest.fixture(scope="session")
def http_grid_inprocess(grid_baseline: RecallReport) -> RecallReport:
    """The HTTP grid's samples as the in-process baseline answered them (a subset of the grid's)."""
    keep = [s for s in grid_baseline.samples if s.length in HTTP_GRID.lengths and s.depth in HTTP_GRID.depths]
    assert len(keep) == len(HTTP_GRID.lengths) * len(HTTP_GRID.depths) * HTTP_GRID.samples
    return RecallReport(grid_baseline.backend, HTTP_GRID, keep)


class ScaledMlp(nn.Module):
    """A block's whole MoE MLP output times a factor."""

    def __init__(self, inner: nn.Module, factor: float) -> None:
        super().__init__()
        self.inner = inner
        self.factor = factor

    def forward(self, x: Tensor, input_ids: Tensor) -> Tensor:
        out: Tensor = self.inner(x, input_ids) * self.factor
        return out


@dataclass
class ScaleMlpPatch:
    """The constructed change recall cannot see: the MLP scaled 1.5x in the first three layers."""

    info: PatchInfo
    factor: float = 1.5

    def apply(self, model: nn.Module) -> Undo:
        undo = Undo()
        for i in self.info.layers:
            block = model.layers[i]
            undo.swap(block, "mlp", ScaledMlp(block.mlp, self.factor))
        return undo


@pytest.fixture(scope="session")
def smol_scaled(smol: InProcessModel) -> InProcessModel:
    """The session's model (shared weights) with one more patch in its catalogue: ``mlp_x1.5_layers_0_2``."""
    info = PatchInfo(
        MLP_X15, "MLP output x1.5 in layers 0-2", Gate(GateKind.UNGATED), PatchKind.SCALING, (0, 1, 2),
        "layers 0-2", frozenset({Phase.PREFILL, Phase.DECODE}), "",
    )  # fmt: skip
    return InProcessModel(smol.name, smol.model, smol.tokenizer, [*smol.catalog, ScaleMlpPatch(info)], smol.config)
