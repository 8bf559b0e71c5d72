"""The same isolate hunt with the divergence probe's full grid and with its exact early stop, side by side.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_divergence_stop.py [--lengths 512,1024] [--decode-tokens 32]

smol-moe in process, five patches of which one is the culprit by construction (``hash_topk_routed_scaling``
scales the routed experts' weights: KL of nats; the others are harmless or far below the bound), the default
verdict ``worst.kl_p99 <= 0.1`` (near 0.25, repeats 2). The hunt runs twice in this process on the same loaded
model: ``[verdict] sequential = false`` (every trial measures the whole grid) and ``sequential = true`` (a trial
stops after its prefill round once no decode can change the verdict: ``speedtrap.probe._divergence_stop``).
Prints trials, probe seconds per trial (all trials; those that stopped; those that ran the grid) and the
culprits; exit 1 when the culprits differ.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from speedtrap.isolate import isolate, manifest_for_target
from speedtrap.manifest import ProbeSpec, VerdictSpec
from speedtrap.targets import load_target

PATCHES = ["fused_rmsnorm", "moe_fused_experts", "chunked_prefill", "lm_head_bf16", "hash_topk_routed_scaling"]


def _cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    avx = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name}, {os.cpu_count()} cores, {avx}"


def _mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.2f}" if values else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="512,1024", help="sequence lengths (the default preset's)")
    ap.add_argument("--decode-tokens", type=int, default=32)
    args = ap.parse_args()
    settings = {"lengths": [int(n) for n in args.lengths.split(",")], "decode_tokens": args.decode_tokens}
    print(f"machine: {_cpu()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    model = load_target("smol-moe")
    rows = []
    culprits = {}
    with tempfile.TemporaryDirectory() as tmp:
        for sequential in (False, True):
            verdict = VerdictSpec(metric="worst.kl_p99", bound=0.1, sequential=sequential)
            manifest = manifest_for_target("smol-moe", PATCHES, probe=ProbeSpec("divergence", None, settings),
                                           verdict=verdict)  # fmt: skip
            t0 = time.perf_counter()
            result = isolate(manifest, Path(tmp) / f"run-{sequential}", model=model)
            wall = time.perf_counter() - t0
            trials = [t for t in result.trials if t.status == "ok"]
            stopped = [t.probe_s for t in trials if t.stopped]
            whole = [t.probe_s for t in trials if not t.stopped]
            culprits[sequential] = result.culprit_names
            name = "stop when decided" if sequential else "full grid"
            rows.append((name, len(trials), _mean([t.probe_s for t in trials]), len(stopped), _mean(stopped),
                         len(whole), _mean(whole), sum(t.probe_s for t in trials), wall,
                         "; ".join(" + ".join(c) for c in result.culprit_names) or "none"))  # fmt: skip
            for t in trials:
                if t.stopped:
                    print(f"  {name}: {t.label()}: {t.stopped}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"settings: {settings}, verdict worst.kl_p99 <= 0.1, patches: {', '.join(PATCHES)}")
    head = (
        "| run | trials | probe s/trial | stopped: trials, s/trial | whole grid: trials, s/trial | probe s | hunt s |"
    )
    print(head + " culprit |")
    print("|---|--:|--:|--:|--:|--:|--:|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]}, {r[4]} | {r[5]}, {r[6]} | {r[7]:.1f} | {r[8]:.1f} | {r[9]} |")
    full, early = rows
    print(f"probe seconds, stop / full: {early[7] / full[7]:.2f}")
    same = culprits[False] == culprits[True]
    print(f"same culprits: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
