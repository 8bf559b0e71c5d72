"""Wall time of an isolate run on Ray workers vs the local executor, with simulated trials of fixed duration.

    .venv/bin/python benchmarks/bench_ray.py [--trial-s 1.0] [--patches 16] [--workers 1 2 4]

The stack is simulated (no model): n patches, two that break it alone and a pair that breaks it
only together; each trial sleeps ``--trial-s`` seconds (a server launch and a probe) and reports
its figure. The same search runs once with the local executor and once per Ray worker count on
a local Ray cluster started here (the trials sleep, so four workers fit on two cores). Printed
side by side: trials used, search rounds (batches sent to the executor), wall time, and the
speed-up of the search over the local executor; every run must name the same culprit sets.
Starting the Ray workers is timed apart ("start s": about half a second of CPU per worker here,
so many workers on two cores take a while); the search's wall time excludes it.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import Any

from speedtrap.isolate import (
    Evaluator,
    Executor,
    FunctionOracle,
    LocalExecutor,
    RayExecutor,
    Search,
    ThresholdRule,
    TrialResources,
    TrialStore,
)


def make_stack(n: int, trial_s: float) -> tuple[list[str], Callable[[tuple[str, ...], int], dict[str, float]]]:
    names = [f"p{i:02d}" for i in range(n)]
    alone = {names[n // 4], names[(3 * n) // 4]}
    pair = {names[n // 2], names[n // 2 + 1]}

    def trial(config: tuple[str, ...], repeat: int) -> dict[str, float]:
        time.sleep(trial_s)
        on = set(config)
        return {"metric": 1.0 if (on & alone) or pair <= on else 0.0}

    return names, trial


class CountingExecutor:
    """Counts the batches (rounds) an executor is handed; everything else is the wrapped executor's."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.capacity = inner.capacity
        self.rounds = 0

    def run(self, requests: Any, oracle: Any, retries: int) -> Any:
        if requests:
            self.rounds += 1
        yield from self.inner.run(requests, oracle, retries)

    def close(self) -> None:
        self.inner.close()


def run_search(
    names: list[str], trial: Any, executor: Executor
) -> tuple[int, int, float, float, frozenset[tuple[str, ...]]]:
    counting = CountingExecutor(executor)
    store = TrialStore(None)
    run_id, _ = store.begin_run({}, {}, False)
    oracle = FunctionOracle(trial, {"bench": "ray"})
    start_s = executor.start(oracle) if isinstance(executor, RayExecutor) else 0.0
    evaluator = Evaluator(oracle, ThresholdRule("metric", 0.5, "above", 0.0), store, run_id, 0, 0, counting)
    t0 = time.perf_counter()
    result = Search(names, evaluator, capacity=counting.capacity).run()
    wall = time.perf_counter() - t0
    store.close()
    return evaluator.launches, counting.rounds, start_s, wall, frozenset(tuple(c) for c in result.culprit_names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trial-s", type=float, default=1.0)
    parser.add_argument("--patches", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()

    import ray

    names, trial = make_stack(args.patches, args.trial_s)
    rows = []
    rows.append(("local", *run_search(names, trial, LocalExecutor())))
    ray.init(num_cpus=max(args.workers), log_to_driver=False, logging_level=logging.WARNING, include_dashboard=False)
    try:
        for w in args.workers:
            with RayExecutor(workers=w, resources=TrialResources(num_cpus=1)) as executor:
                rows.append((f"ray x{w}", *run_search(names, trial, executor)))
    finally:
        ray.shutdown()

    local_wall = rows[0][4]
    print(f"n = {args.patches} patches, 2 culprits + 1 joint pair, {args.trial_s:g} s per trial")
    print(f"{'executor':<10} {'trials':>6} {'rounds':>6} {'start s':>8} {'search s':>8} {'speed-up':>8}  culprits")
    for name, trials, rounds, start_s, wall, found in rows:
        sets = "; ".join(sorted("+".join(c) for c in found))
        print(f"{name:<10} {trials:>6} {rounds:>6} {start_s:>8.1f} {wall:>8.1f} {local_wall / wall:>7.2f}x  {sets}")
    if len({r[5] for r in rows}) != 1:
        raise SystemExit("the executors disagree on the culprits")


if __name__ == "__main__":
    main()
