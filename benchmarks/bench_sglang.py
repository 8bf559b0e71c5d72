"""The hunt on real SGLang: isolate over the SGLang example, checked against brute force over every single patch.

    flock /work/heavy.lock .venv/bin/python benchmarks/bench_sglang.py [--phase all|isolate|brute|table]
        [--only a,b,...] [--no-flags] [--run-dir DIR]

Builds the SGLang venv (once per machine), the GLM-4-MoE export and the example repository
(``examples/sglang/build_example.py``), then:

1. ``isolate`` (what ``speedtrap bisect --manifest examples/sglang/speedtrap.toml`` runs): the culprits, trials,
   launches and wall time; its reference recording (the base, recorded from one server stopped before the
   trials) is kept in ``RUN_DIR/isolate/reference.strec``;
2. ``brute``: every patch alone on the base (a commit that does not apply alone with the commits of the
   example before it that it needs, found by ``git apply --check`` here, not by isolate), one launch each,
   measured against that same recording through speedtrap's server oracle; the benchmark itself calls a patch
   harmful when its figure (the manifest's ``verdict.metric``) is above the manifest's ``verdict.bound``;
3. ``table``: both side by side, whether they agree, and the watcher's counts.

``--phase all`` runs the three in one go; ``isolate`` and ``brute`` can run as two shorter holds of the heavy
lock (``brute`` reuses the manifest, repository and recording the ``isolate`` phase left in ``RUN_DIR``). Each
phase writes its JSON into ``RUN_DIR`` as it goes (``brute`` after every patch, and a rerun skips the patches
done), and ``table`` writes ``RUN_DIR/figures.json``.

A watcher thread scans ``/proc`` every 0.25 s during each phase for ``python -m sglang.launch_server``
processes: the most alive at once (those descended from this process, and all on the machine), and every
distinct pid seen (each one a launch: an independent count of the launches).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sglang"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples" / "sglang"))

import build_example  # noqa: E402
from sglang_stack import ensure_python  # noqa: E402

from _watch import ServerWatcher, argv_has, descends_from  # noqa: E402
from speedtrap.isolate import ServerOracle, TrialRequest, isolate  # noqa: E402
from speedtrap.manifest import Manifest, load_manifest  # noqa: E402
from speedtrap.stack import PatchSpec  # noqa: E402

MARK = argv_has(b"-m", b"sglang.launch_server")


class Watcher:
    """SGLang servers alive at once: this benchmark's (most, and every pid seen: its launches) and the machine's."""

    def __init__(self) -> None:
        self.ours = ServerWatcher(MARK, descends_from(os.getpid()), interval=0.25)
        self.machine = ServerWatcher(MARK, None, interval=0.25)

    def __enter__(self) -> Watcher:
        self.ours.__enter__()
        self.machine.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ours.__exit__()
        self.machine.__exit__()

    def to_json(self) -> dict[str, int]:
        return {"most_alive_ours": self.ours.most, "most_alive_machine": self.machine.most,
                "launches_seen": len(self.ours.seen)}  # fmt: skip


def servers_alive(root: int) -> list[int]:
    """SGLang server pids descended from ``root`` alive now."""
    return ServerWatcher(MARK, descends_from(root)).alive()


# ----------------------------------------------------------------------------------------------
# Brute force's own configurations: a commit alone, or with the earlier commits it needs to apply.


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)


def applies(repo: Path, base: str, shas: list[str]) -> bool:
    """Whether the diffs of ``shas`` (each against its parent), in order, apply on ``base`` (a scratch index)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if _git(repo, "read-tree", base, env=env).returncode:
            return False
        for sha in shas:
            diff = _git(repo, "diff", "--binary", f"{sha}~1", sha).stdout
            done = subprocess.run(
                ["git", "-C", str(repo), "apply", "--cached", "--check", "-"],
                input=diff, capture_output=True, text=True, env=env,
            )  # fmt: skip
            if done.returncode:
                return False
            subprocess.run(
                ["git", "-C", str(repo), "apply", "--cached", "-"],
                input=diff, capture_output=True, text=True, env=env, check=True,
            )  # fmt: skip
    return True


