"""A real engine's hunt with the divergence probe's full grid and with its exact early stop, side by side (issue 46).

    OMP_NUM_THREADS=1 flock /work/heavy.lock .venv/bin/python benchmarks/bench_hunt_stop.py --example sglang
    OMP_NUM_THREADS=1 flock /work/heavy.lock .venv/bin/python benchmarks/bench_hunt_stop.py --example vllm-pd

The example's manifest as its tests build it (``sglang``: ``examples/sglang/build_example.py``'s repository of
seven patches, the seed's commit among them; ``vllm-pd``: ``examples/vllm-pd/speedtrap.toml``, prefill and decode
servers and a router, the constructed ``prefill_mlp_scale@prefill``), hunted twice through ``isolate`` (what
``speedtrap bisect --manifest`` runs) in fresh run directories, in the order ``--order`` names:

- ``full``: ``[verdict] sequential = false``: every trial measures the probe's whole grid;
- ``stop``: ``sequential = true`` (the default): a trial stops after its prefill round once no decode can
  change the verdict (``speedtrap.probe._divergence_stop``: exact, no error rate).

Each hunt records its own baseline first, so both pay the same. Printed per hunt: trials, probe seconds per
trial (all; those that stopped; those that ran the grid), launch seconds per trial, the hunt's wall time and
culprits, then every trial (configuration, outcome, probe and launch seconds, where it stopped), and the ratio
of probe seconds per trial, stop / full (issue 46's goal: at most 0.6). Exit 1 when the culprits differ. The
JSON goes to ``--out`` (default ``.bench-hunt-stop-EXAMPLE.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_demo import cpu_flags  # noqa: E402
from speedtrap.isolate import isolate  # noqa: E402
from speedtrap.manifest import Manifest, load_manifest  # noqa: E402


def example_manifest(example: str, folder: Path) -> Manifest:
    """The example's manifest, its stack built first (once per machine)."""
    if example == "sglang":
        import bench_sglang

        path, _ = bench_sglang.setup(folder, flags=True, reuse=False)
        return load_manifest(path)
    sys.path.insert(0, str(ROOT / "tests" / "vllm"))
    import vllm_stack

    vllm_stack.ensure_stack()
    return load_manifest(ROOT / "examples" / "vllm-pd" / "speedtrap.toml")


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def hunt(manifest: Manifest, folder: Path, sequential: bool) -> dict[str, Any]:
    verdict = dataclasses.replace(manifest.verdict, sequential=sequential)
    t0 = time.monotonic()
    result = isolate(dataclasses.replace(manifest, verdict_spec=verdict), folder)
    wall = time.monotonic() - t0
    trials = [t for t in result.trials if t.status == "ok" and not t.reused]
    probe = [t.probe_s for t in trials]
    return {
        "sequential": sequential,
        "culprits": [sorted(c.patches) for c in result.culprits],
        "status": result.status.value,
        "hunt_s": wall,
        "launches": result.launches,
        "probe_s_per_trial": _mean(probe),
        "launch_s_per_trial": _mean([t.launch_s for t in trials]),
        "stopped_s_per_trial": _mean([t.probe_s for t in trials if t.stopped]),
        "whole_s_per_trial": _mean([t.probe_s for t in trials if not t.stopped]),
        "trials": [
            {
                "config": list(t.config),
                "outcome": t.outcome.value if t.outcome else None,
                "figure": t.figures.get(manifest.verdict.metric),
                "probe_s": round(t.probe_s, 2),
                "launch_s": round(t.launch_s, 2),
                "stopped": t.stopped,
            }
            for t in trials
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", choices=("sglang", "vllm-pd"), required=True)
    ap.add_argument("--order", default="full,stop", help="which hunt first: full,stop or stop,full")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    order = [o for o in args.order.split(",") if o]
    if sorted(order) != ["full", "stop"]:
        raise SystemExit("--order must name full and stop, e.g. --order full,stop")
    out = args.out or ROOT / f".bench-hunt-stop-{args.example}.json"
    print(f"machine: {cpu_flags()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}", flush=True)
    load_before = os.getloadavg()
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hunt-stop-") as tmp:
        manifest = example_manifest(args.example, Path(tmp) / "example")
        for name in order:
            rows[name] = hunt(manifest, Path(tmp) / name, sequential=name == "stop")
            print(f"{name}: {rows[name]['culprits']}, {len(rows[name]['trials'])} trials, "
                  f"{rows[name]['hunt_s']:.0f} s", flush=True)  # fmt: skip
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(f"probe: {manifest.probe.kind} {dict(manifest.probe.settings)}; verdict {manifest.verdict.metric} "
          f"<= {manifest.verdict.bound}")  # fmt: skip
    print("| hunt | trials | probe s/trial | stopped: trials, probe s/trial | whole grid: trials, probe s/trial "
          "| launch s/trial | hunt s | culprits |")  # fmt: skip
    print("|---|--:|--:|--:|--:|--:|--:|---|")
    for name in ("full", "stop"):
        r = rows[name]
        n_stop = sum(1 for t in r["trials"] if t["stopped"])
        print(f"| {name} | {len(r['trials'])} | {_shown(r['probe_s_per_trial'])} | {n_stop}, "
              f"{_shown(r['stopped_s_per_trial'])} | {len(r['trials']) - n_stop}, {_shown(r['whole_s_per_trial'])} "
              f"| {_shown(r['launch_s_per_trial'])} | {r['hunt_s']:.0f} | "
              f"{'; '.join(' + '.join(c) for c in r['culprits']) or 'none'} |")  # fmt: skip
    for name in ("full", "stop"):
        for t in rows[name]["trials"]:
            print(
                f"  {name}: {' + '.join(t['config']) or '(base)'}: {t['outcome']}, {t['figure']}, probe "
                f"{t['probe_s']} s, launch {t['launch_s']} s" + (f"; {t['stopped']}" if t["stopped"] else "")
            )
    full, stop = rows["full"]["probe_s_per_trial"], rows["stop"]["probe_s_per_trial"]
    ratio = stop / full if full and stop is not None else None
    print(f"probe s/trial, stop / full: {'-' if ratio is None else f'{ratio:.2f}'} (issue 46's goal: <= 0.6)")
    same = rows["full"]["culprits"] == rows["stop"]["culprits"]
    print(f"same culprits: {'yes' if same else 'NO'}")
    out.write_text(json.dumps({"example": args.example, "machine": cpu_flags(), "rows": rows, "ratio": ratio,
                               "load": [load_before[0], load_after[0]]}, indent=1))  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
