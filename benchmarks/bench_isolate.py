"""Launches needed to isolate culprit patches, on simulated stacks (no model): isolate vs the usual ways.

    .venv/bin/python benchmarks/bench_isolate.py [--trials 40] [--seed 0] [--sizes 4,8,16,32,64]
    .venv/bin/python benchmarks/bench_isolate.py --freeze tests/isolate/data/search_v1_counts.json

For n patches and k culprits (1..3), over random placements:
- monotone: k patches each break the stack alone;
- joint: one pair of patches that fail only together (k counts the pair as one set);
- interaction: one culprit plus a pair that is only correct together (a adds the factor in the router,
  b drops it from the combine: each alone breaks the stack, together they are right);
- noisy: k culprits, and every measurement carries Gaussian noise (sigma 0.3 around 0 = pass and
  1 = fail, bound 0.5): isolate repeats verdicts within 0.3..0.7 up to 4 times, the others take
  one measurement as it comes.
Counted: launches (every distinct configuration measured, baseline and full set included; each
repeat is one more launch) and whether the answer was right (the exact culprit sets, nobody
else blamed).

Methods, side by side in one run:
- naive: the one-at-a-time plan made exact: baseline, full set, every patch alone, then the
  checks the found sets need (everything but them; with two or more, each set among the rest and
  each pair among the rest). It blames every patch that fails alone;
- ddmin: baseline and full set, then Zeller and Hildebrandt's ddmin (one 1-minimal set);
- v1: the search before issue 17 (read from commit 3b58e38, tagged ``search-v1``: benchmarks/_search_v1.py there);
- isolate: the current search (``Search``, plan picked from n).

``--near`` prints another table instead: a deterministic stack whose every figure sits near the bound
(0.4 passing, 0.6 failing, bound 0.5, near 0.25, ``repeats = 1``: one trial is near, two pooled call
it), as llama.cpp's CPU server is; isolate as it is (a repeat that came back identical shows the stack
deterministic: no repeat or recheck is launched after it) against isolate blind to it (the same
metric, plus a figure that changes with the repeat, so no two trials are identical: every near
verdict is repeated), and the noisy stack above (sigma 0.3, repeats 4) with its launches.

``--freeze PATH`` writes v1's launches on the monotone worlds of the grid the tests use (every
placement where there are few, else a seeded sample), for tests/isolate/test_isolate_plan.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import subprocess
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtrap.isolate import Conclusion, Evaluator, FunctionOracle, Judgement, Search, ThresholdRule, TrialStore

V1_TAG = "3b58e38"  # main's commit (tag search-v1) still holding benchmarks/_search_v1.py


def load_search_v1() -> Any:
    """v1 of the search, read from the git tag ``search-v1`` into a module (the tree no longer holds it)."""
    root = Path(__file__).resolve().parents[1]
    try:
        text = subprocess.run(
            ["git", "show", f"{V1_TAG}:benchmarks/_search_v1.py"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        sys.exit(f"bench_isolate: cannot read the v1 search from commit {V1_TAG} (fix: a full clone)")
    # isolate's Verdict enum is named Conclusion since (same values); v1 imports it by its old name
    text = text.replace("\n    Verdict,\n", "\n    Conclusion as Verdict,\n", 1)
    module = types.ModuleType("_search_v1")
    sys.modules[module.__name__] = module  # dataclasses look their module up while the class is built
    exec(compile(text, f"{V1_TAG}:benchmarks/_search_v1.py", "exec"), module.__dict__)
    return module.SearchV1


SearchV1 = load_search_v1()

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
    if case == "joint":
        a, b = rng.sample(names, 2)
        return World(names, lambda s: a in s and b in s, frozenset({frozenset({a, b})}), False, seed)
    if case == "interaction":
        c, a, b = rng.sample(names, 3)
        return World(names, lambda s: c in s or ((a in s) != (b in s)), frozenset({frozenset({c})}), False, seed)
    bad = rng.sample(names, k)
    sets = frozenset(frozenset({x}) for x in bad)
    return World(names, lambda s: any(x in s for x in bad), sets, case == "noisy", seed)


# -- isolate, now and before ------------------------------------------------------------------


def run_isolate(world: World, search: Callable[..., Any] = Search) -> tuple[int, bool]:
    store = TrialStore(None)
    run_id, _ = store.begin_run({}, {}, False)

    def fn(config: tuple[str, ...], repeat: int) -> dict[str, float]:
        return {"metric": world.metric(frozenset(config), repeat)}

    near = 0.4 if world.noisy else 0.0
    evaluator = Evaluator(FunctionOracle(fn, {}), ThresholdRule("metric", 0.5, "above", near), store, run_id,
                          repeats=4 if world.noisy else 0)  # fmt: skip
    result = search(world.names, evaluator, recheck=evaluator.recheck if world.noisy else None).run()
    store.close()
    found = frozenset(frozenset(c.patches) for c in result.culprits)
    return evaluator.launches, found == world.culprits


def run_near(world: World, blind: bool) -> tuple[int, bool]:
    """A deterministic stack near the bound (see ``--near``); ``blind``: determinism hidden by a repeat figure."""
    store = TrialStore(None)
    run_id, _ = store.begin_run({}, {}, False)

    def fn(config: tuple[str, ...], repeat: int) -> dict[str, float]:
        figures = {"metric": 0.6 if world.broken(frozenset(config)) else 0.4}
        return {**figures, "repeat": float(repeat)} if blind else figures

    evaluator = Evaluator(FunctionOracle(fn, {}), ThresholdRule("metric", 0.5, "above", 0.25), store, run_id, repeats=1)
    result = Search(world.names, evaluator, recheck=evaluator.recheck).run()
    store.close()
    found = frozenset(frozenset(c.patches) for c in result.culprits)
    return evaluator.launches, found == world.culprits


def near_table(sizes: Sequence[int], trials: int, seed: int) -> None:
    print("| n | k | deterministic, near the bound: blind mean / max | right | isolate mean / max | right "
          "| noisy (sigma 0.3): isolate mean / max | right |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for n in sizes:
        for k in (1, 2, 3):
            rng = random.Random(f"{seed}|{n}|near|{k}")
            blind, seen, noisy = [], [], []
            for t in range(trials):
                world = make_world(n, k, "monotone", rng, seed=t)
                blind.append(run_near(world, True))
                seen.append(run_near(world, False))
                noisy.append(run_isolate(World(world.names, world.broken, world.culprits, True, t)))
            print(f"| {n} | {k} | {_cell(blind)} | {_cell(seen)} | {_cell(noisy)} |", flush=True)


def count_monotone(search: Callable[..., Any], names: Sequence[str], bad: Sequence[str]) -> int:
    """Distinct configurations a search measures on a noiseless stack where each of ``bad`` breaks it alone."""
    seen: set[tuple[str, ...]] = set()

    def judge(configs: Sequence[tuple[str, ...]]) -> list[Judgement]:
        seen.update(configs)
        return [Judgement(c, Conclusion.FAIL if any(b in c for b in bad) else Conclusion.PASS) for c in configs]

    result = search(list(names), judge).run()
    if {c.patches for c in result.culprits} != {(b,) for b in bad}:
        raise AssertionError(f"wrong answer for {bad}: {result.culprit_names}")
    return len(seen)


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


def run_naive(world: World) -> tuple[int, bool]:
    """Baseline, full set, each patch alone; then everything but the culprits and, with two or more,
    each culprit among the rest and each pair among the rest. Blames every patch that fails alone."""
    counter = Counter(world)
    every = frozenset(world.names)
    counter.fails(frozenset())
    counter.fails(every)
    bad = [p for p in world.names if counter.fails(frozenset({p}))]
    counter.fails(every - set(bad))
    if len(bad) >= 2:
        for p in bad:
            counter.fails(every - (set(bad) - {p}))
        for a, b in itertools.combinations(bad, 2):
            counter.fails(every - (set(bad) - {a, b}))
    return len(counter.seen), frozenset(frozenset({p}) for p in bad) == world.culprits


def naive_count(n: int, k: int) -> int:
    """The naive plan's launches on a monotone stack with k single culprits (what run_naive counts)."""
    checks = 1 + (k if k >= 2 else 0) + (math.comb(k, 2) if k >= 3 else 0)  # k = 2: the pair is the full set
    return n + 2 + checks


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


