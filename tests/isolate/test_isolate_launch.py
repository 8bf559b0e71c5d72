"""Launching real server processes: health with a deadline, SIGTERM then SIGKILL, logs, clear errors."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from speedtrap._errors import ServerError
from speedtrap.isolate import ServerOracle, TrialRequest
from speedtrap.manifest import load_manifest
from speedtrap.stack import CommandNotFound, LaunchSpec, free_port, launch, start, wait_healthy

TINY = Path(__file__).with_name("tiny_server.py")


def _spec(
    port: int, env: dict[str, str] | None = None, argv: list[str] | None = None, timeout: float = 20
) -> LaunchSpec:
    return LaunchSpec(
        tuple(argv or [sys.executable, str(TINY), "--port", str(port)]),
        {**os.environ, **(env or {})},
        f"http://127.0.0.1:{port}/health",
        start_timeout=timeout,
        stop_timeout=2,
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_server_starts_answers_and_stops_with_its_log(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "trial.log"
    with launch(_spec(port), log, port) as server:
        assert httpx.get(f"http://127.0.0.1:{port}/figures").json()["metric"] == 0.0
        pid = server.pid
    assert _gone(pid) or server.proc.returncode is not None
    text = log.read_text()
    assert text.startswith("$ ") and "tiny server on" in text and "GET /figures" in text


def test_a_command_that_does_not_exist_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(CommandNotFound) as info:
        launch(_spec(1, argv=["/no/such/server-binary", "--port", "1"]), tmp_path / "x.log")
    assert "target.launch[0]" in info.value.one_line() and "/no/such/server-binary" in info.value.one_line()


def test_a_server_that_never_becomes_healthy_names_its_log_and_is_stopped(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "never.log"
    t0 = time.monotonic()
    server = start(_spec(port, {"TINY_NEVER_HEALTHY": "1"}, timeout=2), log, port)
    with pytest.raises(ServerError) as info:
        wait_healthy(server)
    assert 2 <= time.monotonic() - t0 < 15
    message = info.value.one_line()
    assert str(log) in message and "did not become healthy" in message and "/health" in message
    assert server.proc.returncode is not None  # stopped, not left running


def test_a_server_that_exits_before_health_names_its_log(tmp_path: Path) -> None:
    log = tmp_path / "crash.log"
    argv = [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"]
    with pytest.raises(ServerError) as info:
        launch(_spec(free_port(), argv=argv), log)
    assert "exited (code 3) before it became healthy" in info.value.one_line() and str(log) in info.value.one_line()
    assert "boom: bad flag" in log.read_text()


def test_a_server_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    server = start(_spec(1, argv=[sys.executable, "-c", code]), tmp_path / "stubborn.log")
    time.sleep(0.5)
    t0 = time.monotonic()
    returncode = server.stop()
    assert returncode == -signal.SIGKILL and 1.5 <= time.monotonic() - t0 < 10


def test_a_trials_probe_seconds_leave_out_the_servers_stop(tiny_manifest: Any, tmp_path: Path) -> None:
    """The server takes 2 s to exit after SIGTERM (a graceful shutdown): the trial's wall time holds them, its
    probe seconds do not (they once did, and an engine's stop read as probe time)."""
    manifest = load_manifest(tiny_manifest(["a"], [], env={"TINY_STOP_DELAY": "2"}))
    oracle = ServerOracle(manifest.target, manifest.patches, manifest.probe)
    t0 = time.monotonic()
    try:
        m = oracle.measure(TrialRequest(("a",), 0, tmp_path / "w", "t"), 1)
    finally:
        oracle.close()
    wall = time.monotonic() - t0
    assert m.figures["metric"] == 0.0
    assert m.launch_s + m.probe_s <= wall - 1.9, (m.launch_s, m.probe_s, wall)
