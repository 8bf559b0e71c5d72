"""A tiny real HTTP server for isolate's tests: a "stack" whose breakage is set by its environment.

Patches are switched on by env vars ``TINY_P_<NAME>=1`` or by ``--with NAME`` arguments. ``TINY_FAILS``
is a JSON list of terms ``{"all": [...], "none": [...]}``; the stack is broken when one term holds.
GET /health (503 while ``TINY_NEVER_HEALTHY`` is set), GET /figures?repeat=R -> {"metric": ...},
GET /pid. ``TINY_LAUNCHES`` names a file that gets one line per launch (the configuration).
``TINY_DIE_ON=<name>``: with that patch on, the server SIGKILLs itself when asked for figures.
``TINY_NOISE=<sigma>``: the metric gets seeded Gaussian noise (seed: configuration and repeat).
The server exits when its parent process dies, so a killed test leaves nothing behind, unless
``TINY_STAY`` is set (a server like SGLang's or vLLM's, which outlives its parent). ``TINY_PIDS``
names a file that gets this server's pid, one line per launch.
Roles of a stack (``_roles``): ``TINY_ROLE`` names it; ``TINY_EVENTS`` names a file that gets
``ROLE start|ready TIME`` lines; ``TINY_START_DELAY`` seconds pass before it listens; ``TINY_UPSTREAM``
(comma-separated URLs): /figures reports the worst metric of this server and those; POST
/v1/completions answers one choice, or HTTP 500 with ``TINY_COMPLETIONS_500`` (healthy, yet broken);
``TINY_DIE_AFTER`` seconds after it listens, it exits with code 3; ``TINY_CHILD``: it starts a child
process with an empty environment (as a worker that rewrote its environment block shows in /proc).
Failures of a stack's role: ``TINY_BREAK_AFTER`` seconds after it listens, its "engine dies" while the
process stays up (vLLM's API server over a dead engine core): it logs an ``EngineDeadError`` line, /health
answers 503 and requests 500; ``TINY_DIE_ON_REQUEST``: healthy, it dies (exit 1, an error line in its log) on
its first POST /v1/completions (SGLang's prefill without its CPU switch); ``TINY_HANG``: its first request
(/figures or a completion) never gets an answer, and neither does anything after it, /health included.
``TINY_BIND``: the address it listens on (127.0.0.1 unless set; a role reached from other nodes: 0.0.0.0).
``TINY_LINEAGE`` names a file that gets ``ROLE GROUP PID ANCESTORS`` (``TINY_GROUP``: the trial's key).
``TINY_STOP_DELAY``: seconds it takes to exit after SIGTERM (a server's graceful shutdown).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PORT = int(sys.argv[sys.argv.index("--port") + 1])
ON = {k[len("TINY_P_") :].lower() for k, v in os.environ.items() if k.startswith("TINY_P_") and v == "1"}
ON |= {sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--with"}
TERMS = json.loads(os.environ.get("TINY_FAILS", "[]"))
BROKEN = any(set(t.get("all", [])) <= ON and not set(t.get("none", [])) & ON for t in TERMS)
CONFIG = ",".join(sorted(ON))


def metric(repeat: int) -> float:
    value = 1.0 if BROKEN else 0.0
    sigma = float(os.environ.get("TINY_NOISE", "0"))
    if sigma:
        value += random.Random(f"{CONFIG}|{repeat}").gauss(0.0, sigma)
    return value


BROKEN_ENGINE = threading.Event()
STALLED = threading.Event()


def stall_if_asked() -> None:
    if os.environ.get("TINY_HANG"):
        STALLED.set()
    if STALLED.is_set():
        time.sleep(3600)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlparse(self.path)
        if STALLED.is_set() or (url.path == "/figures" and os.environ.get("TINY_HANG")):
            stall_if_asked()
        if BROKEN_ENGINE.is_set():
            self._send(503 if url.path == "/health" else 500, {"error": "EngineDeadError"})
        elif url.path == "/health":
            self._send(503 if os.environ.get("TINY_NEVER_HEALTHY") else 200, {"ok": True})
        elif url.path == "/pid":
            self._send(200, {"pid": os.getpid()})
        elif url.path == "/figures":
            if os.environ.get("TINY_DIE_ON") in ON:
                os.kill(os.getpid(), signal.SIGKILL)
            repeat = int(parse_qs(url.query).get("repeat", ["0"])[0])
            time.sleep(float(os.environ.get("TINY_PROBE_DELAY", "0")))
            value = metric(repeat)
            for upstream in filter(None, os.environ.get("TINY_UPSTREAM", "").split(",")):
                with urllib.request.urlopen(f"{upstream}/figures?repeat={repeat}", timeout=60) as answer:
                    value = max(value, float(json.loads(answer.read())["metric"]))
            self._send(200, {"metric": value, "config": CONFIG})
        else:
            self._send(404, {})

    def do_POST(self) -> None:
        stall_if_asked()
        if os.environ.get("TINY_DIE_ON_REQUEST"):
            print("RuntimeError: pin_memory=True requires a CUDA or other accelerator backend", flush=True)
            os._exit(1)
        if BROKEN_ENGINE.is_set():
            self._send(500, {"error": {"message": "EngineDeadError"}})
        elif urlparse(self.path).path != "/v1/completions":
            self._send(404, {})
        elif os.environ.get("TINY_COMPLETIONS_500"):
            self._send(500, {"error": {"message": "tiny: broken behind a healthy /health"}})
        else:
            self._send(200, {"choices": [{"index": 0, "text": "ok"}]})

    def _send(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("tiny: " + (format % args) + "\n")


def watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.3)


if __name__ == "__main__":
    if not os.environ.get("TINY_STAY"):
        threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    if os.environ.get("TINY_PIDS"):
        with open(os.environ["TINY_PIDS"], "a") as f:
            f.write(f"{os.getpid()} {PORT}\n")
    if os.environ.get("TINY_LAUNCHES"):
        with open(os.environ["TINY_LAUNCHES"], "a") as f:
            f.write(CONFIG + "\n")
    role = os.environ.get("TINY_ROLE", "")

    def event(what: str) -> None:
        if os.environ.get("TINY_EVENTS"):
            with open(os.environ["TINY_EVENTS"], "a") as f:
                f.write(f"{role} {what} {time.time():.6f} {os.getpid()}\n")

    event("start")
    if os.environ.get("TINY_LINEAGE"):  # "ROLE GROUP PID ANCESTOR,ANCESTOR,...": which process launched it
        chain, pid = [], os.getppid()
        while pid > 1:
            chain.append(str(pid))
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        with open(os.environ["TINY_LINEAGE"], "a") as f:
            f.write(f"{role} {os.environ.get('TINY_GROUP', '')} {os.getpid()} {','.join(chain)}\n")
    if os.environ.get("TINY_CHILD"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={})
    time.sleep(float(os.environ.get("TINY_START_DELAY", "0")))
    if os.environ.get("TINY_STOP_DELAY"):

        def slow_stop(*_: object) -> None:
            time.sleep(float(os.environ["TINY_STOP_DELAY"]))
            os._exit(0)

        signal.signal(signal.SIGTERM, slow_stop)
    print(f"tiny server on {PORT} with {CONFIG or '(no patch)'}; broken={BROKEN}", flush=True)
    httpd = ThreadingHTTPServer((os.environ.get("TINY_BIND", "127.0.0.1"), PORT), Handler)
    event("ready")
    if os.environ.get("TINY_BREAK_AFTER"):

        def break_engine() -> None:
            print("tiny: vllm.v1.engine.exceptions.EngineDeadError: the engine core died", flush=True)
            BROKEN_ENGINE.set()

        threading.Timer(float(os.environ["TINY_BREAK_AFTER"]), break_engine).start()
    if os.environ.get("TINY_DIE_AFTER"):
        threading.Timer(float(os.environ["TINY_DIE_AFTER"]), lambda: os._exit(3)).start()
    httpd.serve_forever()
