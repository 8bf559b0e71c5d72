"""A prefill/decode router of vLLM's NixlConnector kind (its ``toy_proxy_server.py``), in about 50 lines.

A completion goes to the prefill with ``max_tokens = 1`` and ``kv_transfer_params.do_remote_decode``; the
unchanged request then goes to the decode with the ``kv_transfer_params`` the prefill returned (where the
decode fetches the prompt's KV); the decode's answer is the answer. Prompt logprobs (vLLM's
``prompt_logprobs``) are the prefill's: the prefill computed the prompt, the decode only loaded its KV.
Anything else (``/v1/models``, ``/tokenize``) is the decode's. Run: ``python proxy.py --port P --prefill
http://127.0.0.1:A --decode http://127.0.0.1:B [--host 0.0.0.0]``.
"""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--host", default="127.0.0.1")  # 0.0.0.0: reached from other nodes (roles on Ray nodes)
parser.add_argument("--prefill", required=True)
parser.add_argument("--decode", required=True)
args = parser.parse_args()
app = FastAPI()
client = httpx.AsyncClient(timeout=None)
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/completions")
async def completions(request: Request) -> Response:
    body: dict[str, Any] = await request.json()
    first = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": REMOTE_DECODE}
    prefill = await client.post(f"{args.prefill}/v1/completions", json=first)
    if prefill.status_code != 200:
        return Response(prefill.content, prefill.status_code, media_type="application/json")
    primed = prefill.json()
    decode = await client.post(
        f"{args.decode}/v1/completions", json={**body, "kv_transfer_params": primed.get("kv_transfer_params")}
    )
    if decode.status_code != 200:
        return Response(decode.content, decode.status_code, media_type="application/json")
    answer = decode.json()
    if body.get("prompt_logprobs") is not None:
        for mine, theirs in zip(answer.get("choices", []), primed.get("choices", []), strict=False):
            mine["prompt_logprobs"] = theirs.get("prompt_logprobs")
    return JSONResponse(answer)


@app.api_route("/{path:path}", methods=["GET", "POST"])
async def other(path: str, request: Request) -> Response:
    sent = await client.request(
        request.method,
        f"{args.decode}/{path}",
        content=await request.body(),
        headers={"content-type": request.headers.get("content-type", "application/json")},
    )
    return Response(sent.content, sent.status_code, media_type=sent.headers.get("content-type"))


if __name__ == "__main__":
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
