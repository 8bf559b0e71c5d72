"""Fixtures for isolate's tests: simulated stacks (functions) and a tiny real server with manifests."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from _toml_text import toml_text  # one writer of test manifests, shared with test modules

HERE = Path(__file__).parent
TINY_SERVER = HERE / "tiny_server.py"
TINY_PROBE = HERE / "tiny_probe.py"


TinyManifest = Callable[..., Path]


@pytest.fixture
def tiny_manifest(tmp_path: Path) -> TinyManifest:
    """Write a manifest for the tiny server: patches gated by env vars (or ``--with NAME`` flags)."""

    def write(
        patches: Sequence[str],
        fails: Sequence[dict[str, list[str]]],
        flags: Sequence[str] = (),
        env: dict[str, str] | None = None,
        target: dict[str, Any] | None = None,
        verdict: dict[str, Any] | None = None,
        extra: dict[str, dict[str, Any]] | None = None,
        name: str = "speedtrap.toml",
        probe_args: Sequence[str] = (),
    ) -> Path:
        base_env = {"TINY_FAILS": json.dumps(list(fails)), "TINY_LAUNCHES": str(tmp_path / "launches.txt")}
        base_env.update(env or {})
        tables: dict[str, dict[str, Any]] = {
            "target": {
                "launch": [sys.executable, str(TINY_SERVER), "--port", "{port}"],
                "health": "http://127.0.0.1:{port}/health",
                "start_timeout": 20,
                "stop_timeout": 5,
                "env": base_env,
                **(target or {}),
            },
            "probe": {
                "kind": "command",
                "argv": [sys.executable, str(TINY_PROBE), "{base_url}", *probe_args],
                "timeout": 60,
            },
            "verdict": {
                "rule": "threshold",
                "metric": "metric",
                "bound": 0.5,
                "near": 0.0,
                "repeats": 0,
                **(verdict or {}),
            },
            **(extra or {}),
        }
        specs = []
        for p in patches:
            if p in flags:
                specs.append({"name": p, "args": ["--with", p]})
            else:
                specs.append({"name": p, "env": {f"TINY_P_{p.upper()}": "1"}})
        path = tmp_path / name
        path.write_text(toml_text(tables, specs))
        return path

    return write


def launches(path: Path) -> list[str]:
    """The configurations the tiny server was launched with, one per launch (a test's ground truth)."""
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def launch_log(tmp_path: Path) -> Callable[[], list[str]]:
    return lambda: launches(tmp_path / "launches.txt")


Broken = Callable[[frozenset[str]], bool]


def simulate_search(
    names: Sequence[str],
    broken: Broken | None = None,
    metric: Callable[[frozenset[str], int], float] | None = None,
    repeats: int = 0,
    metric_figures: Callable[[frozenset[str], int], dict[str, float]] | None = None,
    near: float = 0.0,
    **search_kw: Any,
) -> tuple[Any, int]:
    """Run the real search on a simulated stack (metric 1 when broken, bound 0.5); returns (result, launches)."""
    from speedtrap.isolate import Evaluator, FunctionOracle, Search, ThresholdRule, TrialStore

    def fn(config: tuple[str, ...], repeat: int) -> dict[str, float]:
        if metric_figures is not None:
            return metric_figures(frozenset(config), repeat)
        if metric is not None:
            return {"metric": metric(frozenset(config), repeat)}
        assert broken is not None
        return {"metric": 1.0 if broken(frozenset(config)) else 0.0}

    store = TrialStore(None)
    run_id, _ = store.begin_run({}, {}, False)
    evaluator = Evaluator(
        FunctionOracle(fn, {"sim": 1}), ThresholdRule("metric", 0.5, "above", near), store, run_id, repeats=repeats
    )
    if search_kw.pop("recheck", False):  # as ``isolate`` runs it: single-trial fails measured again
        search_kw["recheck"] = evaluator.recheck
    result = Search(list(names), evaluator, **search_kw).run()
    result = dataclasses.replace(result, trials=tuple(evaluator.trials), notes=(*result.notes, *evaluator.notes))
    store.close()
    return result, evaluator.launches


@pytest.fixture(scope="session")
def simulate() -> Callable[..., tuple[Any, int]]:
    return simulate_search
