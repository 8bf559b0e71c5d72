"""Time `speedtrap demo` as a whole process: a first run from nothing, then a second run reusing it.

    .venv/bin/python benchmarks/bench_demo.py [--quick] [--keep DIR]

First run: a fresh converted-weights cache (SPEEDTRAP_CACHE_DIR in a new temporary folder, so the
GGUF file is converted again, as on a fresh clone) and a fresh --out folder. Second run: the same
command again, which reuses every stored stage and trial. Wall time is measured around the whole
process (interpreter start-up included). The budgets are 300 s and 60 s on the 2-core machine;
the load average is printed because other processes on the machine distort the figures.
"""

from __future__ import annotations

import argparse
import json
import os
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


def run_demo(out: Path, cache: Path, quick: bool) -> tuple[float, dict[str, object]]:
    env = {**os.environ, "SPEEDTRAP_CACHE_DIR": str(cache)}
    argv = [sys.executable, "-c", CLI, "demo", "--out", str(out), "--json"] + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"speedtrap demo failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    summary: dict[str, object] = json.loads(done.stdout)
    return wall, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="time `speedtrap demo --quick`")
    parser.add_argument("--keep", type=Path, help="keep the run directory here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        cache = Path(tmp) / "cache"
        out = args.keep or Path(tmp) / "run"
        print(f"load average before: {load()}  (2 cores; figures above ~2 mean contention)")
        first, summary = run_demo(out, cache, args.quick)
        verdict = summary["verdict"]
        assert isinstance(verdict, dict)
        print(f"first run  : {first:6.1f} s wall  (budget {FIRST_BUDGET_S:.0f} s, ratio {first / FIRST_BUDGET_S:.2f})")
        print(f"             stages: {summary['seconds']}")
        print(f"             verdict: {verdict['headline']}")
        print(f"load average between: {load()}")
        second, again = run_demo(out, cache, args.quick)
        reused, computed = len(again["reused"]), len(again["computed"])  # type: ignore[arg-type]
        print(
            f"second run : {second:6.1f} s wall  (budget {SECOND_BUDGET_S:.0f} s, "
            f"ratio {second / SECOND_BUDGET_S:.2f}); {reused} parts reused, {computed} measured"
        )
        print(f"             stages: {again['seconds']}")
        print(f"second / first: {second / first:.3f}")
        print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
