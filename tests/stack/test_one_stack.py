"""One stack alive: every launch goes through the run's launch guard (``speedtrap.stack.StackGuard``).

Ground truth is the kernel's and the server's own: the tiny server writes a line per launch (``TINY_LAUNCHES``)
and its pid (``TINY_PIDS``); a second launch while one stack is alive must raise before anything starts.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from speedtrap.isolate import TrialRequest
from speedtrap.isolate._oracle import ServerOracle
from speedtrap.manifest import load_manifest
from speedtrap.stack import Launcher, SecondStack, StackGuard

TINY_SERVER = Path(__file__).resolve().parents[1] / "isolate" / "tiny_server.py"


def _manifest(tmp_path: Path, roles: bool = False) -> Path:
    launches = tmp_path / "launches.txt"
    env = f'env = {{ TINY_LAUNCHES = "{launches}" }}'
    launch = json.dumps([sys.executable, str(TINY_SERVER), "--port", "{port}"])
    if roles:
        target = f"""
[target]
start_timeout = 20
stop_timeout = 5
{env}
[target.roles.decode]
launch = {launch}
[target.roles.router]
launch = {launch}
after = ["decode"]
entry = true
"""
    else:
        target = f"""
[target]
launch = {launch}
health = "http://127.0.0.1:{{port}}/health"
start_timeout = 20
stop_timeout = 5
{env}
"""
    text = target + textwrap.dedent("""
        [[patches]]
        name = "bad_gemm"
        env = { TINY_P_BAD_GEMM = "1" }

        [probe]
        kind = "command"
        argv = ["true"]

        [verdict]
        metric = "metric"
        bound = 0.5
        """)
    path = tmp_path / "speedtrap.toml"
    path.write_text(text)
    return path


def _launches(tmp_path: Path) -> list[str]:
    path = tmp_path / "launches.txt"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("roles", [False, True], ids=["server", "stack-of-roles"])
def test_a_second_stack_while_one_is_alive_raises_and_starts_nothing(tmp_path: Path, roles: bool) -> None:
    manifest = load_manifest(_manifest(tmp_path, roles))
    first = Launcher(manifest.target, manifest.patches)
    second = Launcher(manifest.target, manifest.patches)  # another stage's launcher, same run
    server, _ = first.start((), tmp_path / "base.log")
    per_stack = len(_launches(tmp_path))
    assert per_stack == (2 if roles else 1)
    try:
        if roles:  # inspect names each role's node and ranks (both here: this machine, no --tp)
            from speedtrap.stack import inspect_stack

            report = inspect_stack(tmp_path / "speedtrap.toml", manifest.target, manifest.patches)
            shown = {r.role: (r.node, r.ranks) for r in report.roles}
            assert shown == {"decode": ("this machine", 1), "router": ("this machine", 1)}, shown
        with pytest.raises(SecondStack, match=r"configuration bad_gemm .*already has one stack alive.*base\.log"):
            second.start(("bad_gemm",), tmp_path / "trial.log")
        assert len(_launches(tmp_path)) == per_stack  # refused before any process of it started
    finally:
        server.stop()
    again, _ = second.start(("bad_gemm",), tmp_path / "trial.log")  # the slot came back with the stop
    again.stop()
    assert len(_launches(tmp_path)) == 2 * per_stack


def test_a_run_that_asks_for_more_stacks_gets_that_many_and_no_more(tmp_path: Path) -> None:
    manifest = load_manifest(_manifest(tmp_path))
    oracle = ServerOracle(manifest.target, manifest.patches, manifest.probe)
    oracle.allow(2)  # search.parallel = 2, trials on threads
    a, _ = oracle.start((), tmp_path / "a.log")
    b, _ = oracle.start(("bad_gemm",), tmp_path / "b.log")
    try:
        with pytest.raises(SecondStack, match="already has 2 stacks alive"):
            oracle.start((), tmp_path / "c.log")
        # a launcher of another stage allows one: it is refused while any stack of the run is alive
        with pytest.raises(SecondStack):
            Launcher(manifest.target, manifest.patches).start((), tmp_path / "d.log")
    finally:
        a.stop()
        b.stop()
        oracle.close()
    assert len(_launches(tmp_path)) == 2


def test_a_launch_that_fails_gives_its_slot_back(tmp_path: Path) -> None:
    manifest = load_manifest(_manifest(tmp_path))
    broken = dataclasses.replace(manifest.target, start_timeout=2.0)
    launcher = Launcher(broken, manifest.patches)
    env = {"TINY_NEVER_HEALTHY": "1"}
    with pytest.raises(Exception, match="did not become healthy"):
        launcher.start((), tmp_path / "never.log", env)
    assert launcher.guard.alive() == []
    server, _ = launcher.start((), tmp_path / "fine.log")
    server.stop()


def test_a_killed_holder_frees_its_slot_and_scopes_do_not_meet(tmp_path: Path) -> None:
    root = tmp_path / "guard"
    code = (
        "import sys, time; from pathlib import Path; from speedtrap.stack import StackGuard;"
        f"StackGuard(1, 'run-a', Path({str(root)!r})).take('the held stack'); print('held', flush=True);"
        "time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(SecondStack, match=rf"pid {holder.pid}: the held stack"):
            StackGuard(1, "run-a", root).take("another")
        other = StackGuard(1, "run-b", root).take("another run's stack")  # another run (a test worker) is free
        other.release()
    finally:
        holder.kill()
        holder.wait()
    slot = StackGuard(1, "run-a", root).take("after the kill")  # the kernel let go of the dead holder's lock
    slot.release()
    slot.release()  # idempotent
    assert not (root / "run-a").exists()


def test_a_server_healthy_at_health_that_dies_on_its_first_request_is_named_with_its_last_line(
    tmp_path: Path,
) -> None:
    """vLLM with expert parallelism on a CPU without AMX: /health said 200, then a crash on the first request.
    The trial's error names the server's role and the engine's own last line, in seconds (no hang)."""
    manifest = load_manifest(_manifest(tmp_path))
    target = type(manifest.target)(
        **{**manifest.target.__dict__, "env": (*manifest.target.env, ("TINY_DIE_ON_REQUEST", "1"))}
    )
    probe = type(manifest.probe)(kind="command", argv=(sys.executable, "-c", _POST, "{base_url}"), timeout=30)
    oracle = ServerOracle(target, manifest.patches, probe)
    t0 = time.monotonic()
    try:
        with pytest.raises(Exception) as caught:
            oracle.measure(TrialRequest((), 0, tmp_path / "trials", "trial-0001"), 1)
    finally:
        oracle.close()
    text = str(caught.value)
    assert time.monotonic() - t0 < 30
    assert "role 'server'" in text and "exited (code 1)" in text, text
    assert "RuntimeError: pin_memory=True requires a CUDA" in text, text


_POST = (
    "import sys, json, urllib.request;"
    "urllib.request.urlopen(urllib.request.Request(sys.argv[1] + '/v1/completions', data=b'{}'), timeout=20)"
)