# -- the grid the tests use --------------------------------------------------------------------

GRID_SIZES = (4, 5, 6, 8, 12, 16, 32, 64)
GRID_KS = (1, 2, 3)
GRID_EVERY = 220  # every placement up to this many (n <= 12), else a seeded sample
GRID_SAMPLE = 60


def grid_worlds(n: int, k: int) -> list[tuple[str, ...]]:
    """Every placement of k culprits among n when there are at most GRID_EVERY, else a seeded sample."""
    names = [f"p{i:02d}" for i in range(n)]
    if math.comb(n, k) <= GRID_EVERY:
        return list(itertools.combinations(names, k))
    rng = random.Random(f"grid|{n}|{k}")
    return [tuple(rng.sample(names, k)) for _ in range(GRID_SAMPLE)]


def freeze(path: Path) -> None:
    out: dict[str, Any] = {"source": "benchmarks/_search_v1.py (the search at dcc82ad)", "cells": []}
    for n in GRID_SIZES:
        names = [f"p{i:02d}" for i in range(n)]
        for k in GRID_KS:
            worlds = grid_worlds(n, k)
            launches = [count_monotone(SearchV1, names, w) for w in worlds]
            out["cells"].append({"n": n, "k": k, "culprits": [list(w) for w in worlds], "v1_launches": launches})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out) + "\n")
    print(f"wrote {path}")


