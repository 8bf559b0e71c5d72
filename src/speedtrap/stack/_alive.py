"""One stack alive: the guard every launch of every stage goes through (isolate's trials and its recording, the CI
gate, live localize, the run's evidence stage, a Ray worker's trials).

A run may hold at most ``slots`` stacks alive at once (a stack: one server, or every role of a stack of roles):
1 unless it asked for more (``search.parallel`` trials on threads, a ``reference = "live"`` server beside them).
:meth:`StackGuard.take` takes a slot before anything of a launch exists, and the stack gives it back once its
processes have stopped. A launch that finds no free slot is a bug of speedtrap (a stage launching while an
earlier stage's stack is still up: on a GPU node a second copy of the model does not fit), so it raises
:class:`SecondStack` naming the stack that holds the slot, and launches nothing.

Slots are lock files (``flock``) in ``$TMPDIR/speedtrap-stacks-UID/SCOPE/``: the kernel releases one when its
holder dies however it dies (a killed run never blocks the next), and every process of one scope on one node
sees the others' slots. The scope is the run: ``SPEEDTRAP_STACK_SCOPE`` when set, else this process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

SCOPE_ENV = "SPEEDTRAP_STACK_SCOPE"
_SLOT = re.compile(r"slot-(\d+)\.lock")


class SecondStack(RuntimeError):
    """A launch while the run's slots are all held: a bug (a stage launched before the previous one's stack
    stopped), never bad input, so it is no SpeedtrapError and ends the run with its traceback."""


def guard_root() -> Path:
    return Path(tempfile.gettempdir()) / f"speedtrap-stacks-{os.getuid()}"


def default_scope() -> str:
    return os.environ.get(SCOPE_ENV) or f"pid-{os.getpid()}"


class Slot:
    """A held slot: the open, locked file. :meth:`release` (idempotent) removes the file and unlocks it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def note(self, text: str) -> None:
        """Say in the slot's file who holds it (read by a refused launch's error and by ``alive``)."""
        if self._fd is not None:
            os.write(self._fd, f"{text}\n".encode())

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()  # while locked: a process that opened it meanwhile sees a stale inode and retries
        os.close(self._fd)
        self._fd = None
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()  # the scope's folder, once its last slot is gone


class StackGuard:
    """At most ``slots`` stacks of one scope alive at once on this node."""

    def __init__(self, slots: int = 1, scope: str | None = None, root: Path | None = None) -> None:
        if slots < 1:
            raise ValueError(f"a guard holds at least one stack, not {slots}")
        self.slots = slots
        self.scope = scope or default_scope()
        self.folder = (root or guard_root()) / re.sub(r"[^A-Za-z0-9_.-]", "_", self.scope)

    def take(self, what: str) -> Slot:
        """A free slot for the stack ``what`` (its role or label and its log), or :class:`SecondStack`."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for i in range(self.slots):
            slot = _lock(self.folder / f"slot-{i}.lock")
            if slot is None:
                continue
            others = [p for p in self._held() if p != slot.path]
            if len(others) + 1 > self.slots:  # a launcher allowing fewer stacks than one already running holds
                slot.release()
                break
            slot.note(f"pid {os.getpid()}: {what}")
            return slot
        holders = "; ".join(_holder(p) for p in self._held()) or "another launch of this run"
        allowed = "one stack" if self.slots == 1 else f"{self.slots} stacks"
        raise SecondStack(
            f"refused to launch {what}: this run already has {allowed} alive on this node ({holders}); "
            "a stage must stop its stack before the next one launches"
        )

    def alive(self) -> list[str]:
        """What holds each slot of this scope now (``pid N: what``)."""
        return [_holder(p) for p in self._held()]

    def _held(self) -> Iterator[Path]:
        try:
            paths = sorted(p for p in self.folder.iterdir() if _SLOT.fullmatch(p.name))
        except OSError:
            return
        for path in paths:
            if _is_locked(path):
                yield path


def _lock(path: Path) -> Slot | None:
    """The slot at ``path`` locked by this call, or None when another holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except OSError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            return Slot(path, fd)
        os.close(fd)  # its holder removed it while we opened it: take the new file instead


def _is_locked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _holder(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip() or "a launch starting"
    except OSError:
        return "a launch that just ended"


__all__ = ["SCOPE_ENV", "SecondStack", "Slot", "StackGuard", "default_scope", "guard_root"]
