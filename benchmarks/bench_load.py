"""smol-moe load time: first load (GGUF -> converted-weights cache) vs second load (from the cache).

Each load runs in a fresh process with the same empty-at-start cache directory, so the figure is a
whole-process wall time: ``python benchmarks/bench_load.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

LOAD = "from speedtrap.targets.smolmoe import SmolMoETarget; SmolMoETarget().load()"


def timed_load(cache_dir: str) -> float:
    env = dict(os.environ, SPEEDTRAP_CACHE_DIR=cache_dir)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", LOAD], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as cache_dir:
        first = timed_load(cache_dir)
        second = timed_load(cache_dir)
    print(f"first load (convert GGUF, write cache): {first:6.1f} s")
    print(f"second load (from cache):               {second:6.1f} s")
    print(f"speed-up: {first / second:.1f}x (goal >= 3x)")


if __name__ == "__main__":
    main()
