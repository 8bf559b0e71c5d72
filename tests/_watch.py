"""A server watcher for tests and benchmarks: ground truth from /proc on how many servers are alive at once.

    with ServerWatcher(argv_has(b"sglang.launch_server"), descends_from(os.getpid())) as watcher:
        ...  # the hunt
    assert watcher.most <= 1

A thread scans ``/proc`` every ``interval`` seconds and counts the processes that ``match`` (a test on the
argv, split at NUL bytes) and that are ``ours`` (launched by this test: a marker in the environment, or a
descendant of this process). Two kinds of process are never servers: speedtrap's launch guard (its argv holds
the server's after ``_guard.py``) and a matching process whose parent matches too (a worker forked by the
server, which keeps its parent's argv until it renames itself). It keeps the most alive at once, every
server pid seen alive (each one a launch), and the most of their ``--port`` ports listening at once (a server
that is alive but not yet, or no longer, listening does not count there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

Argv = list[bytes]


def argv_of(pid: int) -> Argv | None:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None


def parent_of(pid: int) -> int:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def argv_has(*words: bytes) -> Callable[[Argv], bool]:
    """Matches an argv that holds every one of ``words`` as a whole argument."""
    return lambda argv: all(w in argv for w in words)


def descends_from(root: int) -> Callable[[int], bool]:
    """A process below ``root`` in the process tree."""

    def ours(pid: int) -> bool:
        while pid > 1 and pid != root:
            pid = parent_of(pid)
        return pid == root

    return ours


def marked(name: str, value: str) -> Callable[[int], bool]:
    """A process whose environment holds ``name=value`` (set by the test; every process it launches inherits it)."""
    entry = f"{name}={value}".encode()

    def ours(pid: int) -> bool:
        try:
            return entry in (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            return False

    return ours


def listening_ports() -> set[int]:
    """The local TCP ports in the LISTEN state (IPv4 and IPv6), read off /proc/net."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def port_of(argv: Argv) -> int | None:
    """The value of a ``--port`` argument (None without one, or when it is not a number)."""
    if b"--port" in argv:
        i = argv.index(b"--port")
        if i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
    return None


def _guard(argv: Argv) -> bool:
    return any(a.endswith(b"_guard.py") for a in argv)


class ServerWatcher:
    """The most matching server processes alive at once (``most``), every server pid seen (``seen``), and the
    most of their ``--port`` ports listening at once (``most_listening``)."""

    def __init__(
        self,
        match: Callable[[Argv], bool],
        ours: Callable[[int], bool] | None = None,
        interval: float = 0.2,
    ) -> None:
        self.match = match
        self.ours = ours
        self.interval = interval
        self.most = 0
        self.most_listening = 0
        self.seen: set[int] = set()
        self.before: set[int] = set()  # servers alive when the watch began (another test's fixture): not counted
        self.crowd: dict[int, str] = {}  # the servers alive when ``most`` last rose above one: pid -> parent, argv
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def alive(self) -> list[int]:
        """The server pids alive now (ours only, when ``ours`` is given)."""
        return list(self._alive())

    def _alive(self) -> dict[int, Argv]:
        found: dict[int, Argv] = {}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                argv = argv_of(int(proc.name))
                if argv is not None and not _guard(argv) and self.match(argv):
                    found[int(proc.name)] = argv
        return {
            pid: argv
            for pid, argv in found.items()
            if parent_of(pid) not in found
            and (self.ours is None or self.ours(pid))  # a forked worker is no server
            and pid not in self.before
        }

    def count(self) -> int:
        return len(self.alive())

    def _run(self) -> None:
        while True:
            now = self._alive()
            if len(now) > max(self.most, 1):
                self.crowd = {
                    p: f"parent {parent_of(p)}: {b' '.join(a)[:200].decode(errors='replace')}" for p, a in now.items()
                }
            self.most = max(self.most, len(now))
            self.seen.update(now)
            ports = {port for port in map(port_of, now.values()) if port is not None}
            if ports:
                self.most_listening = max(self.most_listening, len(ports & listening_ports()))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> ServerWatcher:
        self.before = set(self._alive())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
