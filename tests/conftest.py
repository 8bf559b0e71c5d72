"""Shared fixtures: smol-moe is loaded once per test run (about 5 s from the converted-weights cache)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest

from speedtrap.targets._base import InProcessModel


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread per process: tests run servers beside the test process on 2 cores, and
    two processes each spinning two OpenMP threads run 20-30x slower than one thread each."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Hypothesis' 200 ms deadline measures the machine's load, not the code: on 2 shared cores an
    # example that takes 30 ms alone took 307 ms (a flaky failure). Correctness is what is tested.
    from hypothesis import settings

    settings.register_profile("speedtrap", deadline=None)
    settings.load_profile("speedtrap")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``stack`` (whole hunts over a real multi-server stack, minutes each) are benchmarks: CI's
    ``-m slow`` leaves them out to keep under its time budget; ``pytest -m stack`` runs them."""
    if "stack" in (config.option.markexpr or ""):
        return
    kept = [item for item in items if item.get_closest_marker("stack") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("stack")])
        items[:] = kept


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


@pytest.fixture(scope="session")
def fuzz_cases(pytestconfig: pytest.Config) -> Counter[str]:
    """Fuzz cases tried, by input kind: a fuzz test counts each case; the totals end the run's summary."""
    counts: Counter[str] = Counter()
    pytestconfig.stash[_FUZZ_CASES] = counts
    return counts


_FUZZ_CASES = pytest.StashKey[Counter[str]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    counts = config.stash.get(_FUZZ_CASES, None)
    if counts:
        terminalreporter.section("fuzz cases tried")
        for kind, n in sorted(counts.items()):
            terminalreporter.write_line(f"{n:7d}  {kind}")
        terminalreporter.write_line(f"{sum(counts.values()):7d}  in all")
