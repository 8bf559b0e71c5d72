"""Start a server for one trial, wait for it to be healthy, stop it; its log is kept.

The command is an argv list run without a shell, in its own process group (so that SIGTERM and
then SIGKILL reach the workers a server forks), under a guard (``_guard.py``) that takes the group
down when this process dies, however it dies: no server outlives the run that launched it. Stdout
and stderr go to one log file per trial; every error names that file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from speedtrap._errors import ServerError
from speedtrap._redact import redact_argv
from speedtrap.stack._alive import Slot
from speedtrap.stack._diagnose import error_line
from speedtrap.stack._leftovers import existing, group_pids, held_files, remove_left, wait_group_gone

_POLL_S = 0.2
# Servers started by this process and not yet stopped: stop_all() ends them (a Ray worker told to
# close while its trial still runs). Not rebound; entries leave when a server stops.
_LIVE: set[Server] = set()
_GUARD = Path(__file__).with_name("_guard.py")


class CommandNotFound(ServerError):
    """The launch command cannot be executed at all: no trial can run, so the search stops."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def render(template: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Replace ``{name}`` placeholders literally (no format mini-language, so braces elsewhere survive)."""
    out = []
    for arg in template:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


@dataclass(frozen=True)
class LaunchSpec:
    """One server process: argv (placeholders already filled), its full environment, how to check it."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    health_url: str
    start_timeout: float = 120.0
    stop_timeout: float = 10.0
    cwd: Path | None = None
    where: str = "target.launch"  # the manifest key of the launch line (a role's: target.roles.NAME.launch)


class Server:
    """A running server process with its log; a context manager that always stops it."""

    def __init__(self, proc: subprocess.Popen[bytes], spec: LaunchSpec, log_path: Path, port: int = 0) -> None:
        self.proc = proc
        self.spec = spec
        self.log_path = log_path
        self.port = port
        self.started = time.monotonic()
        self.slot: Slot | None = None  # the launch guard's slot (``_alive``), given back once stopped
        self.node: str | None = None  # the Ray node it runs on, for a role placed there (None: this machine)
        self.before: set[str] = set()  # /dev/shm files and socket paths of the node before it started
        self.removed: list[str] = []  # what its stop removed: shared memory and sockets it left behind

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def died(self) -> ServerError | None:
        """A ServerError naming the exit code and the log if the process has exited, else None."""
        code = self.proc.poll()
        if code is None:
            return None
        how = f"signal {-code}" if code < 0 else f"code {code}"
        line = error_line(self.log_path)  # the engine's own last word (a crash on its first request, say)
        return ServerError(
            f"role {self.role!r} exited ({how}) during the trial{': ' + line if line else ''}; "
            f"read its log: {self.log_path}",
            "check the log; a crash that repeats for one configuration is reported as a failed trial",
            log=self.log_path,
        )

    @property
    def role(self) -> str:
        """The role this process runs: ``server`` for a target launched as one process."""
        where = self.spec.where
        return where.split(".")[2] if where.startswith("target.roles.") else "server"

    def stop(self) -> int | None:
        """SIGTERM to the process group, then SIGKILL after ``stop_timeout``; returns the exit code."""
        _LIVE.discard(self)
        held = held_files(group_pids(self.proc.pid))  # its shared memory and sockets, read while they live
        if self.proc.poll() is None:
            _signal_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(self.spec.stop_timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc, signal.SIGKILL)
                self.proc.wait(10)
        # Workers the server forked may outlive it; the group is ours, so make sure they are gone.
        _signal_group(self.proc, signal.SIGKILL)
        wait_group_gone(self.proc.pid, 10.0)  # one stack alive: the next launch waits for every process to be gone
        if self.proc.stdin is not None:  # the guard's lifeline: closed once the group is gone
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.removed += remove_left(held, self.before)
        if self.slot is not None:
            self.slot.release()
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def check_command(spec: LaunchSpec) -> None:
    """A CommandNotFound unless ``argv[0]`` names an executable file (the guard starts it, not us)."""
    program = spec.argv[0] if spec.argv else ""
    local = os.path.join(spec.cwd, program) if spec.cwd is not None and os.sep in program else program
    if shutil.which(local, path=spec.env.get("PATH", os.defpath)) is not None:
        return
    if os.sep in program and os.path.exists(local):
        raise CommandNotFound(f"{spec.where}[0]: {program!r} is not executable", "check the path and its permissions")
    raise CommandNotFound(
        f"{spec.where}[0]: command {program!r} not found", "give the full path of the server program, or install it"
    )


def start(spec: LaunchSpec, log_path: Path, port: int = 0) -> Server:
    """Start the process (no shell, own session, under the guard), logging to ``log_path``; does not wait."""
    check_command(spec)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    before = existing()
    guarded = [sys.executable, "-I", str(_GUARD), f"{spec.stop_timeout:g}", *spec.argv]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(redact_argv(spec.argv))}\n".encode())  # the log lands in run directories
        log.flush()
        try:
            proc = subprocess.Popen(  # noqa: S603  (argv list from the manifest, never a shell)
                guarded,
                env=dict(spec.env),
                cwd=spec.cwd,
                stdin=subprocess.PIPE,  # the guard's lifeline: EOF when this process ends
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise CommandNotFound(
                f"{spec.where}: cannot start {spec.argv[0]!r}: {exc}", "check the launch command"
            ) from None
    server = Server(proc, spec, log_path, port)
    server.before = before
    _LIVE.add(server)
    return server


def stop_all() -> None:
    """Stop every server this process started that is still running."""
    for server in list(_LIVE):
        server.stop()


def wait_healthy(server: Server) -> float:
    """Poll the health URL until it answers 200; returns the seconds it took. Stops the server on failure."""
    spec = server.spec
    deadline = time.monotonic() + spec.start_timeout
    last = "no answer yet"
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while True:
            died = server.died()
            if died is not None:
                code = server.proc.returncode
                server.stop()
                raise ServerError(
                    f"the server exited (code {code}) before it became healthy; read its log: {server.log_path}",
                    "fix the launch command or the patch's switches; the log says why it stopped",
                )
            try:
                response = client.get(spec.health_url)
                if response.status_code == 200:
                    return time.monotonic() - server.started
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            if time.monotonic() >= deadline:
                server.stop()
                raise ServerError(
                    f"the server did not become healthy at {spec.health_url} within {spec.start_timeout:g} s "
                    f"(last: {last}); read its log: {server.log_path}",
                    "check target.health and target.start_timeout, and the log",
                )
            time.sleep(_POLL_S)


def launch(spec: LaunchSpec, log_path: Path, port: int = 0) -> Server:
    """Start a server and wait until it is healthy (or raise a ServerError naming its log)."""
    server = start(spec, log_path, port)
    wait_healthy(server)
    return server