# -- the table --------------------------------------------------------------------------------

CASES = (
    ("monotone", 1), ("monotone", 2), ("monotone", 3), ("joint", 1), ("interaction", 1), ("noisy", 1), ("noisy", 2),
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40, help="random placements per row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", default="4,8,16,32,64", help="numbers of patches")
    parser.add_argument("--freeze", type=Path, help="write v1's counts on the test grid to this file and stop")
    parser.add_argument("--near", action="store_true", help="deterministic and noisy stacks near the bound")
    args = parser.parse_args()
    if args.freeze:
        freeze(args.freeze)
        return
    if args.near:
        near_table([int(x) for x in args.sizes.split(",")], args.trials, args.seed)
        return
    print("| n | case | k | naive mean / max | right | ddmin mean / max | right "
          "| v1 mean / max | right | isolate mean / max | right |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        for case, k in CASES:
            rng = random.Random(f"{args.seed}|{n}|{case}|{k}")
            rows: dict[str, list[tuple[int, bool]]] = {"naive": [], "ddmin": [], "v1": [], "isolate": []}
            for t in range(args.trials):
                world = make_world(n, k, case, rng, seed=t)
                rows["naive"].append(run_naive(world))
                rows["ddmin"].append(run_ddmin(world))
                rows["v1"].append(run_isolate(world, SearchV1))
                rows["isolate"].append(run_isolate(world))
            cells = [_cell(rows[m]) for m in ("naive", "ddmin", "v1", "isolate")]
            print(f"| {n} | {case} | {k} | {' | '.join(cells)} |", flush=True)


def _cell(runs: list[tuple[int, bool]]) -> str:
    launches = [x for x, _ in runs]
    right = sum(ok for _, ok in runs) / len(runs)
    return f"{statistics.mean(launches):.1f} / {max(launches)} | {right:.0%}"


if __name__ == "__main__":
    main()
