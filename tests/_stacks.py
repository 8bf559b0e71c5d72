"""Heavy test stacks (the vLLM venv, the SGLang venv) built once per machine, outside the clone.

A stack lives in ``$SPEEDTRAP_STACKS_DIR/<name>-<key>`` (default ``~/.cache/speedtrap/stacks``), where the key
hashes the stack's recipe (every input of its build: versions, requirement lists, patch texts, flags), the
CPU's feature flags (a native build made on an AVX-512 machine must not be reused on an AVX2 one) and the
Python version. A build runs under a file lock and writes a ready marker last, so a build cut short is redone
from scratch and two processes (two test sessions, a test and a benchmark) never build the same stack at once.
A fresh clone on the same machine finds the stack its recipe names; a changed recipe builds a new one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

READY = "speedtrap-ready"


def stacks_root() -> Path:
    configured = os.environ.get("SPEEDTRAP_STACKS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "speedtrap" / "stacks"


def cpu_flags() -> str:
    """The CPU's feature flags (sorted), or the machine name where /proc/cpuinfo has none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.machine()


def stack_key(recipe: str) -> str:
    text = "\n".join([recipe, cpu_flags(), sys.version.split()[0], platform.machine()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_stack_dir(name: str, recipe: str, build: Callable[[Path, Path], None]) -> Path:
    """The folder of stack ``name`` for ``recipe``, built by ``build(folder, log)`` on first use.

    ``build`` gets an empty folder and a log file; it raises on failure (the folder is then removed and the
    next call builds again).
    """
    root = stacks_root()
    folder = root / f"{name}-{stack_key(recipe)}"
    with locked(root / f"{folder.name}.lock"):
        if not (folder / READY).exists():
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            (folder / "recipe.txt").write_text(recipe)
            log = root / f"{folder.name}.build.log"
            start = time.monotonic()
            try:
                build(folder, log)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            (folder / READY).write_text(f"built in {time.monotonic() - start:.0f} s\n")
    return folder
