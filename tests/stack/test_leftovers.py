"""After any stop, nothing of the stack is left: no process, no /dev/shm segment, no IPC socket file.

The server here does what SGLang and vLLM at TP 2 do (measured: SGLang 24 MiB in /dev/shm a run, vLLM two 4 MiB
files): it and a worker it forks create shared-memory files and a Unix socket file, keep them, and never remove
them. A file that existed before the launch and that the server only uses must survive. Ground truth: the file
system and /proc after the stop.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from pathlib import Path

from speedtrap.stack import LaunchSpec, launch

SERVER = r"""
import os, socket, sys, time, mmap
from http.server import BaseHTTPRequestHandler, HTTPServer
port, tag, sock_path, shared = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def segment(name):
    fd = os.open("/dev/shm/" + name, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    return mmap.mmap(fd, 4096)
keep = [segment(tag + "-server"), open(shared, "rb")]
if os.fork() == 0:  # a worker of the same group, with its own segment
    keep.append(segment(tag + "-worker"))
    time.sleep(600)
unix = socket.socket(socket.AF_UNIX); unix.bind(sock_path); unix.listen()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_a_stopped_server_leaves_no_process_no_shared_memory_and_no_socket(tmp_path: Path) -> None:
    from speedtrap.stack import free_port

    tag = f"speedtrap-test-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    shared = Path(f"/dev/shm/{tag}-before")  # made before the launch, used by the server: not its to remove
    shared.write_bytes(b"x")
    sock_path = tmp_path / "engine.sock"
    port = free_port()
    argv = (sys.executable, str(script), str(port), tag, str(sock_path), str(shared))
    spec = LaunchSpec(argv, dict(os.environ), f"http://127.0.0.1:{port}/health", 20.0, 5.0)
    try:
        server = launch(spec, tmp_path / "server.log", port)
        deadline = time.monotonic() + 10
        mine = [Path(f"/dev/shm/{tag}-server"), Path(f"/dev/shm/{tag}-worker")]
        while time.monotonic() < deadline and not all(p.exists() for p in mine):
            time.sleep(0.1)
        assert all(p.exists() for p in mine) and sock_path.exists()
        group = server.proc.pid
        server.stop()
        time.sleep(0.2)
        assert not any(p.exists() for p in mine), [str(p) for p in mine if p.exists()]
        assert not sock_path.exists()
        assert shared.exists()  # the file from before the launch stays
        assert sorted(server.removed) == sorted([*map(str, mine), str(sock_path)])
        left = [(d, _state(int(d))) for d in os.listdir("/proc") if d.isdigit() and _pgid(int(d)) == group]
        assert [d for d, state in left if state != "Z"] == [], left  # a zombie runs nothing (its parent is gone)
    finally:
        for p in Path("/dev/shm").glob(f"{tag}*"):
            p.unlink()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def _pgid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError):
        return -1


def test_a_socket_in_use_by_another_program_is_not_touched(tmp_path: Path) -> None:
    path = tmp_path / "other.sock"
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(path))
    from speedtrap.stack._leftovers import remove_left

    assert remove_left({str(path)}, {str(path)}) == [] and path.exists()  # there before: never removed
    other.close()
