"""Cost of `speedtrap diff layers` on smol-moe at 1,024 tokens: time and peak memory, side by side.

    .venv/bin/python benchmarks/bench_layer_diff.py [--tokens 1024] [--patch mhc_bf16_gemm] [--repeat 2] [--threads N]
    .venv/bin/python benchmarks/bench_layer_diff.py --thresholds   # rel_diff of every patch (threshold)

Each configuration runs in a fresh subprocess (smol-moe loaded from the converted-weights cache):

- plain:      one forward of the baseline (what a probe pays);
- plain pair: the baseline forward, then the patched one, logits of both kept (a logits comparison);
- diff:       `layer_diff` (hooks on every module, both runs in lock-step, statistics on the fly).

Time is the best of --repeat runs. Peak memory is the rise of the process's peak RSS (VmHWM, reset
through /proc/self/clear_refs just before the measured call) over its RSS after loading and a
warm-up forward; big allocations are forced to mmap (MALLOC_MMAP_THRESHOLD_) so that freed tensors
leave the RSS and the peak is the real one. Contention from other processes distorts timings:
the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = "child"


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def child(mode: str, tokens: int, patch: str, repeat: int, threads: int) -> dict[str, object]:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)

    from speedtrap.localize import default_ids, layer_diff
    from speedtrap.targets.smolmoe import SmolMoETarget

    model = SmolMoETarget().load()
    ids = default_ids(model, tokens)
    model.logits(ids[:32])  # warm-up: kernels, allocator
    with model.patched([patch]):
        model.logits(ids[:32])

    def plain() -> None:
        model.logits(ids)

    def pair() -> None:
        base = model.logits(ids)
        with model.patched([patch]):
            patched = model.logits(ids)
        float((base - patched).abs().max())

    def diff() -> None:
        layer_diff(model, [patch], ids)

    run = {"plain": plain, "plain_pair": pair, "diff": diff}[mode]
    resident = _rss_kib("VmRSS")
    exact = _reset_peak()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    peak = _rss_kib("VmHWM")
    return {
        "mode": mode,
        "seconds": best,
        "peak_rise_mib": (peak - resident) / 1024,
        "rss_mib": resident / 1024,
        "peak_mib": peak / 1024,
        "peak_reset": exact,
        "threads": torch.get_num_threads(),
    }


def measure(mode: str, args: argparse.Namespace) -> dict[str, object]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, __file__, CHILD, mode, str(args.tokens), args.patch, str(args.repeat), str(args.threads)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def thresholds(tokens: int) -> None:
    """Per patch: the largest rel_diff of any module and the first module over the default threshold."""
    from speedtrap.localize import DEFAULT_THRESHOLD, default_ids, layer_diff
    from speedtrap.targets.smolmoe import SmolMoETarget

    model = SmolMoETarget().load()
    ids = default_ids(model, tokens)
    print(f"{'patch':28s} {'max rel_diff':>13s} {'logits':>10s}  first module over {DEFAULT_THRESHOLD:g}")
    for info in model.patch_infos():
        result = layer_diff(model, [info.name], ids)
        compared = [m for m in result.modules if m.rel_diff is not None]
        worst = max(m.rel_diff or 0.0 for m in compared)
        logits = result.module("lm_head").rel_diff or 0.0
        first = result.first_divergent or "-"
        rel = result.module(first).rel_diff if result.first_divergent else None
        print(f"{info.name:28s} {worst:13.3g} {logits:10.3g}  {first}" + (f" ({rel:.3g})" if rel else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--patch", default="mhc_bf16_gemm")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads (0: torch's default; 1 is steadier on a busy machine)",
    )
    parser.add_argument("--thresholds", action="store_true", help="print every patch's rel_diff instead")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    if args.thresholds:
        thresholds(args.tokens)
    else:
        rows = {mode: measure(mode, args) for mode in ("plain", "plain_pair", "diff")}
        print(f"smol-moe, {args.tokens} tokens, patch {args.patch}, {rows['diff']['threads']} torch threads")
        print(f"{'':12s} {'time s':>8s} {'peak rise MiB':>14s} {'RSS after load MiB':>19s}")
        for mode, row in rows.items():
            print(f"{mode:12s} {row['seconds']:8.2f} {row['peak_rise_mib']:14.0f} {row['rss_mib']:19.0f}")

        def ratio(key: str, a: str, b: str) -> float:
            return float(str(rows[a][key])) / float(str(rows[b][key]))

        print(f"time:   diff / plain pair = {ratio('seconds', 'diff', 'plain_pair'):.2f}x (goal <= 1.2x)")
        print(f"time:   diff / plain      = {ratio('seconds', 'diff', 'plain'):.2f}x (two forwards, compared)")
        print(f"memory: diff / plain      = {ratio('peak_rise_mib', 'diff', 'plain'):.2f}x (goal <= 1.3x)")
        print(f"memory: diff / plain pair = {ratio('peak_rise_mib', 'diff', 'plain_pair'):.2f}x")
        if not all(row["peak_reset"] for row in rows.values()):
            print("note: /proc/self/clear_refs not writable; the peak includes loading")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))))
    else:
        main()
