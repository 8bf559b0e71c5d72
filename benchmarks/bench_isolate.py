"""Launches needed to isolate culprit patches, on simulated stacks (no model): isolate vs the usual ways.

    .venv/bin/python benchmarks/bench_isolate.py [--trials 40] [--seed 0]

For n patches in {8, 16, 32, 64} and k culprits in {1, 2}, over random placements:
- monotone: k patches each break the stack alone;
- interaction: one culprit plus a pair that is only correct together (a adds the factor in the router,
  b drops it from the combine: each alone breaks the stack, together they are right);
- noisy: one culprit, and every measurement carries Gaussian noise (sigma 0.3 around 0 = pass and
  1 = fail, bound 0.5): isolate repeats verdicts within 0.3..0.7 up to 4 times, the others take
  one measurement as it comes.
Counted: launches (every distinct configuration measured, baseline and full set included; each
repeat is one more launch) and whether the answer was right (the exact culprit sets, nobody
else blamed). The goal line for monotone cases is k * ceil(log2 n) + 2.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from speedtrap.isolate import Evaluator, FunctionOracle, Search, ThresholdRule, TrialStore

Broken = Callable[[frozenset[str]], bool]
SIGMA = 0.3


@dataclass(frozen=True)
class World:
    names: list[str]
    broken: Broken
    culprits: frozenset[frozenset[str]]  # what a right answer blames
    noisy: bool
    seed: int

    def metric(self, config: frozenset[str], repeat: int) -> float:
        value = 1.0 if self.broken(config) else 0.0
        if self.noisy:
            value += random.Random(f"{self.seed}|{sorted(config)}|{repeat}").gauss(0.0, SIGMA)
        return value


def make_world(n: int, k: int, case: str, rng: random.Random, seed: int) -> World:
    names = [f"p{i:02d}" for i in range(n)]
    if case == "interaction":
        c, a, b = rng.sample(names, 3)
        return World(names, lambda s: c in s or ((a in s) != (b in s)), frozenset({frozenset({c})}), False, seed)
    bad = rng.sample(names, k)
    sets = frozenset(frozenset({x}) for x in bad)
    return World(names, lambda s: any(x in s for x in bad), sets, case == "noisy", seed)


# -- isolate ----------------------------------------------------------------------------------


def run_isolate(world: World) -> tuple[int, bool]:
    store = TrialStore(None)
    run_id, _ = store.begin_run({}, {}, False)

    def fn(config: tuple[str, ...], repeat: int) -> dict[str, float]:
        return {"metric": world.metric(frozenset(config), repeat)}

    near = 0.4 if world.noisy else 0.0
    evaluator = Evaluator(FunctionOracle(fn, {}), ThresholdRule("metric", 0.5, "above", near), store, run_id,
                          repeats=4 if world.noisy else 0)  # fmt: skip
    result = Search(world.names, evaluator, recheck=evaluator.recheck if world.noisy else None).run()
    store.close()
    found = frozenset(frozenset(c.patches) for c in result.culprits)
    return evaluator.launches, found == world.culprits


# -- the usual ways ---------------------------------------------------------------------------


class Counter:
    """One measurement per distinct configuration (a cache, as a careful person would keep)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.seen: dict[frozenset[str], bool] = {}

    def fails(self, config: frozenset[str]) -> bool:
        if config not in self.seen:
            self.seen[config] = self.world.metric(config, 0) > 0.5
        return self.seen[config]


def run_one_at_a_time(world: World) -> tuple[int, bool]:
    """Baseline, then each patch alone; blame every patch that fails alone."""
    counter = Counter(world)
    counter.fails(frozenset())
    blamed = frozenset(frozenset({p}) for p in world.names if counter.fails(frozenset({p})))
    return len(counter.seen), blamed == world.culprits


def ddmin(items: list[str], fails: Callable[[frozenset[str]], bool]) -> list[str]:
    """Zeller and Hildebrandt's ddmin: a 1-minimal failing subset of a failing ``items``."""
    current, n = list(items), 2
    while len(current) >= 2:
        size = math.ceil(len(current) / n)
        chunks = [current[i : i + size] for i in range(0, len(current), size)]
        for chunk in chunks:
            if fails(frozenset(chunk)):
                current, n = chunk, 2
                break
        else:
            for chunk in chunks:
                rest = [x for x in current if x not in chunk]
                if fails(frozenset(rest)):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), 2 * n)
    return current


def run_ddmin(world: World) -> tuple[int, bool]:
    """Baseline and full set, then plain ddmin: one 1-minimal failing set."""
    counter = Counter(world)
    if counter.fails(frozenset()) or not counter.fails(frozenset(world.names)):
        return len(counter.seen), False
    found = frozenset({frozenset(ddmin(world.names, counter.fails))})
    return len(counter.seen), found == world.culprits


# -- the table --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40, help="random placements per row")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| n | case | k | goal k·⌈log2 n⌉+2 | isolate mean / max | right | one-at-a-time | right "
          "| ddmin mean / max | right |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in (8, 16, 32, 64):
        for case, k in (("monotone", 1), ("monotone", 2), ("interaction", 1), ("noisy", 1)):
            rng = random.Random(f"{args.seed}|{n}|{case}|{k}")
            rows: dict[str, list[tuple[int, bool]]] = {"isolate": [], "one": [], "ddmin": []}
            for t in range(args.trials):
                world = make_world(n, k, case, rng, seed=t)
                rows["isolate"].append(run_isolate(world))
                rows["one"].append(run_one_at_a_time(world))
                rows["ddmin"].append(run_ddmin(world))
            goal = k * math.ceil(math.log2(n)) + 2

            cells = [_cell(rows["isolate"]), _cell(rows["one"], spread=False), _cell(rows["ddmin"])]
            print(f"| {n} | {case} | {k} | {goal} | {' | '.join(cells)} |")


def _cell(runs: list[tuple[int, bool]], spread: bool = True) -> str:
    launches = [x for x, _ in runs]
    right = sum(ok for _, ok in runs) / len(runs)
    body = f"{statistics.mean(launches):.1f} / {max(launches)}" if spread else f"{max(launches)}"
    return f"{body} | {right:.0%}"


if __name__ == "__main__":
    main()
