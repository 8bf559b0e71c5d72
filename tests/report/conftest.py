"""Fixtures of the report tests: one real (small) pipeline run per session, and headless Chromium.

The run is real: smol-moe (the shared ``smol`` fixture), three of its patches (the culprit and two
harmless ones), tiny probe grids. Every report test renders from that run's directory.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _report_browser import Install, ensure_chromium
from _report_run import small_settings

from speedtrap.targets._base import InProcessModel


@pytest.fixture(scope="session")
def run_dir(smol: InProcessModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A finished pipeline run (triage, probes, isolation, localization, report) in a session folder."""
    from speedtrap.pipeline import run_pipeline
    from speedtrap.report import Source

    out = tmp_path_factory.mktemp("report") / "run"
    t0 = time.perf_counter()
    result = run_pipeline(out, Source(target="smol-moe"), small_settings(), command="test run", model=smol)  # type: ignore[arg-type]
    print(f"\nreport tests: the real pipeline run took {time.perf_counter() - t0:.1f} s")
    assert result.errors == [], result.errors
    yield out


@pytest.fixture
def run_copy(run_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the run directory that a test may damage."""
    dest = tmp_path / "run"
    shutil.copytree(run_dir, dest)
    return dest


@pytest.fixture(scope="session")
def chromium() -> str:
    install = ensure_chromium()
    if install.seconds:
        print(f"\nreport tests: installing chromium took {install.seconds:.0f} s")
    if install.path is None:
        pytest.skip(f"no headless Chromium: {install.why_not}")
    return install.path


__all__ = ["Install", "small_settings"]
