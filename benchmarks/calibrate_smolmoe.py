"""Calibrate smol-moe's seed bug: recall by prompt length of ``hash_topk_routed_scaling`` over a grid of configs.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/calibrate_smolmoe.py \
        --grid 0.75:2.5:3 0.95:2.25:3 --lengths 128 512 1024 --samples 3

Each grid entry is ``routed_fraction:routed_scaling_factor:num_hash_layers[:seed]`` (the seed of the
conversion's neuron split, routers and hyper-connections; default 0). For each, smol-moe is
built with that config (unpatched it computes the dense model's function, whatever the values), and
speedtrap's own recall probe (the conversations the demo uses) runs with ``hash_topk_routed_scaling``
on; the baseline runs once. The patch multiplies the routed experts' output by the factor a second
time in the hash-routed layers, so the MLP output there becomes ``shared + factor * routed`` instead
of ``shared + routed``. Prints correct/n with Wilson 95% intervals per length, and whether the cells
meet the goal: recall >= 0.9 at the short lengths (<= ``--short``) and <= 0.3 at the long ones
(>= ``--long``), with intervals apart from the baseline's there. ``--json FILE`` keeps every answer.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from speedtrap.probe import InProcessBackend, RecallReport, RecallSettings, run_recall, wilson
from speedtrap.targets.smolmoe import SmolMoETarget, dense_weights
from speedtrap.targets.smolmoe.equivalence import check_equivalence, dense_reference

PATCH = "hash_topk_routed_scaling"
ENTRY_KEYS = ("routed_fraction", "routed_scaling_factor", "num_hash_layers", "seed")


def by_length(report: RecallReport) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for s in report.samples:
        c, n = out.get(s.length, (0, 0))
        out[s.length] = (c + int(s.correct), n + 1)
    return out


def cell_text(correct: int, n: int) -> str:
    low, high = wilson(correct, n)
    return f"{correct}/{n} [{low:.2f}-{high:.2f}]"


def meets(base: dict[int, tuple[int, int]], bug: dict[int, tuple[int, int]], short: int, long: int) -> bool:
    ok = True
    for length, (c, n) in bug.items():
        if length <= short:
            ok &= c / n >= 0.9
        if length >= long:
            bc, bn = base[length]
            ok &= c / n <= 0.3 and wilson(c, n)[1] < wilson(bc, bn)[0]
    return ok


def measure(overrides: dict[str, str], patches: list[str], settings: RecallSettings, equivalence: bool) -> RecallReport:
    model = SmolMoETarget().load(overrides=overrides)
    if equivalence:  # the unpatched config against transformers' dense Llama (the test's bound)
        result = check_equivalence(model, dense_reference(dense_weights()))
        print(
            f"  unpatched vs dense: max |logit diff| {result.max_abs_logit_diff:.2e}, "
            f"top-1 agreement {result.top1_agreement:.4f}, equivalent: {result.equivalent}",
            flush=True,
        )
    return run_recall(InProcessBackend(model, patches), settings, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--grid", nargs="+", default=["0.75:2.5:3"], help="routed_fraction:factor:hash_layers[:seed] ..."
    )
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 512, 1024])
    parser.add_argument("--depths", nargs="+", type=float, default=[0.1, 0.5, 0.9])
    parser.add_argument("--samples", type=int, default=2, help="conversations per (length, depth)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--short", type=int, default=128)
    parser.add_argument("--long", type=int, default=900)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument(
        "--shared-prefix", action="store_true", help="one conversation holds a fact per depth (its questions share it)"
    )
    parser.add_argument(
        "--equivalence", action="store_true", help="check each config unpatched against the dense model"
    )
    parser.add_argument("--json", type=Path, help="write every answer here")
    args = parser.parse_args()
    settings = RecallSettings(
        lengths=tuple(args.lengths),
        depths=tuple(args.depths),
        samples=args.samples,
        seed=args.seed,
        shared_prefix=args.shared_prefix,
    )
    rows: list[dict[str, Any]] = []
    lengths = "  ".join(f"{n:>17}" for n in settings.lengths)
    print(f"{'config':<24}{lengths}  goal  seconds", flush=True)
    base: dict[int, tuple[int, int]] = {}
    if not args.no_baseline:
        t0 = time.perf_counter()
        report = measure({}, [], settings, False)
        base = by_length(report)
        cells = "  ".join(f"{cell_text(*base[n]):>17}" for n in settings.lengths)
        print(f"{'baseline':<24}{cells}  -     {time.perf_counter() - t0:.0f}", flush=True)
        rows.append({"config": "baseline", "report": report.to_json()})
    for entry in args.grid:
        overrides = dict(zip(ENTRY_KEYS, entry.split(":"), strict=False))
        t0 = time.perf_counter()
        report = measure(overrides, [PATCH], settings, args.equivalence)
        bug = by_length(report)
        cells = "  ".join(f"{cell_text(*bug[n]):>17}" for n in settings.lengths)
        goal = ("yes" if meets(base, bug, args.short, args.long) else "no") if base else "?"
        print(f"{entry:<24}{cells}  {goal:<4}  {time.perf_counter() - t0:.0f}", flush=True)
        rows.append({"config": overrides, "report": report.to_json()})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
