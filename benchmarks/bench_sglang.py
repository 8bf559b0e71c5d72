"""The hunt on real SGLang: isolate over the SGLang example, checked against brute force over every single patch.

    .venv/bin/python benchmarks/bench_sglang.py [--only a,b,...] [--no-flags] [--run-dir DIR]

Builds the SGLang venv (once per machine), the GLM-4-MoE export and the example repository
(``examples/sglang/build_example.py``), then:

1. isolate (what ``speedtrap bisect --manifest examples/sglang/speedtrap.toml`` runs): the culprits, trials,
   launches and wall time; its reference recording is kept;
2. brute force: every patch alone, one launch each, measured against that same recording with the same
   verdict; a patch is harmful when its trial fails.

It prints both and whether they agree, and the most of its own SGLang servers alive at once (a watcher polls
every second for ``sglang.launch_server`` processes descended from this one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sglang"))
sys.path.insert(0, str(ROOT / "examples" / "sglang"))

import build_example  # noqa: E402
from sglang_stack import ensure_python  # noqa: E402

from speedtrap.isolate import Status, isolate, load_isolate_manifest  # noqa: E402


class Watcher:
    """The most ``sglang.launch_server`` processes of this benchmark alive at once (main processes only)."""

    def __init__(self) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.most = max(self.most, len(servers_alive()))

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def servers_alive(root: int | None = None) -> list[int]:
    """Pids descended from ``root`` (default: this process) whose command line runs ``-m sglang.launch_server``."""
    root = os.getpid() if root is None else root
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sglang.launch_server" not in argv or b"-m" not in argv:
            continue
        pid = int(proc.name)
        while pid > 1 and pid != root:
            pid = _parent(pid)
        if pid == root:
            out.append(int(proc.name))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated patches of the example to search")
    parser.add_argument("--no-flags", action="store_true", help="the commit patches only")
    parser.add_argument("--run-dir", type=Path, default=ROOT / ".bench-sglang")
    args = parser.parse_args()
    t0 = time.monotonic()
    python = ensure_python()
    model = build_example.export_model()
    shas = build_example.build_repo(python)
    path = args.run_dir / "speedtrap.toml"
    args.run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(build_example.manifest_text(python, model, shas, flags=not args.no_flags))
    setup_s = time.monotonic() - t0
    manifest = load_isolate_manifest(path)
    only = [n for n in args.only.split(",") if n]
    if only:
        manifest = dataclasses.replace(manifest, patches=tuple(p for p in manifest.patches if p.name in only))
    names = [p.name for p in manifest.patches]
    with Watcher() as watcher:
        t1 = time.monotonic()
        result = isolate(manifest, args.run_dir / "isolate")
        hunt_s = time.monotonic() - t1
        print(result.summary(), flush=True)
        reference = args.run_dir / "isolate" / "reference.strec"
        harmful, figures = [], {}
        t2 = time.monotonic()
        for patch in manifest.patches:
            probe = dataclasses.replace(manifest.probe, reference=str(reference))
            single = dataclasses.replace(manifest, patches=(patch,), probe=probe)
            one = isolate(single, args.run_dir / f"single-{patch.name}", check_interactions=False)
            fig = [t.figures for t in one.trials if tuple(t.config) == (patch.name,)]
            figures[patch.name] = fig[0] if fig else None
            if one.status is Status.FOUND:
                harmful.append(patch.name)
            print(f"alone: {patch.name}: {one.status.value} {figures[patch.name]}", flush=True)
        brute_s = time.monotonic() - t2
    culprits = sorted(sorted(c.patches) for c in result.culprits)
    print(f"setup (venv, export, repository; the venv once per machine): {setup_s:.0f} s")
    print(f"patches: {names}")
    print(f"isolate: {result.status.value}, culprits {culprits}, {len(result.trials)} trials, "
          f"{result.launches} launches, {hunt_s / 60:.1f} min")  # fmt: skip
    print(f"brute force: harmful alone {harmful}, {len(names)} launches, {brute_s / 60:.1f} min")
    print(f"agree: {culprits == [[h] for h in sorted(harmful)]}; most SGLang servers alive at once: {watcher.most}")
    record = {"culprits": culprits, "harmful": harmful, "alone": figures, "hunt_s": hunt_s, "brute_s": brute_s,
              "most_alive": watcher.most}  # fmt: skip
    (args.run_dir / "figures.json").write_text(json.dumps(record, indent=2, default=str))


if __name__ == "__main__":
    main()
