"""Time `speedtrap triage` over the whole SGLang and vLLM source trees with `--symbol routed_scaling_factor`.

    .venv/bin/python benchmarks/bench_triage.py [--wheel sglang-0.5.23-*.whl] [--vllm-wheel vllm-0.33.0-*.whl]
                                                [--repeat 3] [--only sglang|vllm]

The wheels are downloaded from PyPI (`pip download --no-deps sglang==0.5.23` / `vllm==0.33.0`) into a
temporary directory unless --wheel / --vllm-wheel (or SPEEDTRAP_SGLANG_WHEEL / SPEEDTRAP_VLLM_WHEEL)
name local copies. Each run is a fresh `speedtrap triage --patch D --tree T --symbol
routed_scaling_factor --json` process (interpreter start-up included). On SGLang, D makes HashTopK
scale its output unconditionally; on vLLM, D drops the identity selection
`routed_scaling_factor if not apply_routed_scale_to_output else 1.0` from FusedMoEFactory's router
argument (the factor is then applied in the router and again by the runner under the flag).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

VERSION = "0.5.23"
VLLM_VERSION = "0.33.0"
VLLM_LAYER = "vllm/model_executor/layers/fused_moe/layer.py"
VLLM_OLD = (
    "            routed_scaling_factor=routed_scaling_factor\n"
    "            if not apply_routed_scale_to_output\n"
    "            else 1.0,\n"
    "            e_score_correction_bias=e_score_correction_bias,\n"
)
VLLM_NEW = (
    "            routed_scaling_factor=routed_scaling_factor,\n"
    "            e_score_correction_bias=e_score_correction_bias,\n"
)
HASH_TOPK = "sglang/srt/layers/moe/hash_topk.py"
GUARDED = (
    "        if self.apply_routed_scaling_factor_on_output:\n"
    "            topk_weights = topk_weights * self.routed_scaling_factor\n"
)
UNCONDITIONAL = "        topk_weights = topk_weights * self.routed_scaling_factor\n"
CLI = "import sys; from speedtrap.cli import main; sys.argv[0] = 'speedtrap'; main()"


def fetch(dest: Path, wheel: str | None, package: str = "sglang", version: str = VERSION) -> Path:
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
            f"{package}=={version}",
            "-d",
            str(dest),
        ],
        check=True,
    )
    return next(dest.glob(f"{package}-*.whl"))


def bench(root: Path, label: str, wheel: Path, rel: str, old: str, new: str, repeat: int) -> None:
    tree = root / f"tree-{label}"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tree, [m for m in zf.namelist() if not m.endswith(".so")])
    files = sum(1 for p in tree.rglob("*") if p.is_file())
    py = sum(1 for _ in tree.rglob("*.py"))
    before = (tree / rel).read_text()
    assert before.count(old) == 1, f"{rel} no longer holds the code the benchmark patches"
    after = before.replace(old, new)
    diff = root / f"{label}.diff"
    diff.write_text(
        "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))
    )
    cmd = [sys.executable, "-c", CLI, "triage", "--patch", str(diff), "--tree", str(tree)]
    cmd += ["--symbol", "routed_scaling_factor", "--json"]
    walls, inner, cpus = [], [], []
    data: dict[str, Any] = {}
    for _ in range(repeat):
        start = time.perf_counter()
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        walls.append(time.perf_counter() - start)
        after_use = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after_use.ru_utime + after_use.ru_stime - used.ru_utime - used.ru_stime)
        data = json.loads(proc.stdout)
        inner.append(data["elapsed_s"])
    trace = data["trace"]
    [patch] = data["patches"]
    print(
        f"{label}: {files} files ({py} Python; {trace['files_scanned']} text files scanned), "
        f"{len(trace['sites'])} sites of routed_scaling_factor, patch tier {patch['tier']}, "
        f"{len(patch['double_applications'])} possible double applications flagged"
    )
    print(
        f"  triage --symbol routed_scaling_factor: median {statistics.median(walls):.2f} s end to end "
        f"(fresh process, {repeat} runs: {', '.join(f'{w:.2f}' for w in walls)}); "
        f"analysis alone median {statistics.median(inner):.2f} s; CPU time of the process median "
        f"{statistics.median(cpus):.2f} s; budget 10 s"
    )
    print(f"  load average during the runs: {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", default=os.environ.get("SPEEDTRAP_SGLANG_WHEEL"))
    parser.add_argument("--vllm-wheel", default=os.environ.get("SPEEDTRAP_VLLM_WHEEL"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["sglang", "vllm"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="speedtrap-bench-") as tmp:
        root = Path(tmp)
        if args.only != "vllm":
            wheel = fetch(root, args.wheel)
            bench(root, f"SGLang {VERSION}", wheel, HASH_TOPK, GUARDED, UNCONDITIONAL, args.repeat)
        if args.only != "sglang":
            wheel = fetch(root, args.vllm_wheel, "vllm", VLLM_VERSION)
            bench(root, f"vLLM {VLLM_VERSION}", wheel, VLLM_LAYER, VLLM_OLD, VLLM_NEW, args.repeat)


if __name__ == "__main__":
    main()
