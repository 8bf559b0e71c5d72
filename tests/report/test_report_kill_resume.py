"""``kill -9`` of ``speedtrap run`` at a random point in each stage, then the same command again.

The stack is the tiny server (a launch per trial) with a probe command that logs every measurement, so
ground truth is counted outside speedtrap: the rerun gives the uninterrupted run's verdict, measures no
trial that the store held when the run was killed, recomputes no stored probe part, leaves every trial
in the store once, and the killed run's servers are gone (their ports refuse connections).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from speedtrap.isolate import TrialStore

HERE = Path(__file__).parent
MANIFEST = """
[target]
launch = [{python}, {server}, "--port", "{{port}}"]
health = "http://127.0.0.1:{{port}}/health"
start_timeout = 30
stop_timeout = 5
env = {{ TINY_BROKEN = "bad_gemm", TINY_STAY = "1" }}

[probe]
kind = "command"
argv = [{python}, {probe}, "{{base_url}}"]
timeout = 60

[verdict]
rule = "threshold"
metric = "metric"
bound = 0.5
near = 0.0
repeats = 0
{patches}
"""
PATCHES = ("fast_norm", "bad_gemm", "kv_cache", "fused_rope")
STAGES = ("triage", "probes", "isolate", "evidence", "report")


def _manifest(folder: Path) -> Path:
    q = json.dumps
    patches = "".join(f'\n[[patches]]\nname = "{p}"\nenv = {{ TINY_P_{p.upper()} = "1" }}\n' for p in PATCHES)
    path = folder / "speedtrap.toml"
    path.write_text(
        MANIFEST.format(
            python=q(sys.executable),
            server=q(str(HERE / "_report_tiny_server.py")),
            probe=q(str(HERE / "_report_counting_probe.py")),
            patches=patches,
        )
    )
    return path


def _start(manifest: Path, out: Path, measured: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "speedtrap", "run", "--manifest", str(manifest), "--out", str(out), "--json"]
    env = {**os.environ, "TINY_MEASURED": str(measured)}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode in (0, 2) and "Traceback" not in err, err[-3000:]
    summary: dict[str, Any] = json.loads(out)
    return summary


def _running_stage(out: Path) -> str | None:
    try:
        stages = json.loads((out / "run.json").read_text())["stages"]
    except (OSError, ValueError, KeyError):
        return None
    if "report" in stages:  # marked done as it starts: the files are written after
        return "report"
    running = [name for name, s in stages.items() if s.get("status") == "running"]
    return running[0] if running else None


def _kill_in(proc: subprocess.Popen[str], out: Path, stage: str, rng: random.Random) -> str | None:
    """SIGKILL the run a random moment after ``stage`` starts; the stage it was in (per run.json)."""
    deadline = time.monotonic() + 300
    while _running_stage(out) != stage:
        assert proc.poll() is None, f"the run ended before {stage} was seen running"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    if stage == "isolate":  # a moment when a trial's server is up (what a kill must not orphan)
        while all(_refused(p) for p in _ports(out)):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.1))
    else:
        time.sleep(rng.uniform(0.0, 0.4))
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    return _running_stage(out)


def _measured(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _stored(out: Path) -> list[tuple[tuple[str, ...], int]]:
    if not (out / "isolate" / "trials.sqlite").exists():
        return []
    store = TrialStore(out / "isolate")
    try:
        return [(tuple(sorted(t.config)), t.repeat) for t in store.trials() if t.status == "ok"]
    finally:
        store.close()


def _stored_parts(out: Path) -> set[str]:
    parts = set()
    for path in (out / "probes").glob("**/*.json") if (out / "probes").exists() else []:
        try:
            json.loads(path.read_text())
        except ValueError:
            continue
        parts.add(str(path.relative_to(out)))
    return parts


def _ports(out: Path) -> set[int]:
    ports = set()
    for log in out.glob("**/*.log"):
        first = log.read_text(errors="replace").splitlines()[:1]
        ports |= {int(p) for p in re.findall(r"--port (\d+)", first[0])} if first else set()
    return ports


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _kill_servers_on(ports: list[int]) -> None:
    """SIGKILL the tiny servers started on these ports (found by their command lines)."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"_report_tiny_server.py") for a in argv) and any(
            argv[i : i + 2] == [b"--port", str(port).encode()] for port in ports for i in range(len(argv))
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def _verdict(summary: dict[str, Any]) -> Any:
    return [(c["patches"], c["confirmed"]) for c in summary["verdict"]["culprits"]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("clean")
    return _finish(_start(_manifest(folder), folder / "run", folder / "measured.txt"))


@pytest.mark.parametrize("stage", [pytest.param(s, marks=() if s == "isolate" else pytest.mark.slow) for s in STAGES])
def test_kill_9_in_a_stage_then_rerun_loses_and_repeats_nothing(
    uninterrupted: dict[str, Any], tmp_path: Path, stage: str
) -> None:
    rng = random.Random(f"kill-{stage}")
    manifest, out, measured = _manifest(tmp_path), tmp_path / "run", tmp_path / "measured.txt"
    landed = _kill_in(_start(manifest, out, measured), out, stage, rng)
    print(f"\nkilled during {landed} (aimed at {stage})")
    finished_before = set(_stored(out))
    parts_before = _stored_parts(out)
    measured_before = len(_measured(measured))
    # No server of the killed run is left (they sit in their own sessions: only the guard ends them).
    deadline = time.monotonic() + 20
    while not all(_refused(p) for p in _ports(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in _ports(out) if not _refused(p)]
    _kill_servers_on(left)  # a failing test leaves nothing running either
    assert left == [], "a server of the killed run is still answering"

    again = _finish(_start(manifest, out, measured))
    assert _verdict(again) == _verdict(uninterrupted) == [(["bad_gemm"], True)]
    remeasured = [line.split("|") for line in _measured(measured)[measured_before:]]
    again_configs = {(tuple(sorted(c.split(","))) if c else (), int(r)) for c, r in remeasured}
    assert not again_configs & finished_before, "a finished trial was measured again"
    stored = _stored(out)
    assert len(stored) == len(set(stored)), "a trial is in the store twice"
    assert not set(again["computed"]) & parts_before, "a stored probe part was computed again"
