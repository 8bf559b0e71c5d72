"""No orphans: a server speedtrap launched dies with the process that owns it, however that process dies.

The tiny server runs with ``TINY_STAY`` (it does not watch its parent, like SGLang's or vLLM's servers)
and a probe that takes a minute, so the owner is killed with SIGKILL mid-trial, its server up. Ground
truth is the kernel's: the server's pid is gone (or a zombie) and its port refuses connections.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

PATCHES = ["p0", "p1", "p2", "p3"]
FAILS = [{"all": ["p2"]}]


def _state(pid: int) -> str | None:
    """The process state letter from /proc (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _gone(pid: int) -> bool:
    return _state(pid) in (None, "Z", "X")


def _refuses(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _servers(pids_file: Path) -> list[tuple[int, int]]:
    if not pids_file.exists():
        return []
    rows = [line.split() for line in pids_file.read_text().splitlines() if line.strip()]
    return [(int(pid), int(port)) for pid, port in rows]


def _wait_for_servers(pids_file: Path, count: int, owner: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        servers = _servers(pids_file)
        if len(servers) >= count and all(not _refuses(port) for _, port in servers):
            return
        assert owner.poll() is None, f"the owner exited early with {owner.returncode}"
        time.sleep(0.2)
    raise AssertionError(f"{count} server(s) did not come up within {timeout:g} s: {_servers(pids_file)}")


def _wait_gone(servers: list[tuple[int, int]], timeout: float = 20) -> list[tuple[int, int]]:
    """The servers still running (pid alive or port answering) after ``timeout``."""
    deadline = time.monotonic() + timeout
    left = servers
    while time.monotonic() < deadline:
        left = [(pid, port) for pid, port in servers if not _gone(pid) or not _refuses(port)]
        if not left:
            break
        time.sleep(0.2)
    return left


@pytest.fixture
def owned(tmp_path: Path) -> Iterator[Callable[[list[str]], subprocess.Popen[bytes]]]:
    """Start ``speedtrap bisect`` as the owner; afterwards kill whatever the test left (old code's orphans)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(tmp_path / "owner.log", "ab")  # noqa: SIM115  (closed with the process)
        proc = subprocess.Popen(
            [sys.executable, "-m", "speedtrap", "bisect", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    for pid, _ in _servers(tmp_path / "pids.txt"):  # a failing test still leaves nothing running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stubborn_manifest(tiny_manifest: Callable[..., Path], tmp_path: Path) -> Path:
    env = {"TINY_STAY": "1", "TINY_PIDS": str(tmp_path / "pids.txt"), "TINY_PROBE_DELAY": "25"}
    return tiny_manifest(PATCHES, FAILS, env=env)


@pytest.mark.parametrize("workers", [1, 2], ids=["local", "threads"])
def test_sigkill_of_the_owner_leaves_no_server_running(
    tiny_manifest: Callable[..., Path], tmp_path: Path, owned: Callable[[list[str]], Any], workers: int
) -> None:
    manifest = _stubborn_manifest(tiny_manifest, tmp_path)
    owner = owned(["--manifest", str(manifest), "--run-dir", str(tmp_path / "run"), "--workers", str(workers)])
    _wait_for_servers(tmp_path / "pids.txt", workers, owner)
    servers = _servers(tmp_path / "pids.txt")
    os.kill(owner.pid, signal.SIGKILL)  # the owner alone: its servers sit in other sessions
    owner.wait(10)
    assert _wait_gone(servers) == [], "servers outlived the process that launched them"


@pytest.mark.slow
def test_sigkill_of_a_ray_worker_leaves_no_server_running(
    tiny_manifest: Callable[..., Path], tmp_path: Path, owned: Callable[[list[str]], Any]
) -> None:
    ray = pytest.importorskip("ray", reason="needs `pip install 'speedtrap[ray]'`")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        cluster.add_node(num_cpus=1)
        manifest = _stubborn_manifest(tiny_manifest, tmp_path)
        argv = ["--manifest", str(manifest), "--run-dir", str(tmp_path / "run"), "--executor", "ray"]
        owner = owned([*argv, "--address", cluster.address])
        _wait_for_servers(tmp_path / "pids.txt", 1, owner, timeout=180)
        [(pid, port)] = _servers(tmp_path / "pids.txt")
        worker = pid
        while worker > 1 and not Path(f"/proc/{worker}/cmdline").read_bytes().startswith(b"ray::"):
            worker = _parent(worker)
        assert worker > 1, "the server's Ray worker was not found among its ancestors"
        os.kill(worker, signal.SIGKILL)  # the worker, from outside; the driver lives on
        assert _wait_gone([(pid, port)]) == [], "the killed worker's server is still running"
        os.killpg(owner.pid, signal.SIGKILL)  # then the driver: Ray ends its workers, the guard their servers
        owner.wait(10)
        assert _wait_gone(_servers(tmp_path / "pids.txt"), timeout=60) == []
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.shutdown()
