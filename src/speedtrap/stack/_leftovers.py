"""What a stopped server leaves behind besides processes: shared-memory segments and IPC socket files.

A server killed (or one that exits without cleaning up: SGLang at TP 2 leaves 24 MiB in ``/dev/shm`` a run,
vLLM two 4 MiB files) keeps its ``/dev/shm`` files and its Unix socket files (ZMQ's ``ipc://`` endpoints)
on the node. Which ones are the stack's is read off its own processes while they live, never guessed from
names: the ``/dev/shm`` files they map or hold open (``/proc/PID/maps``, ``/proc/PID/fd``) and the paths of the
Unix sockets they hold (their ``socket:[INODE]`` fds, looked up in ``/proc/net/unix``). After the stop, those
that still exist are removed, when they did not exist before the server started (:func:`existing`): a file
another program made and the stack only used (Ray's object store, say) is never removed, nor another stack's.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

_SHM = "/dev/shm/"


def group_pids(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (a guard's group: the server and its workers); a zombie,
    which holds nothing but its exit status, is not one."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _unix_paths() -> dict[str, str]:
    """inode -> path of the bound Unix sockets of this node (abstract ones have no path and are left out)."""
    out = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith("/"):
                out[fields[6]] = fields[7]
    return out


def held_files(pids: list[int]) -> set[str]:
    """The ``/dev/shm`` files and Unix socket paths the processes ``pids`` map or hold open now."""
    shm: set[str] = set()
    sockets: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
                if path.startswith(_SHM):
                    shm.add(path.removesuffix(" (deleted)"))
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith(_SHM):
                        shm.add(target.removesuffix(" (deleted)"))
                    elif target.startswith("socket:["):
                        sockets.add(target[len("socket:[") : -1])
    paths = _unix_paths() if sockets else {}
    return shm | {paths[i] for i in sockets if i in paths}


def existing() -> set[str]:
    """The ``/dev/shm`` files and bound Unix socket paths of this node now (before a launch)."""
    out: set[str] = set(_unix_paths().values())
    with contextlib.suppress(OSError):
        out |= {_SHM + name for name in os.listdir(_SHM)}
    return out


def remove_left(paths: set[str], before: set[str]) -> list[str]:
    """Remove those of ``paths`` that still exist and were not there ``before`` (a file, never a folder)."""
    removed = []
    for path in sorted(paths - before):
        with contextlib.suppress(OSError):
            if not os.path.isdir(path):
                os.unlink(path)
                removed.append(path)
    return removed


__all__ = ["existing", "group_pids", "held_files", "remove_left"]


def wait_group_gone(pgid: int, timeout: float) -> list[int]:
    """Wait until no live process of group ``pgid`` is left (a SIGKILLed process dies asynchronously, and a
    big one takes a moment to release its memory); returns those still there after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := group_pids(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left
