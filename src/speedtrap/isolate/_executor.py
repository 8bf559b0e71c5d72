"""How trials run: an :class:`Executor` takes a batch of independent trials and reports each as it ends.

The local executor runs them one after another (capacity 1). An executor with more capacity
(threads each launching a server, or a Ray cluster: ``speedtrap.isolate._ray``) runs a batch at
once; the search then proposes several independent candidates per round, and with capacity 1 it
proposes exactly the ones it would have tested one by one, so the launch count does not change.

An executor that runs trials in other processes cannot take the oracle itself (a loaded model, a
running reference server): it takes the oracle's *recipe*, a picklable callable that builds an
equivalent oracle where the trial runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from speedtrap._errors import ProbeError, ServerError, UsageError
from speedtrap.isolate._results import Config
from speedtrap.stack import CommandNotFound


@dataclass(frozen=True)
class TrialRequest:
    """One trial to run: a canonical configuration, the repeat number and where its files go."""

    config: Config
    repeat: int
    workdir: Path | None  # None: the oracle keeps no files (simulated oracles)
    label: str  # e.g. "trial-0007": log and report file names start with it


@dataclass(frozen=True)
class Measurement:
    """What one probe run reports."""

    figures: dict[str, float]
    log_path: str | None = None
    report_path: str | None = None
    launch_s: float = 0.0
    probe_s: float = 0.0
    report: dict[str, Any] | None = None  # the probe's report (its to_json), in memory: callers need no file


@dataclass(frozen=True)
class TrialOutcome:
    """A finished trial: figures, or the error of its last attempt (with that attempt's log)."""

    measurement: Measurement | None
    error: str | None
    log_path: str | None
    attempts: int
    started: float
    finished: float


class Oracle(Protocol):
    """Measures one configuration; ``identity`` names everything the figures depend on except it."""

    def identity(self) -> dict[str, object]: ...

    def measure(self, request: TrialRequest, attempt: int) -> Measurement: ...

    def close(self) -> None: ...


OracleRecipe = Callable[[], Oracle]
"""Builds an oracle equivalent to one in this process, in another process (picklable)."""


def oracle_recipe(oracle: Oracle) -> OracleRecipe:
    """The oracle's recipe, or a one-line error for an oracle that can only run in this process."""
    recipe = getattr(oracle, "recipe", None)
    if recipe is None:
        raise UsageError(
            f"{type(oracle).__name__} cannot run in another process (it has no recipe())",
            "use the local executor, or give the oracle a recipe() that rebuilds it",
        )
    built: OracleRecipe = recipe()
    return built


def run_trial(oracle: Oracle, request: TrialRequest, retries: int) -> TrialOutcome:
    """Run one trial; a server that dies or a probe that fails is retried ``retries`` times.

    A command that cannot be started at all (:class:`CommandNotFound`) is not retried: it ends the
    run. Other errors are bugs or bad input and propagate.
    """
    started = time.time()
    last_error, last_log = "", None
    for attempt in range(1, retries + 2):
        try:
            measurement = oracle.measure(request, attempt)
        except CommandNotFound:
            raise
        except (ServerError, ProbeError) as exc:
            last_error = exc.one_line()
            last_log = str(exc.log) if exc.log is not None else None
            continue
        return TrialOutcome(measurement, None, measurement.log_path, attempt, started, time.time())
    return TrialOutcome(None, last_error, last_log, retries + 1, started, time.time())


class Executor(Protocol):
    capacity: int

    def run(
        self, requests: Sequence[TrialRequest], oracle: Oracle, retries: int
    ) -> Iterator[tuple[TrialRequest, TrialOutcome]]:
        """Run every request with ``run_trial``; yield each as soon as it ends (the caller commits it)."""
        ...

    def close(self) -> None:
        """Release what the executor holds (workers, a cluster connection); the caller owns it."""
        ...


class LocalExecutor:
    """Runs trials one by one in this process."""

    capacity = 1

    def run(
        self, requests: Sequence[TrialRequest], oracle: Oracle, retries: int
    ) -> Iterator[tuple[TrialRequest, TrialOutcome]]:
        for request in requests:
            yield request, run_trial(oracle, request, retries)

    def close(self) -> None:
        pass


class ThreadExecutor:
    """Runs up to ``capacity`` server trials at once from threads (one server each, on free ports).

    Results are yielded to the caller's thread as they end, so the store is written from one thread.
    Not for in-process targets: their patches are global state of one model.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)

    def run(
        self, requests: Sequence[TrialRequest], oracle: Oracle, retries: int
    ) -> Iterator[tuple[TrialRequest, TrialOutcome]]:
        with ThreadPoolExecutor(max_workers=self.capacity) as pool:
            futures = {pool.submit(run_trial, oracle, r, retries): r for r in requests}
            for future in as_completed(futures):
                yield futures[future], future.result()

    def close(self) -> None:
        pass
