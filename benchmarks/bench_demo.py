"""Time `speedtrap demo` as a whole process: a first run from nothing, then a second run reusing it.

    .venv/bin/python benchmarks/bench_demo.py [--quick] [--keep DIR]

First run: a fresh converted-weights cache (SPEEDTRAP_CACHE_DIR in a new temporary folder, so the
GGUF file is converted again, as on a fresh clone) and a fresh --out folder. Second run: the same
command again, which reuses every stored stage and trial. Wall time is measured around the whole
process (interpreter start-up included), with the CPU seconds the process used beside it. The
budgets are 300 s and 60 s on the 2-core machine; the load average is printed because other
processes distort wall time (and torch's two threads per process make contention far worse: run
with OMP_NUM_THREADS=1 when the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIRST_BUDGET_S = 300.0
SECOND_BUDGET_S = 60.0
CLI = "import sys; from speedtrap.cli import main; sys.argv[0] = 'speedtrap'; main()"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_demo(out: Path, cache: Path, quick: bool) -> tuple[float, float, dict[str, object]]:
    env = {**os.environ, "SPEEDTRAP_CACHE_DIR": str(cache)}
    argv = [sys.executable, "-c", CLI, "demo", "--out", str(out), "--json"] + (["--quick"] if quick else [])
    t0, c0 = time.perf_counter(), cpu_children()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t0, cpu_children() - c0
    if done.returncode != 0:
        sys.exit(f"speedtrap demo failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    summary: dict[str, object] = json.loads(done.stdout)
    return wall, cpu, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="time `speedtrap demo --quick`")
    parser.add_argument("--keep", type=Path, help="keep the run directory here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        cache = Path(tmp) / "cache"
        out = args.keep or Path(tmp) / "run"
        print(f"load average before: {load()}  (2 cores; figures above ~2 mean contention)")
        first, first_cpu, summary = run_demo(out, cache, args.quick)
        verdict = summary["verdict"]
        assert isinstance(verdict, dict)
        print(
            f"first run  : {first:6.1f} s wall  (budget {FIRST_BUDGET_S:.0f} s, ratio {first / FIRST_BUDGET_S:.2f}); "
            f"{first_cpu:.1f} s CPU"
        )
        print(f"             stages: {summary['seconds']}")
        print(f"             verdict: {verdict['headline']}")
        print(f"load average between: {load()}")
        second, second_cpu, again = run_demo(out, cache, args.quick)
        reused, computed = len(again["reused"]), len(again["computed"])  # type: ignore[arg-type]
        print(
            f"second run : {second:6.1f} s wall  (budget {SECOND_BUDGET_S:.0f} s, "
            f"ratio {second / SECOND_BUDGET_S:.2f}); {second_cpu:.1f} s CPU; {reused} parts reused, {computed} measured"
        )
        print(f"             stages: {again['seconds']}")
        print(f"second / first: {second / first:.3f}")
        print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
