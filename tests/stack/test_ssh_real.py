"""inspect/init's --ssh against a REAL sshd: one started here on 127.0.0.1 with keys generated into tmp_path.

The client never touches ~/.ssh: a wrapper `ssh` first on PATH (the code finds ssh with shutil.which) adds
`-F CONFIG`, and CONFIG names the port, the generated identity and a known_hosts holding the generated host key
(StrictHostKeyChecking yes). The reading over ssh must equal the local reading of the same process."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtrap._errors import UsageError
from speedtrap.cli import app
from speedtrap.stack import free_port
from speedtrap.stack._inspect import read_process
from speedtrap.stack._procs import read_engine_process

SSHD = Path("/usr/sbin/sshd")
HOST = "speedtrap-test"

pytestmark = [
    pytest.mark.skipif(not SSHD.exists(), reason="no /usr/sbin/sshd (apt-get install openssh-server)"),
    pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test sshd logs in as root (key only)"),
]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@pytest.fixture
def sshd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    d = tmp_path / "ssh"
    d.mkdir()
    _keygen(d / "host_key")
    _keygen(d / "id")
    (d / "authorized_keys").write_text((d / "id.pub").read_text())
    port = free_port()
    config = d / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    server = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE)
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (d / "config").write_text(
        f"Host {HOST}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {d / 'id'}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
        "  GlobalKnownHostsFile /dev/null\n"
    )
    bin_dir = d / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {d / "config"} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    try:
        deadline = time.monotonic() + 20
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else "sshd exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "sshd did not listen in 20 s"
                time.sleep(0.1)
        yield HOST
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_TOKEN="hf_secret_value_for_redaction")
    argv = [sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", str(free_port()),
            "--threads", "1"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_reading_over_real_ssh_equals_local(sshd: str, serve: subprocess.Popen[bytes], tmp_path: Path) -> None:
    assert read_process(serve.pid, sshd) == read_process(serve.pid)
    local, remote = read_engine_process(serve.pid), read_engine_process(serve.pid, sshd)
    assert (remote.argv, remote.env, remote.cwd, remote.cpus, remote.engine) == (
        local.argv, local.env, local.cwd, local.cpus, local.engine)  # fmt: skip
    assert remote.host == sshd and local.engine.engine == "speedtrap"
    out_l = CliRunner().invoke(app, ["inspect", "--pid", str(serve.pid)])
    out_r = CliRunner().invoke(app, ["inspect", "--pid", str(serve.pid), "--ssh", sshd])
    assert out_l.exit_code == out_r.exit_code == 0, out_r.output
    assert "hf_secret_value_for_redaction" not in out_r.output and "HF_TOKEN" in out_r.output
    title = f"pid {serve.pid} on "  # the table's title names the host: the one line that differs
    shown = lambda text: [x for x in text.splitlines() if title not in x]  # noqa: E731
    assert shown(out_r.output) == shown(out_l.output)
    out = tmp_path / "speedtrap.toml"
    result = CliRunner().invoke(app, ["init", "--pid", str(serve.pid), "--ssh", sshd, "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "hf_secret_value_for_redaction" not in text and '"ssh"' in text and f'"{sshd}"' in text, text


def test_bad_pids_over_real_ssh(sshd: str, tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    result = CliRunner().invoke(app, ["inspect", "--pid", str(gone.pid), "--ssh", sshd])
    assert result.exit_code == 2 and f"no process with pid {gone.pid} on {sshd}" in result.output
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(UsageError, match=f"pid {sleeper.pid}"):
            read_engine_process(sleeper.pid, sshd)
        out = tmp_path / "speedtrap.toml"
        result = CliRunner().invoke(app, ["init", "--pid", str(sleeper.pid), "--ssh", sshd, "--out", str(out)])
        assert result.exit_code == 2 and str(sleeper.pid) in result.output and not out.exists(), result.output
    finally:
        sleeper.kill()
        sleeper.wait()
