"""The remote /proc read says what went wrong by exit status: run here through a stand-in `ssh` that runs
the remote command with sh (the same command a real sshd hands to the user's shell)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from speedtrap._errors import UsageError
from speedtrap.stack._ssh import proc_command, ssh_proc


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_remote_command_exit_status() -> None:
    assert subprocess.run(["sh", "-c", *proc_command(_gone_pid(), "cmdline")], check=False).returncode == 3
    done = subprocess.run(["sh", "-c", *proc_command(os.getpid(), "cmdline")], capture_output=True, check=False)
    assert done.returncode == 0 and done.stdout == Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    cwd = subprocess.run(["sh", "-c", *proc_command(os.getpid(), "cwd")], capture_output=True, check=False)
    assert cwd.stdout.decode().strip() == os.readlink(f"/proc/{os.getpid()}/cwd")


def test_only_fixed_entries_and_int_pids() -> None:
    with pytest.raises(ValueError):
        proc_command(1, "cmdline; touch /tmp/x")
    with pytest.raises(ValueError):
        proc_command("1; true", "cmdline")  # type: ignore[arg-type]


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text('#!/bin/sh\nfor last; do :; done\nexec sh -c "$last"\n')
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.usefixtures("fake_ssh")
def test_ssh_proc_maps_exit_status_to_one_line() -> None:
    assert ssh_proc("h", os.getpid(), "cmdline") == Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    with pytest.raises(UsageError, match="no process with pid"):
        ssh_proc("h", _gone_pid(), "environ")
    if os.geteuid() != 0:  # root reads every environ: the unreadable case needs another user
        with pytest.raises(UsageError, match="permission denied"):
            ssh_proc("h", 1, "environ")
