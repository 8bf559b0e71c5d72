"""The shared server watcher (tests/_watch.py): launch guards and forked workers are not servers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from _watch import ServerWatcher, argv_has, descends_from, marked

CODE = "import os, time; os.fork(); time.sleep(0.4)"  # a server that forks a worker (same argv)
SERVER = ["-c", CODE, "-m", "fake_engine.launch_server"]


def test_counts_servers_not_guards_or_forked_workers(tmp_path: Path) -> None:
    guard = tmp_path / "_guard.py"  # like speedtrap's launch guard: its argv holds the server's
    guard.write_text("import subprocess, sys\nsys.exit(subprocess.call(sys.argv[1:]))\n")
    match = argv_has(b"-m", b"fake_engine.launch_server")
    with ServerWatcher(match, descends_from(os.getpid()), interval=0.05) as watcher:
        subprocess.run([sys.executable, str(guard), sys.executable, *SERVER], check=True)
        second = subprocess.Popen([sys.executable, *SERVER])
        time.sleep(0.2)
        assert watcher.count() == 1
        second.wait()
    assert watcher.most == 1
    assert len(watcher.seen) == 2


def test_a_server_alive_before_the_watch_is_not_counted() -> None:
    """A server another test's fixture left running (a session-scoped one) is not the watched run's."""
    match = argv_has(b"-m", b"fake_engine.launch_server")
    old = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)", "-m", "fake_engine.launch_server"])
    try:
        time.sleep(0.2)
        with ServerWatcher(match, descends_from(os.getpid()), interval=0.05) as watcher:
            subprocess.run([sys.executable, *SERVER], check=True)
        assert watcher.most == 1 and len(watcher.seen) == 1
        with ServerWatcher(match, descends_from(os.getpid()), interval=0.05) as unfiltered:
            pass
        assert old.pid in unfiltered.before
    finally:
        old.kill()
        old.wait()


def test_two_at_once_and_the_marker() -> None:
    env = {**os.environ, "WATCH_TEST": "x"}
    with ServerWatcher(argv_has(b"fake_engine.launch_server"), marked("WATCH_TEST", "x"), interval=0.05) as w:
        procs = [subprocess.Popen([sys.executable, *SERVER], env=env) for _ in range(2)]
        unmarked = subprocess.Popen([sys.executable, *SERVER])
        for p in [*procs, unmarked]:
            p.wait()
    assert w.most == 2


LISTEN = (
    "import socket, sys, time; time.sleep(0.3); s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[-1]))); "
    "s.listen(); time.sleep(0.6)"
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_listening_counts_only_servers_whose_port_is_open() -> None:
    """Two servers alive at once, one of which never opens its ``--port``: most 2, most listening 1."""
    quiet = [sys.executable, "-c", "import time; time.sleep(1.0)", "-m", "fake_engine.serve", "--port"]
    loud = [sys.executable, "-c", LISTEN, "-m", "fake_engine.serve", "--port"]
    with ServerWatcher(argv_has(b"fake_engine.serve"), descends_from(os.getpid()), interval=0.05) as w:
        procs = [subprocess.Popen([*quiet, str(_free_port())]), subprocess.Popen([*loud, str(_free_port())])]
        for p in procs:
            p.wait()
    assert w.most == 2
    assert w.most_listening == 1
