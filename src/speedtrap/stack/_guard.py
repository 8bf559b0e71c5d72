"""The launch guard: runs one server and takes it down when the process that launched it dies.

``python _guard.py STOP_TIMEOUT ARGV...`` (run by path, so it imports nothing of speedtrap). The guard
leads its own session; the server is its child in the same process group. Its stdin is a pipe whose
write end only the launching process holds: when that process ends, however it ends (SIGKILL, the
OOM killer, a Ray worker killed from outside), the kernel closes the pipe, the guard reads EOF and
sends SIGTERM to the whole group, then SIGKILL after STOP_TIMEOUT seconds. A pipe, not a
parent-death signal: ``PR_SET_PDEATHSIG`` fires when the launching *thread* exits, and trials run on
threads that end before the run does.

While the launcher lives, the guard is transparent: it exits with the server's exit code (or dies of
the server's signal), so the launcher reads the server's fate from the guard's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time


def _take_down_group(stop_timeout: float, child: subprocess.Popen[bytes]) -> None:
    """The launcher is gone: SIGTERM to the group, SIGKILL (the guard included) once the time is up.

    The guard's own SIGTERM handler (set in ``main``) does nothing, so the SIGTERM does not end it early.
    """
    try:
        os.killpg(0, signal.SIGTERM)
        child.wait(stop_timeout)
    except (subprocess.TimeoutExpired, OSError):
        pass
    os.killpg(0, signal.SIGKILL)  # forked workers too; this ends the guard as well


def _watch_launcher(stop_timeout: float, child: subprocess.Popen[bytes], orphaned: threading.Event) -> None:
    while os.read(0, 4096):  # the launcher writes nothing; EOF means it is gone
        pass
    orphaned.set()
    _take_down_group(stop_timeout, child)


def main(argv: list[str]) -> int:
    stop_timeout = float(argv[0])
    if os.getpgid(0) != os.getpid():  # the group the guard takes down must be its own, never its caller's
        os.setsid()
    # The launcher's SIGTERM to the group is meant for the server: the guard outlives it to report.
    # (Handlers, unlike ignored signals, are reset in the server when it starts.)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    try:
        child = subprocess.Popen(argv[1:], stdin=subprocess.DEVNULL)  # noqa: S603  (argv list, no shell)
    except OSError as exc:
        print(f"speedtrap guard: cannot start {argv[1]!r}: {exc}", flush=True)
        return 127
    print(f"speedtrap guard: server pid {child.pid}", flush=True)
    orphaned = threading.Event()
    watcher = threading.Thread(target=_watch_launcher, args=(stop_timeout, child, orphaned), daemon=True)
    watcher.start()
    code = child.wait()
    if orphaned.is_set():  # the watcher is taking the group down: let it finish (it ends the guard)
        watcher.join()
    if code < 0:  # die of the same signal, so the launcher sees what the server saw
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # these two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