def alone(manifest: Manifest, patch: PatchSpec) -> tuple[str, ...]:
    """``patch`` on the base: alone, or with the fewest earlier commit patches it needs to apply."""
    if patch.commit is None or manifest.target.repo is None:
        return (patch.name,)
    repo, base = Path(manifest.target.repo), str(manifest.target.base)
    commits = [p for p in manifest.patches if p.commit is not None]
    before = commits[: commits.index(patch)]
    for n in range(len(before) + 1):
        for extra in itertools.combinations(before, n):  # in history order
            if applies(repo, base, [str(p.commit) for p in (*extra, patch)]):
                return tuple(p.name for p in (*extra, patch))
    raise RuntimeError(f"{patch.name}: its commit does not apply on the base even with every commit before it")


# ----------------------------------------------------------------------------------------------
# The phases.


def setup(run_dir: Path, flags: bool, reuse: bool) -> tuple[Path, float]:
    """The manifest in ``run_dir`` (venv, export and repository made first, unless ``reuse`` and it exists)."""
    path = run_dir / "speedtrap.toml"
    t0 = time.monotonic()
    if not (reuse and path.exists()):
        python = ensure_python()
        model = build_example.export_model()
        shas = build_example.build_repo(python)
        run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(build_example.manifest_text(python, model, shas, flags=flags))
    return path, time.monotonic() - t0


def selected(path: Path, only: list[str]) -> Manifest:
    manifest = load_manifest(path)
    if only:
        manifest = dataclasses.replace(manifest, patches=tuple(p for p in manifest.patches if p.name in only))
    return manifest


def run_isolate(manifest: Manifest, run_dir: Path, setup_s: float) -> dict[str, Any]:
    with Watcher() as watcher:
        t0 = time.monotonic()
        result = isolate(manifest, run_dir / "isolate")
        hunt_s = time.monotonic() - t0
    print(result.summary(), flush=True)
    metric = manifest.verdict.metric
    record = {
        "patches": [p.name for p in manifest.patches],
        "status": result.status.value,
        "culprits": sorted(sorted(c.patches) for c in result.culprits),
        "trials": [
            {
                "config": list(t.config),
                "status": t.status,
                "outcome": t.outcome.value if t.outcome else None,
                metric: t.figures.get(metric),
                "launch_s": round(t.launch_s, 1),
                "probe_s": round(t.probe_s, 1),
            }
            for t in result.trials
        ],
        "trial_launches": result.launches,
        "notes": list(result.notes),
        "hunt_s": hunt_s,
        "setup_s": setup_s,
        "watcher": watcher.to_json(),
    }
    (run_dir / "isolate.json").write_text(json.dumps(record, indent=2))
    return record


def run_brute(manifest: Manifest, run_dir: Path) -> dict[str, Any]:
    reference = run_dir / "isolate" / "reference.strec"
    if not reference.exists():
        raise SystemExit(f"no recording at {reference}: run --phase isolate first")
    out_path = run_dir / "brute.json"
    done: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {}
    rows: dict[str, Any] = done.get("alone", {})
    probe = dataclasses.replace(manifest.probe, reference=str(reference))
    oracle = ServerOracle(manifest.target, manifest.patches, probe)
    metric, bound = manifest.verdict.metric, manifest.verdict.bound
    workdir = run_dir / "brute"
    workdir.mkdir(parents=True, exist_ok=True)
    with Watcher() as watcher:
        t0 = time.monotonic()
        try:
            oracle.prepare(None)  # loads the recording: no baseline server here
            for patch in manifest.patches:
                if patch.name in rows and rows[patch.name].get(metric) is not None:
                    continue
                config = alone(manifest, patch)
                request = TrialRequest(tuple(sorted(config)), 0, workdir, f"alone-{patch.name}")
                try:
                    m = oracle.measure(request, 1)
                except Exception as exc:  # a failed launch or probe is a row, not the end of the table
                    rows[patch.name] = {"config": list(config), metric: None, "error": f"{type(exc).__name__}: {exc}"}
                else:
                    value = float(m.figures[metric])
                    rows[patch.name] = {
                        "config": list(config), metric: value, "harmful": math.isnan(value) or value > float(bound),
                        "launch_s": round(m.launch_s, 1), "probe_s": round(m.probe_s, 1), "log": m.log_path,
                    }  # fmt: skip
                print(f"alone: {patch.name} {config}: {rows[patch.name]}", flush=True)
                out_path.write_text(json.dumps({"alone": rows, "bound": bound, "metric": metric}, indent=2))
        finally:
            oracle.close()
        brute_s = time.monotonic() - t0
    record = {"alone": rows, "bound": bound, "metric": metric, "brute_s": brute_s + done.get("brute_s", 0.0),
              "watcher": watcher.to_json()}  # fmt: skip
    out_path.write_text(json.dumps(record, indent=2))
    return record


