"""A release window of N commits: `speedtrap init` + `speedtrap bisect` against `git bisect run`, side by side.

    flock /work/heavy.lock .venv/bin/python benchmarks/bench_bisect_window.py [--sizes 8,32,128]
        [--cases single,pair,conflict] [--json bench_bisect_window.json] [--tree DIR]

Each window is built by tests/isolate/commit_stack.py (``make_window``): N commits after a base, the
harmless ones editing their own line, the constructed ones known to break the stack (ground truth
by construction): single (one commit), pair (two commits that fail only together), conflict (the
culprit beside a revert: an earlier commit flips a line, a later one flips it back, the culprit
edits the next line; the culprit and the flip do not cherry-pick together onto the base).
With ``--tree DIR`` (an engine's source: SGLang's or vLLM's installed package folder) the window's base
also holds DIR's Python files and each harmless commit appends a comment line to one of them (spread over
the tree), so init's triage and bisect's work before the first launch run on a real engine's tree.

Both tools get the same tiny server (``python -m stack.server``) and the same probe
(tests/isolate/tiny_probe.py, fail when ``metric > 0.5``):
- speedtrap: ``speedtrap init --repo R --range BASE..HEAD``, the launch, probe and verdict filled in,
  then ``speedtrap bisect --manifest``. Launches are counted by the server's own wrapper (a line per
  start), so the count is speedtrap's launches of the stack, baseline and HEAD included; "before
  first" is the time from the start of ``bisect`` to the first server start.
- git bisect: ``git bisect start HEAD BASE`` then ``git bisect run`` of a script that starts the
  server in the checkout, probes it and stops it; steps = the script's runs (git bisect takes the
  two ends as given and does not test them).
"Found" is whether the tool named exactly the constructed culprit commit(s).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "isolate"))

from commit_stack import TINY_PROBE, Window, git, make_window  # noqa: E402

BOUND = 0.5
SPEEDTRAP = [sys.executable, "-c", "from speedtrap.cli import main; main()"]

# The launch wrapper: one line per server start (time), then the tiny server in this process.
WRAPPER = """import os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(f"{time.time()}\\n")
os.execv(sys.executable, [sys.executable, "-m", "stack.server", *sys.argv[2:]])
"""

# git bisect run's script: start the server in the checkout, wait for health, probe, stop; exit 1 on a fail.
BISECT_STEP = """import json, os, socket, subprocess, sys, time, urllib.request
stamp, probe, bound = sys.argv[1], sys.argv[2], float(sys.argv[3])
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
server = subprocess.Popen([sys.executable, sys.argv[4], stamp, "--port", str(port)], cwd=os.getcwd(),
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
try:
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)
    out = subprocess.run([sys.executable, probe, url], capture_output=True, text=True, check=True).stdout
    sys.exit(1 if json.loads(out)["metric"] > bound else 0)
finally:
    server.terminate()
    server.wait()
