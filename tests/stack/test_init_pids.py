"""``speedtrap init --pid``: real processes started here (a stand-in engine whose package sits in a git checkout,
started as SGLang's prefill, decode and router), read from /proc, written as a manifest that launches unedited.

Ground truth by construction: the test starts the processes with known flags, variables and a checkout two commits
past its base; the manifest's stack is then launched by speedtrap's own launcher with every patch on, and with
none, and each role reports the argv, variables and source tree it got.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.manifest import load_manifest
from speedtrap.stack import Launcher, free_port

HERE = Path(__file__).resolve().parent
SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}  # fmt: skip
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


def make_checkout(root: Path) -> tuple[Path, Path, dict[str, str]]:
    """``root/src``: a git checkout holding the stand-in ``sglang`` package (base, then two commits), and
    ``root/site``: the router's package, outside the checkout (as pip's --target folder holds it)."""
    repo, site = root / "src", root / "site"
    (repo / "sglang").mkdir(parents=True)
    shutil.copy(HERE / "fake_engine.py", repo / "sglang" / "_fake.py")
    (repo / "sglang" / "__init__.py").write_text('MARK = "base"\n')
    (repo / "sglang" / "launch_server.py").write_text("from sglang._fake import serve\n\nserve()\n")
    (site / "sglang_router").mkdir(parents=True)
    shutil.copy(HERE / "fake_engine.py", site / "sglang_router" / "_fake.py")
    (site / "sglang_router" / "__init__.py").write_text("")
    (site / "sglang_router" / "launch_router.py").write_text("from sglang_router._fake import serve\n\nserve()\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "sglang as released")
    shas = {"base": git(repo, "rev-parse", "HEAD")}
    (repo / "sglang" / "launch_server.py").write_text("# serve\nfrom sglang._fake import serve\n\nserve()\n")
    git(repo, "commit", "-q", "-am", "launch_server: a comment")
    shas["comment"] = git(repo, "rev-parse", "HEAD")
    (repo / "sglang" / "__init__.py").write_text('MARK = "fused"\n')
    git(repo, "commit", "-q", "-am", "glm4_fused_topk_scale")
    shas["fused"] = git(repo, "rev-parse", "HEAD")
    return repo, site, shas


def wait_up(port: int, path: str = "/health", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answers on port {port}")


def seen(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/seen", timeout=5) as r:
        data: dict[str, object] = json.loads(r.read())
    return data


class HandStack:
    """Prefill, decode and router started by hand (as a user would), each a real process."""

    def __init__(self, root: Path) -> None:
        self.repo, self.site, self.shas = make_checkout(root)
        self.model = root / "model"
        self.model.mkdir()
        self.ports = {"prefill": free_port(), "decode": free_port(), "router": free_port()}
        self.boot, self.nccl = free_port(), free_port()
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SPEEDTRAP_"))}
        env = {**base, "PYTHONPATH": f"{self.repo}{os.pathsep}{self.site}", "SGLANG_USE_CPU_ENGINE": "1"}
        py = sys.executable
        server = [
            py,
            "-m",
            "sglang.launch_server",
            "--model-path",
            "../model",
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
        ]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.procs["prefill"] = subprocess.Popen(
            [*server, "--port", str(self.ports["prefill"]), "--disaggregation-mode", "prefill",
             "--nccl-port", str(self.nccl), "--disaggregation-bootstrap-port", str(self.boot),
             "--chunked-prefill-size", "64", "--api-key", "s3cr3t"],
            env={**env, "SPEEDTRAP_FAKE_GATE": "1", "HF_TOKEN": SECRET}, cwd=self.repo,
        )  # fmt: skip
        self.procs["decode"] = subprocess.Popen(
            [*server, "--port", str(self.ports["decode"]), "--disaggregation-mode", "decode",
             "--disaggregation-bootstrap-port", str(self.boot), "--disable-radix-cache"],
            env=env, cwd=self.repo,
        )  # fmt: skip
        self.procs["router"] = subprocess.Popen(
            [py, "-m", "sglang_router.launch_router", "--pd-disaggregation",
             "--prefill", f"http://127.0.0.1:{self.ports['prefill']}", str(self.boot),
             "--decode", f"http://127.0.0.1:{self.ports['decode']}", "--host", "127.0.0.1",
             "--port", str(self.ports["router"])],
            env={**base, "PYTHONPATH": str(self.site)}, cwd=root,
        )  # fmt: skip
        for port in self.ports.values():
            wait_up(port)

    def pids(self) -> list[str]:
        return [a for role in ("router", "decode", "prefill") for a in ("--pid", str(self.procs[role].pid))]

    def stop(self) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait()


@pytest.fixture
def hand(tmp_path: Path) -> Iterator[HandStack]:
    stack = HandStack(tmp_path)
    try:
        yield stack
    finally:
        stack.stop()


def test_init_reads_a_pd_stack_and_the_manifest_launches_unedited(hand: HandStack, tmp_path: Path) -> None:
    out = tmp_path / "speedtrap.toml"
    got = CliRunner().invoke(app, ["init", *hand.pids(), "--since", "main~2", "--out", str(out), "--json"])
    assert got.exit_code == 0, got.output
    text = out.read_text()
    assert SECRET not in text and "s3cr3t" not in text and "HF_TOKEN" in text  # named as not copied, never valued
    assert "# TODO" not in text
    data = tomllib.loads(text)
    roles = data["target"]["roles"]
    assert list(roles) == ["prefill", "decode", "router"]
    assert roles["router"]["entry"] is True and roles["router"]["after"] == ["prefill", "decode"]
    assert roles["router"]["launch"][-6:] == ["--host", "127.0.0.1", "--port", "{port}", "--prometheus-port",
                                              "{port.prometheus}"]  # fmt: skip
    assert "http://127.0.0.1:{prefill.port}" in roles["router"]["launch"]
    assert "{prefill.port.bootstrap}" in roles["router"]["launch"]
    assert "{prefill.port.bootstrap}" in roles["decode"]["launch"]  # the prefill's port, named once
    assert roles["prefill"]["ports"] == ["nccl", "bootstrap"]
    assert data["target"]["model"] == str(hand.model) and roles["prefill"]["launch"].count("{model}") == 1
    assert data["target"]["repo"] == str(hand.repo) and data["target"]["base"] == hand.shas["base"]
    assert roles["prefill"]["env"]["SGLANG_USE_CPU_ENGINE"] == "1" and "env" not in roles["router"]
    manifest = load_manifest(out)  # the reader every stage uses
    names = [p.name for p in manifest.patches]
    assert names == [
        "launch_server_a_comment@prefill", "launch_server_a_comment@decode",
        "glm4_fused_topk_scale@prefill", "glm4_fused_topk_scale@decode",
        "chunked_prefill_size_64", "gate", "disable_radix_cache",
    ]  # fmt: skip
    by = {p.name: p for p in manifest.patches}
    assert by["chunked_prefill_size_64"].args == ("--chunked-prefill-size", "64")
    assert by["chunked_prefill_size_64"].roles == ("prefill",)
    assert by["gate"].env == (("SPEEDTRAP_FAKE_GATE", "1"),) and by["gate"].roles == ("prefill",)
    assert by["disable_radix_cache"].roles == ("decode",)

    # Launched by speedtrap's own launcher while the hand-started stack still runs: fresh ports, nothing clashes.
    launcher = Launcher(manifest.target, manifest.patches)
    try:
        for config, mark in (((), "base"), (tuple(names), "fused")):
            server, _ = launcher.start(config, tmp_path / f"trial{len(config)}.log")
            with server:
                pre, dec = (seen(server.launches[r].port) for r in ("prefill", "decode"))  # type: ignore[attr-defined]
                assert str(pre["imports"]).split()[0] == mark and str(hand.repo) not in str(pre["imports"])
                assert ("--chunked-prefill-size" in pre["argv"]) == bool(config)  # type: ignore[operator]
                assert ("SPEEDTRAP_FAKE_GATE" in pre["env"]) == bool(config)  # type: ignore[operator]
                assert ("--disable-radix-cache" in dec["argv"]) == bool(config)  # type: ignore[operator]
                assert "--chunked-prefill-size" not in dec["argv"]  # type: ignore[operator]
    finally:
        launcher.close()


def test_a_single_server_becomes_a_target_without_roles(hand: HandStack, tmp_path: Path) -> None:
    out = tmp_path / "one.toml"
    got = CliRunner().invoke(app, ["init", "--pid", str(hand.procs["decode"].pid), "--out", str(out)])
    assert got.exit_code == 0, got.output
    data = tomllib.loads(out.read_text())
    assert "roles" not in data["target"] and data["target"]["health"] == "http://127.0.0.1:{port}/health"
    assert "--port" in data["target"]["launch"] and "{port}" in data["target"]["launch"]
    assert [p["name"] for p in data["patches"]] == ["disable_radix_cache"]
    load_manifest(out)


def _bad(args: list[str], tmp_path: Path) -> str:
    out = tmp_path / "bad.toml"
    got = CliRunner().invoke(app, ["init", *args, "--out", str(out)])
    assert got.exit_code == 2, got.output
    assert not out.exists()  # nothing written
    assert "Traceback" not in got.output
    lines = [x for x in got.output.splitlines() if x.strip()]
    assert len(lines) == 1, got.output
    return lines[0]


def test_bad_input_is_one_line_and_nothing_written(hand: HandStack, tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert f"no process with pid {gone.pid}" in _bad(["--pid", str(gone.pid)], tmp_path)
    shell = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        line = _bad(["--pid", str(shell.pid)], tmp_path)
        assert f"pid {shell.pid}" in line and "is not an engine's server" in line
    finally:
        shell.kill()
        shell.wait()
    pid = str(hand.procs["prefill"].pid)
    line = _bad(["--pid", pid, "--since", "no-such-tag"], tmp_path)
    assert "'no-such-tag' is not a commit of" in line and str(hand.repo) in line
    line = _bad(["--pid", pid, "--range", "main~2..nope"], tmp_path)
    assert "'nope' is not a commit" in line
    line = _bad(["--pid", pid, "--pid", str(hand.procs["decode"].pid)], tmp_path)
    assert "none is a router" in line
    if shutil.which("ssh") is not None:  # a host that does not resolve: named, with the fix
        line = _bad(["--pid", pid, "--ssh", "no-such-host.invalid"], tmp_path)
        assert "ssh to no-such-host.invalid failed" in line and "BatchMode" in line


def test_environ_unreadable_names_the_pid(hand: HandStack, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start a process as another user")
    other = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                              "import time; time.sleep(30)"])  # fmt: skip
    folder = Path(tempfile.mkdtemp())  # the other user may write here (pytest's tmp_path is root's alone)
    folder.chmod(0o777)
    try:
        time.sleep(0.3)
        args = ["setpriv", "--reuid=1", "--regid=1", "--clear-groups", sys.executable, "-m", "speedtrap", "init",
                "--pid", str(other.pid), "--out", str(folder / "x.toml")]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
        can = subprocess.run([*args[:5], "-c", "import speedtrap.cli"], capture_output=True, env=env, cwd="/")
        if can.returncode != 0:  # a clone under a folder only root may enter (CI's mktemp -d)
            pytest.skip("another user cannot import speedtrap from this clone")
        done = subprocess.run(args, capture_output=True, text=True, env=env, cwd="/", check=False)
        assert done.returncode == 2, done.stderr
        assert f"/proc/{other.pid}/environ: permission denied" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not (folder / "x.toml").exists()
    finally:
        shutil.rmtree(folder)
        other.kill()
        other.wait()


def test_a_manifest_with_a_todo_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "todo.toml"
    path.write_text('# TODO target.model: the roles serve different models\n[target]\nlaunch = ["x", "{port}"]\n')
    got = CliRunner().invoke(app, ["run", "--manifest", str(path), "--out", str(tmp_path / "run")])
    assert got.exit_code == 2, got.output
    assert not (tmp_path / "run").exists()
    lines = [x for x in got.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "TODO target.model is not filled in" in lines[0], got.output


def _titled_python() -> str | None:
    """A Python with ``setproctitle`` (the SGLang stack's venv, built by the SGLang tests), or None."""
    root = Path(os.environ.get("SPEEDTRAP_STACKS_DIR", Path.home() / ".cache" / "speedtrap" / "stacks"))
    for python in sorted(root.glob("sglang-*/venv/bin/python")):
        done = subprocess.run([str(python), "-c", "import setproctitle"], capture_output=True, check=False)
        if done.returncode == 0:
            return str(python)
    return None


def test_a_router_that_renamed_itself_is_rebuilt_from_its_roles(hand: HandStack, tmp_path: Path) -> None:
    """sglang_router calls setproctitle("sglang::router"): /proc then holds neither its argv nor its environment."""
    titled = _titled_python()
    if titled is None:
        pytest.skip("no Python with setproctitle here (the SGLang stack's venv is built by the SGLang tests)")
    hand.procs["router"].kill()
    hand.procs["router"].wait()
    port = free_port()
    code = "import setproctitle; setproctitle.setproctitle('sglang::router')\n"
    code += "from sglang_router._fake import serve; serve()"
    hand.procs["router"] = subprocess.Popen([titled, "-c", code, "--port", str(port)],
                                            env={**os.environ, "PYTHONPATH": str(hand.site)})  # fmt: skip
    wait_up(port)
    assert Path(f"/proc/{hand.procs['router'].pid}/cmdline").read_bytes().rstrip(b"\0") == b"sglang::router"
    out = tmp_path / "renamed.toml"
    got = CliRunner().invoke(app, ["init", *hand.pids(), "--out", str(out)])
    assert got.exit_code == 0, got.output
    text = out.read_text()
    assert "renamed itself sglang::router" in text
    router = tomllib.loads(text)["target"]["roles"]["router"]
    assert router["launch"][1:] == [
        "-m", "sglang_router.launch_router", "--pd-disaggregation",
        "--prefill", "http://127.0.0.1:{prefill.port}", "{prefill.port.bootstrap}",
        "--decode", "http://127.0.0.1:{decode.port}", "--host", "127.0.0.1", "--port", "{port}",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", "{port.prometheus}",
    ]  # fmt: skip
    manifest = load_manifest(out)
    launcher = Launcher(manifest.target, manifest.patches)
    try:
        server, _ = launcher.start((), tmp_path / "renamed.log")
        with server:
            ports = {r: server.launches[r].port for r in ("prefill", "router")}  # type: ignore[attr-defined]
            argv = seen(ports["router"])["argv"]
            assert f"http://127.0.0.1:{ports['prefill']}" in argv  # type: ignore[operator]
    finally:
        launcher.close()
    # A worker of an SGLang server (its scheduler, its detokenizer) is named, with its parent.
    title = "import setproctitle, time; setproctitle.setproctitle('sglang::scheduler'); time.sleep(30)"
    worker = subprocess.Popen([titled, "-c", title])
    try:
        time.sleep(0.5)
        line = _bad(["--pid", str(worker.pid)], tmp_path)
        assert f"pid {worker.pid} is SGLang's scheduler process" in line and "ps -o ppid=" in line
    finally:
        worker.kill()
        worker.wait()
