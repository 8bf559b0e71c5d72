"""A tiny real HTTP server standing in for a serving stack in ``speedtrap run --manifest`` tests.

A patch is on when its env var ``TINY_P_<NAME>=1`` is set; the stack is broken when the patch named
by ``TINY_BROKEN`` is on. GET /health, GET /figures -> {"metric": 1.0 broken / 0.0 fine}. It speaks
no chat API, so the recall probe fails against it (the pipeline must record that and go on).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[sys.argv.index("--port") + 1])
ON = {k[len("TINY_P_") :].lower() for k, v in os.environ.items() if k.startswith("TINY_P_") and v == "1"}
BROKEN = os.environ.get("TINY_BROKEN", "") in ON


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/health"):
            self._send(200, {"ok": True})
        elif self.path.startswith("/figures"):
            self._send(200, {"metric": 1.0 if BROKEN else 0.0})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        self._send(404, {"error": "no chat API here"})

    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _exit_with_parent() -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


if not os.environ.get("TINY_STAY"):  # TINY_STAY: outlive the parent, like SGLang's or vLLM's servers
    threading.Thread(target=_exit_with_parent, daemon=True).start()
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
