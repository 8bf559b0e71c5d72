"""A fault-injecting HTTP proxy for tests: sits between the probes and a real server.

Each request is forwarded to the upstream server unless a seeded draw (``rate``) picks a fault, the
kinds taken in turn:

- ``drop``: the connection is closed without an answer;
- ``5xx``: HTTP 503 with a JSON error body;
- ``stall``: nothing is sent for ``stall_s`` seconds (past the client's timeout), then the connection closes;
- ``truncate``: the upstream answer's body cut in half, framed as a complete answer (valid HTTP, broken JSON);
- ``cut``: the upstream answer announced in full, half of it sent, then the connection closes (a cut stream).

``requests`` counts what reached the proxy, ``faults`` what was injected, by kind, and ``log`` lists
every request in order as (method, path, body hash, fault or None): a faulted request must be followed
by a clean answer to the same request, or its answer was used. Runs on its own event loop in a thread,
so a test's own ``asyncio.run`` calls are unaffected.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
from collections import Counter
from collections.abc import Sequence
from types import TracebackType

import httpx

KINDS = ("drop", "5xx", "stall", "truncate", "cut")


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        rate: float,
        kinds: Sequence[str] = KINDS,
        seed: int = 0,
        stall_s: float = 5.0,
        skip_paths: Sequence[str] = (),
        first: int = 0,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.rate = rate
        self.kinds = tuple(kinds)
        self.stall_s = stall_s
        self.skip_paths = tuple(skip_paths)  # never faulted (e.g. a health check outside the test)
        self.rng = random.Random(seed)
        self.first = first  # the kind of the first fault (index into kinds): runs can start apart
        self.requests = 0
        self.faults: Counter[str] = Counter()
        self.log: list[tuple[str, str, str, str | None]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._client: httpx.AsyncClient | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _draw(self, method: str, path: str, body: bytes) -> str | None:
        self.requests += 1
        kind = None
        if not (self.skip_paths and path.startswith(self.skip_paths)) and self.rng.random() < self.rate:
            kind = self.kinds[(self.first + sum(self.faults.values())) % len(self.kinds)]  # in turn
            self.faults[kind] += 1
        self.log.append((method, path, hashlib.sha256(body).hexdigest()[:16], kind))
        return kind

    def unanswered(self) -> list[tuple[str, str, str, str | None]]:
        """Faulted requests never followed by a clean answer to the same request (their answer was used)."""
        out = []
        for i, (method, path, digest, kind) in enumerate(self.log):
            if kind is not None and not any(
                (m, p, d) == (method, path, digest) and k is None for m, p, d, k in self.log[i + 1 :]
            ):
                out.append((method, path, digest, kind))
        return out

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._client = httpx.AsyncClient(base_url=self.upstream, timeout=600, trust_env=False)
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), "0"))
                body = await reader.readexactly(length) if length else b""
                if not await self._answer(writer, method, path, headers, body):
                    return
        except (ConnectionError, httpx.HTTPError, asyncio.CancelledError):
            return  # the client went away (its timeout) or the upstream failed: the client sees a dropped connection
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(
        self, writer: asyncio.StreamWriter, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> bool:
        """Answer one request (or fail it); False when the connection must close."""
        kind = self._draw(method, path, body)
        if kind == "drop":
            return False
        if kind == "stall":
            await asyncio.sleep(self.stall_s)
            return False
        if kind == "5xx":
            await _write(writer, 503, b'{"error": {"message": "injected fault"}}')
            return True
        assert self._client is not None
        sent = {k: v for k, v in headers.items() if k.lower() in ("content-type", "authorization")}
        resp = await self._client.request(method, path, content=body, headers=sent)
        data = resp.content
        if kind == "truncate":
            await _write(writer, resp.status_code, data[: len(data) // 2])
            return True
        if kind == "cut":
            await _write(writer, resp.status_code, data[: len(data) // 2], announced=len(data))
            return False
        await _write(writer, resp.status_code, data)
        return True

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._client is not None:
                await self._client.aclose()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def _write(writer: asyncio.StreamWriter, status: int, data: bytes, announced: int | None = None) -> None:
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data) if announced is None else announced}\r\n\r\n"
    )
    writer.write(head.encode() + data)
    await writer.drain()