def table(run_dir: Path) -> dict[str, Any]:
    iso = json.loads((run_dir / "isolate.json").read_text())
    brute = json.loads((run_dir / "brute.json").read_text())
    metric, rows = brute["metric"], brute["alone"]
    missing = [n for n in iso["patches"] if n not in rows or rows[n].get(metric) is None]
    harmful = sorted(n for n in iso["patches"] if rows.get(n, {}).get("harmful"))
    base = [t[metric] for t in iso["trials"] if t["config"] == []]
    print(f"patches: {iso['patches']}")
    print(f"baseline trial (no patch) {metric}: {base[0] if base else None}")
    print(f"| patch | configuration | {metric} | harmful alone (> {brute['bound']}) |")
    print("|---|---|---|---|")
    for name in iso["patches"]:
        row = rows.get(name, {})
        value = row.get(metric)
        shown = f"{value:.3g}" if isinstance(value, float) else f"error: {row.get('error')}"
        config = " + ".join(row.get("config", [name]))
        print(f"| `{name}` | {config} | {shown} | {'yes' if row.get('harmful') else 'no'} |")
    agree = not missing and iso["culprits"] == [[h] for h in harmful]
    print(f"isolate: {iso['status']}, culprits {iso['culprits']}, {len(iso['trials'])} trials "
          f"({iso['trial_launches']} run), {iso['hunt_s'] / 60:.1f} min; watcher {iso['watcher']}")  # fmt: skip
    print(f"brute force: harmful alone {harmful}, {len(rows)} launches, {brute['brute_s'] / 60:.1f} min; "
          f"watcher {brute['watcher']}")  # fmt: skip
    print(f"agree: {agree}" + (f" (brute force missing: {missing})" if missing else ""))
    record = {"isolate": iso, "brute": brute, "harmful": harmful, "agree": agree}
    (run_dir / "figures.json").write_text(json.dumps(record, indent=2))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=("all", "isolate", "brute", "table"), default="all")
    parser.add_argument("--only", default="", help="comma-separated patches of the example to search")
    parser.add_argument("--no-flags", action="store_true", help="the commit patches only")
    parser.add_argument("--run-dir", type=Path, default=ROOT / ".bench-sglang")
    args = parser.parse_args()
    only = [n for n in args.only.split(",") if n]
    if args.phase == "table":
        table(args.run_dir)
        return
    path, setup_s = setup(args.run_dir, flags=not args.no_flags, reuse=args.phase == "brute")
    manifest = selected(path, only)
    if args.phase in ("all", "isolate"):
        run_isolate(manifest, args.run_dir, setup_s)
    if args.phase in ("all", "brute"):
        run_brute(manifest, args.run_dir)
    if args.phase == "all":
        table(args.run_dir)
    left = servers_alive(os.getpid())
    if left:
        raise SystemExit(f"SGLang servers of this benchmark still alive: {left}")


if __name__ == "__main__":
    main()
