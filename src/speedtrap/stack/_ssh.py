"""One way to run a command on another host: the system ssh client, BatchMode, an argument list.

The remote side of /proc reads says what went wrong by exit status (3: no such process, 4: not
readable), never by the text of an error message."""

from __future__ import annotations

import shutil
import subprocess

from speedtrap._errors import UsageError

SSH_TIMEOUT_S = 30
_NO_PROCESS = 3
_NOT_READABLE = 4
# The /proc entries speedtrap reads over ssh: a fixed set, so no user string reaches the remote shell.
PROC_ENTRIES = frozenset({"cmdline", "environ", "status", "maps", "cwd"})


def ssh_run(host: str, argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run argv on host; a UsageError for no client, no answer in time, or ssh's own failure (exit 255)."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise UsageError("the ssh client is not installed", "install openssh-client, or run speedtrap on the host")
    full = [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S // 3}", "--", host, *argv]
    try:
        # An argument list, no local shell; callers pass only fixed words and ints to the remote one.
        proc = subprocess.run(full, capture_output=True, timeout=SSH_TIMEOUT_S, check=False)  # noqa: S603
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"ssh to {host} did not answer in {SSH_TIMEOUT_S} s", "check the host name and network"
        ) from None
    if proc.returncode == 255:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise UsageError(
            f"ssh to {host} failed: {err[-1] if err else 'exit 255'}",
            "check that `ssh HOST true` works without a password prompt (BatchMode)",
        )
    return proc


def proc_command(pid: int, what: str) -> list[str]:
    """The remote command that prints /proc/PID/WHAT (cwd: its target), exit 3 if gone, 4 if unreadable."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or what not in PROC_ENTRIES:
        raise ValueError(f"bad /proc read: pid {pid!r}, entry {what!r}")
    path = f"/proc/{pid}/{what}"
    read = f"exec readlink {path}" if what == "cwd" else f"exec cat {path}"
    return [f"test -e /proc/{pid} || exit {_NO_PROCESS}; test -r {path} || exit {_NOT_READABLE}; {read}"]


def ssh_proc(host: str, pid: int, what: str) -> bytes:
    """/proc/PID/WHAT on host (for cwd: the link's target), or a UsageError naming the pid and host."""
    proc = ssh_run(host, proc_command(pid, what))
    if proc.returncode == _NO_PROCESS:
        raise UsageError(f"no process with pid {pid} on {host}", "check the pid with `ssh HOST ps aux`")
    if proc.returncode == _NOT_READABLE:
        raise UsageError(
            f"cannot read /proc/{pid}/{what} on {host}: permission denied",
            "ssh as the user that runs the server, or as root",
        )
    if proc.returncode != 0:
        raise UsageError(
            f"reading /proc/{pid}/{what} on {host} failed (exit {proc.returncode})", "check the pid and the host"
        )
    return proc.stdout


def ssh_nproc(host: str) -> int:
    """The host's CPU count (nproc --all), 0 when it cannot tell."""
    proc = ssh_run(host, ["nproc", "--all"])
    text = proc.stdout.decode("utf-8", "replace").strip()
    return int(text) if proc.returncode == 0 and text.isdigit() else 0


def ssh_hostname(host: str) -> str:
    """The host name ssh connects to for ``host`` (``ssh -G``: an alias of the ssh config resolved, a
    ``user@`` dropped), the name a URL to that host's servers must use; ``host`` itself when ssh cannot say."""
    ssh = shutil.which("ssh")
    bare = host.rsplit("@", 1)[-1]
    if ssh is None:
        return bare
    try:
        # ssh -G prints the configuration it would use and connects to nothing.
        done = subprocess.run([ssh, "-G", "--", host], capture_output=True, text=True, timeout=10, check=False)  # noqa: S603
    except subprocess.TimeoutExpired:
        return bare
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return bare
