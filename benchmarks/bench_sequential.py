"""Full grid against sequential recall on smol-moe, side by side: questions asked, seconds, verdicts.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_sequential.py [--configs base,"all patches"]

The demo's recall grid (128 and 1,280 tokens x 5 depths x 2 conversations) on each configuration:
``base`` (no patch: the baseline asked as a candidate), the demo's culprit
``hash_topk_routed_scaling`` and a mild patch ``fp8_kv_cache`` (``--configs`` adds ``all patches``,
the eight). The full grid asks every question of the baseline once and of each configuration; its
verdict per length is the report's reading (Wilson intervals apart: lost; overlapping at 85% of the
baseline's accuracy or more: kept). The sequential run asks in rounds against one shared baseline
(asked only the questions it lacks) and stops each length once the test decides
(``speedtrap.probe._sequential``, alpha 0.05, beta 0.2); an undecided length runs to the grid and
takes the full grid's reading. Exit 1 when a verdict differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

from speedtrap.pipeline import demo_settings
from speedtrap.probe import InProcessBackend, RecallReference, RecallReport, RecallSettings, run_recall
from speedtrap.probe._sequential import length_reading
from speedtrap.targets import load_target

CONFIGS = {
    "base": (),
    "hash_topk_routed_scaling": ("hash_topk_routed_scaling",),
    "fp8_kv_cache": ("fp8_kv_cache",),
    "all patches": (
        "mhc_bf16_gemm", "hash_topk_routed_scaling", "fp8_kv_cache", "fused_rmsnorm", "rope_cache_bf16",
        "lm_head_bf16", "chunked_prefill", "moe_fused_experts",
    ),
}  # fmt: skip
DEFAULT = ("base", "hash_topk_routed_scaling", "fp8_kv_cache")  # the demo's culprit and base, and a mild patch


def by_length(report: RecallReport) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for s in report.samples:
        correct, n = out.get(s.length, (0, 0))
        out[s.length] = (correct + s.correct, n + 1)
    return out


def verdicts(base: RecallReport, run: RecallReport) -> str:
    b, r = by_length(base), by_length(run)
    return ", ".join(f"{n}: {length_reading(*b[n], *r[n]) or 'neither'} ({r[n][0]}/{r[n][1]})" for n in sorted(r))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help="comma-separated names from: " + ", ".join(CONFIGS)
    )
    args = parser.parse_args()
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    grid = RecallSettings(**demo_settings().recall)
    full_grid = dataclasses.replace(grid, sequential=False)
    seq_grid = dataclasses.replace(grid, sequential=True)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    model = load_target("smol-moe")
    t0 = time.perf_counter()
    full_base = run_recall(InProcessBackend(model), full_grid)
    base_s = time.perf_counter() - t0
    print(f"full grid baseline: {len(full_base.samples)} questions, {base_s:.1f} s")
    reference = RecallReference(InProcessBackend(model))
    rows = []
    differ = False
    for name in names:
        patches = CONFIGS[name]
        t0 = time.perf_counter()
        full = run_recall(InProcessBackend(model, list(patches)), full_grid)
        full_s = time.perf_counter() - t0
        asked_before = len(reference.samples)
        t0 = time.perf_counter()
        seq = run_recall(InProcessBackend(model, list(patches)), seq_grid, reference=reference)
        seq_s = time.perf_counter() - t0
        ref_new = len(reference.samples) - asked_before
        full_v = {n: length_reading(*by_length(full_base)[n], *c) for n, c in by_length(full).items()}
        seq_v: dict[int, str | None] = {s.length: s.decision for s in seq.stops}
        for s in seq.stops:  # undecided: the grid was asked in full, and its reading is the verdict
            if s.decision == "undecided":
                seq_v[s.length] = length_reading(s.reference_correct, s.asked, s.correct, s.asked)
        same = full_v == seq_v
        differ |= not same
        rows.append((name, len(full.samples), full_s, verdicts(full_base, full), len(seq.samples), ref_new, seq_s,
                     "; ".join(s.sentence() for s in seq.stops), same))  # fmt: skip
        print(f"{name}: full {len(full.samples)} q {full_s:.1f} s | sequential {len(seq.samples)} q "
              f"(+{ref_new} baseline) {seq_s:.1f} s | same verdicts: {same}", flush=True)  # fmt: skip
    print()
    print("| configuration | full grid: questions | seconds | verdict by length | sequential: questions "
          "(+ baseline's) | seconds | where it stopped | same verdicts |")  # fmt: skip
    print("|---|--:|--:|---|--:|--:|---|---|")
    for name, fq, fs, fv, sq, rq, ss, stops, same in rows:
        print(f"| {name} | {fq} | {fs:.1f} | {fv} | {sq} (+{rq}) | {ss:.1f} | {stops} | {'yes' if same else 'NO'} |")
    total_full = len(full_base.samples) + sum(r[1] for r in rows)
    total_seq = len(reference.samples) + sum(r[4] for r in rows)
    secs_full = base_s + sum(r[2] for r in rows)
    secs_seq = sum(r[6] for r in rows)
    print(f"\nall configurations with the baseline: full grid {total_full} questions {secs_full:.1f} s; "
          f"sequential {total_seq} questions {secs_seq:.1f} s (ratio {secs_seq / secs_full:.2f})")  # fmt: skip
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
