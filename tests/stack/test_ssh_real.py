"""inspect/init's --ssh against a REAL sshd: one started here on 127.0.0.1 with keys generated into tmp_path.

The client never touches ~/.ssh: a wrapper `ssh` first on PATH (the code finds ssh with shutil.which) adds
`-F CONFIG`, and CONFIG names the port, the generated identity and a known_hosts holding the generated host key
(StrictHostKeyChecking yes). The reading over ssh must equal the local reading of the same process."""

from __future__ import annotations

import json
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

from _serving import serving
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


def _serves(skip: int, mark: bytes) -> list[int]:
    """The pids of every `speedtrap serve` alive on this machine carrying ``mark`` in its environment, but ``skip``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == skip:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            marked = mark in (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"speedtrap" in argv and b"serve" in argv and state != "Z" and marked:
            out.append(int(entry.name))
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_manifest_init_wrote_over_ssh_launches_there_and_names_the_culprit(sshd: str, tmp_path: Path) -> None:
    """init --ssh on a serve running the demo's culprit (``--set apply_routed_scaling_factor_on_output=true``), then
    bisect on that manifest as written: every trial's server is started through the test's sshd, probed at the
    address ssh resolves the alias to, and gone after the hunt. Ground truth by construction (the demo's patch)."""
    mark = f"SPEEDTRAP_TEST_SSH={tmp_path.name}-{os.getpid()}"  # carried into every trial's server by the manifest
    env = dict(os.environ, OMP_NUM_THREADS="1", SPEEDTRAP_TEST_SSH=mark.split("=", 1)[1])
    manifest = tmp_path / "speedtrap.toml"
    with serving(tmp_path, env, "--set", "apply_routed_scaling_factor_on_output=true") as (proc, _port):
        time.sleep(2)
        result = CliRunner().invoke(app, ["init", "--pid", str(proc.pid), "--ssh", sshd, "--out", str(manifest)])
        assert result.exit_code == 0, result.output
    text = manifest.read_text()
    assert '"http://127.0.0.1:{port}/health"' in text, text  # the alias resolved by ssh -G, not the alias
    assert mark.split("=", 1)[1] in text, text
    run = [sys.executable, "-m", "speedtrap", "bisect", "--manifest", str(manifest), "--run-dir", str(tmp_path / "r")]
    done = subprocess.run([*run, "--json"], capture_output=True, text=True, check=False, timeout=800)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result_json = json.loads(done.stdout)
    culprits = [tuple(c["patches"]) if isinstance(c, dict) else tuple(c) for c in result_json["culprits"]]
    assert culprits == [("apply_routed_scaling_factor_on_output_true",)], result_json
    launched = list((tmp_path / "r").rglob("*.log"))
    assert launched, "no trial log"
    deadline = time.monotonic() + 30
    while _serves(proc.pid, mark.encode()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _serves(proc.pid, mark.encode()) == [], "a trial's server is still alive after the hunt"