"""


def _stamps(path: Path) -> list[float]:
    return [float(x) for x in path.read_text().split()] if path.exists() else []


def run_speedtrap(win: Window, scratch: Path, wrapper: Path) -> dict[str, Any]:
    manifest = scratch / "speedtrap.toml"
    t0 = time.monotonic()
    subprocess.run([*SPEEDTRAP, "init", "--repo", str(win.repo), "--range", f"{win.base}..HEAD", "--out",
                    str(manifest), "--force"], check=True, capture_output=True, text=True)  # fmt: skip
    init_s = time.monotonic() - t0
    stamp = scratch / "speedtrap-launches"
    text = manifest.read_text()
    launch = json.dumps([sys.executable, str(wrapper), str(stamp), "--port", "{port}"])
    text = re.sub(r"^launch = \[\].*$", f"launch = {launch}\nstart_timeout = 30\nstop_timeout = 5\nretries = 0",
                  text, count=1, flags=re.M)  # fmt: skip
    probe = json.dumps([sys.executable, str(TINY_PROBE), "{base_url}"])
    text = re.sub(r'^\[probe\]\nkind = "divergence"\n', f'[probe]\nkind = "command"\nargv = {probe}\ntimeout = 30\n',
                  text, count=1, flags=re.M)  # fmt: skip
    text = re.sub(r'^metric = "worst.kl_p99"\nbound = 0.1\n', f'metric = "metric"\nbound = {BOUND}\nrepeats = 0\n',
                  text, count=1, flags=re.M)  # fmt: skip
    manifest.write_text(text)
    start = time.time()
    t0 = time.monotonic()
    done = subprocess.run([*SPEEDTRAP, "bisect", "--manifest", str(manifest), "--run-dir", str(scratch / "run"),
                           "--json"], capture_output=True, text=True, check=False)  # fmt: skip
    wall = time.monotonic() - t0
    stamps = _stamps(stamp)
    named: list[list[str]] = []
    message = done.stderr.strip().splitlines()[-1:] if done.returncode else []
    if done.stdout.strip():
        result = json.loads(done.stdout)
        message = [result.get("message", "")]
        subjects = {p["name"]: p["subject"] for p in _rows(manifest)}
        named = [[subjects.get(n, n) for n in c["patches"]] for c in result.get("culprits", [])]
    found = sorted(s for c in named for s in c) == sorted(win.culprits) and len(named) == 1
    return {
        "launches": len(stamps),
        "wall_s": round(wall, 2),
        "init_s": round(init_s, 2),
        "before_first_launch_s": round(stamps[0] - start, 2) if stamps else None,
        "named": named,
        "found": found,
        "exit": done.returncode,
        "message": message[0] if message else "",
    }


def _rows(manifest: Path) -> list[dict[str, str]]:
    import tomllib

    return [
        {"name": p["name"], "subject": p.get("summary", "")} for p in tomllib.loads(manifest.read_text())["patches"]
    ]


def run_git_bisect(win: Window, scratch: Path, wrapper: Path) -> dict[str, Any]:
    clone = scratch / "clone"
    subprocess.run(["git", "clone", "-q", str(win.repo), str(clone)], check=True)
    step = scratch / "bisect_step.py"
    step.write_text(BISECT_STEP)
    stamp = scratch / "git-launches"
    t0 = time.monotonic()
    git(clone, "bisect", "start", "HEAD", win.base)
    out = git(clone, "bisect", "run", sys.executable, str(step), str(stamp), str(TINY_PROBE), str(BOUND), str(wrapper))
    wall = time.monotonic() - t0
    first = re.search(r"^([0-9a-f]{40}) is the first bad commit", out, flags=re.M)
    named = [win.subjects[win.shas.index(first.group(1))]] if first else []
    git(clone, "bisect", "reset")
    return {"steps": len(_stamps(stamp)), "wall_s": round(wall, 2), "named": named,
            "found": sorted(named) == sorted(win.culprits)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,32,128")
    parser.add_argument("--cases", default="single,pair,conflict")
    parser.add_argument("--json", type=Path, default=Path("bench_bisect_window.json"))
    parser.add_argument("--tree", type=Path, help="an engine's source (e.g. SGLang's installed package folder) in "
                        "the base; the harmless commits edit its files")  # fmt: skip
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-window-") as tmp:
        os.environ["SPEEDTRAP_CACHE_DIR"] = str(Path(tmp) / "cache")
        wrapper = Path(tmp) / "launch_wrapper.py"
        wrapper.write_text(WRAPPER)
        for case in args.cases.split(","):
            for n in (int(x) for x in args.sizes.split(",")):
                scratch = Path(tmp) / f"{case}-{n}"
                scratch.mkdir()
                win = make_window(scratch, n, case, args.tree)
                st = run_speedtrap(win, scratch, wrapper)
                gb = run_git_bisect(win, scratch, wrapper)
                rows.append({"case": case, "n": n, "culprits": list(win.culprits), "speedtrap": st, "git_bisect": gb})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    args.json.write_text(json.dumps(rows, indent=1))
    head = ("| case | N | speedtrap launches | git bisect steps | speedtrap wall | before first launch "
            "| speedtrap init | git bisect wall | speedtrap found | git bisect found |")  # fmt: skip
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for r in rows:
        s, g = r["speedtrap"], r["git_bisect"]
        st_found = "yes" if s["found"] else "no: " + s["message"]
        gb_found = "yes" if g["found"] else "no: " + ", ".join(g["named"])
        print(f"| {r['case']} | {r['n']} | {s['launches']} | {g['steps']} | {s['wall_s']:.1f} s "
              f"| {s['before_first_launch_s']} s | {s['init_s']:.1f} s | {g['wall_s']:.1f} s "
              f"| {st_found} | {gb_found} |")  # fmt: skip
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
