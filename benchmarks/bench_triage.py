"""Time `speedtrap triage` over the whole SGLang source tree with `--symbol routed_scaling_factor`.

    .venv/bin/python benchmarks/bench_triage.py [--wheel sglang-0.5.23-*.whl] [--repeat 3]

The wheel is downloaded from PyPI (`pip download --no-deps sglang==0.5.23`) into a temporary
directory unless --wheel (or SPEEDTRAP_SGLANG_WHEEL) names a local copy. Each run is a fresh
`speedtrap triage --patch D --tree T --symbol routed_scaling_factor --json` process (interpreter
start-up included), where D is a diff that makes HashTopK scale its output unconditionally.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

VERSION = "0.5.23"
HASH_TOPK = "sglang/srt/layers/moe/hash_topk.py"
GUARDED = (
    "        if self.apply_routed_scaling_factor_on_output:\n"
    "            topk_weights = topk_weights * self.routed_scaling_factor\n"
)
UNCONDITIONAL = "        topk_weights = topk_weights * self.routed_scaling_factor\n"
CLI = "import sys; from speedtrap.cli import main; sys.argv[0] = 'speedtrap'; main()"


def fetch(dest: Path, wheel: str | None) -> Path:
    if wheel:
        return Path(wheel)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            f"sglang=={VERSION}",
            "-d",
            str(dest),
        ],
        check=True,
    )
    return next(dest.glob("sglang-*.whl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", default=os.environ.get("SPEEDTRAP_SGLANG_WHEEL"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="speedtrap-bench-") as tmp:
        root = Path(tmp)
        wheel = fetch(root, args.wheel)
        tree = root / "tree"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tree, [m for m in zf.namelist() if not m.endswith(".so")])
        files = sum(1 for p in tree.rglob("*") if p.is_file())
        before = (tree / HASH_TOPK).read_text()
        after = before.replace(GUARDED, UNCONDITIONAL)
        diff = root / "hash_topk_always_scale.diff"
        diff.write_text(
            "".join(
                difflib.unified_diff(
                    before.splitlines(True), after.splitlines(True), f"a/{HASH_TOPK}", f"b/{HASH_TOPK}"
                )
            )
        )
        cmd = [
            sys.executable,
            "-c",
            CLI,
            "triage",
            "--patch",
            str(diff),
            "--tree",
            str(tree),
            "--symbol",
            "routed_scaling_factor",
            "--json",
        ]
        walls, inner = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            walls.append(time.perf_counter() - start)
            data = json.loads(proc.stdout)
            inner.append(data["elapsed_s"])
        trace = data["trace"]
        print(
            f"SGLang {VERSION}: {files} files ({trace['files_scanned']} text files scanned), "
            f"{len(trace['sites'])} sites of routed_scaling_factor, "
            f"{len(trace['double_applications'])} possible double applications flagged"
        )
        print(
            f"triage --symbol routed_scaling_factor: median {statistics.median(walls):.2f} s end to end "
            f"(fresh process, {args.repeat} runs: {', '.join(f'{w:.2f}' for w in walls)}); "
            f"analysis alone median {statistics.median(inner):.2f} s; budget 10 s"
        )


if __name__ == "__main__":
    main()
