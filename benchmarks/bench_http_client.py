"""What the HTTP backend adds per request, against a local null server, 64 requests in flight.

    .venv/bin/python benchmarks/bench_http_client.py [--requests 3000] [--inflight 64]

The null server is a real HTTP/1.1 server (raw asyncio, keep-alive) in its own process that answers
every chat completion at once with a fixed body. The client side is measured in CPU seconds of the
client process (what the probe's machinery costs), side by side with a bare httpx client sending the
same requests, and wall time per request for scale. Run it when `uptime` shows a low load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import httpx

from speedtrap.probe import HttpBackend

CHAT = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "482913"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 7, "total_tokens": 1007},
    }
).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "null", "object": "model"}]}).encode()
MESSAGES = [{"role": "user", "content": "What is the access code for the blue door? Answer with the number only."}]

SERVER = r"""
import asyncio, sys
CHAT, MODELS = sys.argv[2].encode(), sys.argv[3].encode()

async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *headers = head.decode("latin-1").split("\r\n")
            length = 0
            for h in headers:
                if h.lower().startswith("content-length:"):
                    length = int(h.split(":", 1)[1])
            if length:
                await reader.readexactly(length)
            path = line.split(" ")[1]
            if path == "/v1/chat/completions":
                status, body = b"200 OK", CHAT
            elif path == "/v1/models":
                status, body = b"200 OK", MODELS
            else:
                status, body = b"404 Not Found", b'{"detail": "Not Found"}'
            writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_backend(url: str, requests: int, inflight: int) -> tuple[float, float]:
    backend = HttpBackend(url, "null", concurrency=inflight)
    await backend.chat(MESSAGES, 8)  # connect, detect /tokenize (absent here), warm the pool
    cpu, wall = time.process_time(), time.perf_counter()
    answers = await asyncio.gather(*(backend.chat(MESSAGES, 8) for _ in range(requests)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert all(a.text == "482913" for a in answers)
    await backend.aclose()
    return cpu, wall


async def run_bare(url: str, requests: int, inflight: int) -> tuple[float, float]:
    limits = httpx.Limits(max_connections=inflight, max_keepalive_connections=inflight)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
        payload = {"model": "null", "messages": MESSAGES, "max_tokens": 8, "temperature": 0.0}
        await client.post("/v1/chat/completions", json=payload)
        sem = asyncio.Semaphore(inflight)

        async def one() -> str:
            async with sem:
                resp = await client.post("/v1/chat/completions", json=payload)
            return str(resp.json()["choices"][0]["message"]["content"])

        cpu, wall = time.process_time(), time.perf_counter()
        answers = await asyncio.gather(*(one() for _ in range(requests)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert all(a == "482913" for a in answers)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), CHAT.decode(), MODELS.decode()], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        print(f"load average {os.getloadavg()[0]:.2f}; {args.requests} requests x {args.rounds} rounds, "
              f"{args.inflight} in flight")  # fmt: skip
        ours, bare = [], []
        for _ in range(args.rounds):  # alternate, so drifting load hits both sides alike
            ours.append(asyncio.run(run_backend(url, args.requests, args.inflight)))
            bare.append(asyncio.run(run_bare(url, args.requests, args.inflight)))
        n = args.requests
        o_cpu, o_wall = (min(x[i] for x in ours) / n * 1e3 for i in (0, 1))
        b_cpu, b_wall = (min(x[i] for x in bare) / n * 1e3 for i in (0, 1))
        print(f"HttpBackend.chat : {o_cpu:.3f} ms client CPU per request, {o_wall:.3f} ms wall per request")
        print(f"bare httpx post  : {b_cpu:.3f} ms client CPU per request, {b_wall:.3f} ms wall per request")
        print(f"ratio (ours / bare httpx): CPU {o_cpu / b_cpu:.2f}x, wall {o_wall / b_wall:.2f}x")
        print(f"goal: < 1 ms added per request -> {'met' if o_cpu < 1.0 else 'NOT met'} ({o_cpu:.3f} ms)")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
