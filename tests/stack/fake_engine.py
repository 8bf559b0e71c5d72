"""A stand-in engine for ``speedtrap init --pid``'s tests: a real HTTP server whose package sits in the test's
git checkout, started as ``python -m sglang.launch_server ...`` (or the router) so /proc holds a real engine
command line. GET /health, /readiness -> 200; POST anything -> one completion; GET /seen -> its argv, the
variables it was started with, and the file of the ``sglang`` package it imports (which tree it runs).
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve() -> None:
    port = int(sys.argv[sys.argv.index("--port") + 1])
    try:
        import sglang

        where = getattr(sglang, "MARK", "") + " " + str(sglang.__file__)
    except ImportError:
        where = ""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/seen":
                env = {k: v for k, v in os.environ.items() if k.startswith(("SGLANG_", "SPEEDTRAP_", "FAKE_"))}
                self._send({"argv": sys.argv, "env": env, "imports": where})
            else:
                self._send({"ok": True})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(length)
            self._send({"choices": [{"text": "x", "index": 0}], "text": "x"})

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
