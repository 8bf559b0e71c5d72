"""The vLLM PD example (examples/vllm-pd/) with each role on a node of a local multi-node Ray cluster.

Shared by tests/vllm/test_vllm_pd_ray.py and benchmarks/bench_ray_nodes.py:

- :func:`placed_manifest`: the example's manifest with a ``node`` label per role, every role listening on its
  node's address (``--host 0.0.0.0``), the router's upstreams at ``{prefill.host}`` / ``{decode.host}``, health
  at ``{host}``, a marker in the target's environment (the watchers' filter) and ``SPEEDTRAP_TEST_ROLE = NAME``
  in each role's (which process is which role: the test's ground truth, read from /proc).
- :func:`local_cluster` (from tests/_ray_cluster.py): a head of 1 CPU (``speedtrap=head``) and two nodes of 2
  CPUs (``speedtrap=a|b``), each a raylet of its own on this machine.
- :class:`RoleScan`: every process carrying the marker, seen every 0.2 s: its role and the node it runs on (the
  raylet its ancestry in /proc leads to; ``None`` for a process this machine's driver launched itself).
"""

from __future__ import annotations

import re
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "isolate"))
from _toml_text import toml_text  # noqa: E402

from _ray_cluster import local_cluster, raylets  # noqa: E402
from _watch import argv_of, parent_of  # noqa: E402

__all__ = ["local_cluster", "raylets"]  # shared with tests/isolate (tests/_ray_cluster.py), imported from here too

EXAMPLE = ROOT / "examples" / "vllm-pd" / "speedtrap.toml"
MARKER = "SPEEDTRAP_TEST_STACK"
ROLE_ENV = "SPEEDTRAP_TEST_ROLE"
TWO_NODES = {"prefill": "speedtrap=a", "decode": "speedtrap=b", "router": "speedtrap=head"}
ONE_NODE = {"prefill": "speedtrap=a", "decode": "speedtrap=a", "router": "speedtrap=head"}
_UPSTREAM = re.compile(r"http://127\.0\.0\.1:\{(\w+)\.port\}")


def placed_manifest(folder: Path, where: dict[str, str], marker: str, retries: int | None = None) -> Path:
    """The example's manifest with each role on the node ``where`` names (written into ``folder``)."""
    raw: dict[str, Any] = tomllib.loads(EXAMPLE.read_text())
    patches = raw.pop("patches")
    target = raw.pop("target")
    roles: dict[str, dict[str, Any]] = target.pop("roles")
    target["model"] = str(ROOT / ".vllm-model")
    target["cwd"] = str(ROOT)
    target["env"] = {**target.get("env", {}), MARKER: marker}
    if retries is not None:
        target["retries"] = retries
    tables: dict[str, dict[str, Any]] = {"target": target}
    for name, role in roles.items():
        argv = [
            "0.0.0.0" if a == "127.0.0.1" else _UPSTREAM.sub(r"http://{\1.host}:{\1.port}", a) for a in role["launch"]
        ]
        if "--host" not in argv:
            argv += ["--host", "0.0.0.0"]  # the router (proxy.py)
        role["launch"] = argv
        role["node"] = where[name]
        role["health"] = "http://{host}:{port}/health"
        role["env"] = {**role.get("env", {}), ROLE_ENV: name}
        tables[f"target.roles.{name}"] = role
    tables.update(raw)
    path = folder / "speedtrap.toml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(toml_text(tables, patches))
    return path


def node_ids(cluster: Any) -> dict[str, str]:
    """Each node's ``speedtrap`` label -> its Ray node id."""
    import ray

    return {n.get("Labels", {}).get("speedtrap"): n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = (Path("/proc") / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


@dataclass
class Seen:
    pid: int
    role: str  # its SPEEDTRAP_TEST_ROLE ("" for none)
    node: str | None  # the node label (None: launched by this machine's driver, not on a Ray node)
    leader: bool  # a role's own process (the vLLM API server, the router): the launch guard's child
    started: str  # its start time in clock ticks (/proc/PID/stat): a pid reused later is another process


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first; start time at index 19); [] if gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _guarded(pid: int) -> bool:
    return any(a.endswith(b"_guard.py") for a in argv_of(parent_of(pid)) or [])


class RoleScan:
    """Every process whose environment holds ``MARKER=marker``, with its role and node, seen every 0.2 s."""

    def __init__(self, marker: str, raylet_pids: dict[int, str]) -> None:
        self.entry = f"{MARKER}={marker}".encode()
        self.raylets = raylet_pids
        self.seen: dict[int, Seen] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()

    def _node(self, pid: int) -> str | None:
        while pid > 1:
            if pid in self.raylets:
                return self.raylets[pid]
            pid = parent_of(pid)
        return None

    def alive(self) -> list[int]:
        """The marked processes alive now."""
        out = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if self.entry in (proc / "environ").read_bytes().split(b"\0"):
                    out.append(int(proc.name))
            except OSError:
                continue
        return out

    def scan(self) -> None:
        for pid in self.alive():
            if pid in self.seen:
                continue
            stat = _stat(pid)
            if not stat:
                continue
            seen = Seen(pid, environ_of(pid).get(ROLE_ENV, ""), self._node(pid), _guarded(pid), stat[19])
            with self._lock:
                self.seen[pid] = seen

    def left(self) -> list[tuple[Seen, str]]:
        """Every process seen that still exists (the same one: its start time unchanged), with its state (Z: a
        zombie, not yet reaped) and its parent's pid and argv."""
        with self._lock:
            seen = list(self.seen.values())
        out = []
        for s in seen:
            stat = _stat(s.pid)
            if stat and stat[19] == s.started:
                parent = int(stat[1])
                shown = b" ".join(argv_of(parent) or [])[:80].decode(errors="replace")
                out.append((s, f"state {stat[0]}, parent {parent} ({shown})"))
        return out

    def settled(self, timeout: float = 30.0) -> list[tuple[Seen, str]]:
        """:meth:`left` once it is empty or ``timeout`` seconds have passed (a process killed a moment ago is a
        zombie until its parent, or init for an orphan, reaps it)."""
        deadline = time.monotonic() + timeout
        while (left := self.left()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def leaders(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen.values() if s.leader]

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.scan()

    def __enter__(self) -> RoleScan:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
