"""A real ``speedtrap serve`` of smol-moe in a subprocess, for the tests that read a running server (init, ssh).

:func:`serving` starts it on a free port with one torch thread and the given extra arguments, waits until its
``/health`` answers (or it exits, or 300 s pass: the test fails saying so), yields the process and its port,
and kills it at the end.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from speedtrap.stack import free_port


@contextmanager
def serving(cwd: Path, env: Mapping[str, str], *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    argv = [sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", str(port), "--threads", "1",
            *extra]  # fmt: skip
    proc = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "speedtrap serve did not start"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                time.sleep(1)
        yield proc, port
    finally:
        proc.kill()
        proc.wait()
