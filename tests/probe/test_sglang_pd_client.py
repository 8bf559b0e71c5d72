"""The client against SGLang's PD router (sglang-router 0.3.2), whose answers were read off the live stack.

Through ``/generate`` with ``return_logprob``, the router merges the prefill's ``input_token_logprobs`` into the
decode's answer but not its ``input_top_logprobs`` (empty: the decode never computed the prompt), and it has no
``/tokenize``. A stack's probe therefore tokenizes at a model role and asks the prompt's logprobs of the prefill
directly, with SGLang's fake bootstrap host (the prefill then finishes without a decode). The network is a
function routing by host, so what goes where is measured, not assumed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from speedtrap._errors import ServerError
from speedtrap.probe import HttpBackend

IDS = [5, 6, 7, 8]


def _generate(body: dict[str, Any], tops: bool) -> httpx.Response:
    ids = body["input_ids"]
    own = [[None, ids[0], None], *[[-1.0, t, None] for t in ids[1:]]]
    top = [None, *[[[-1.0, t, None], [-2.0, 99, None]] for t in ids[1:]]] if tops else []
    meta = {"input_token_logprobs": own, "input_top_logprobs": top, "prompt_tokens": len(ids)}
    return httpx.Response(200, json={"text": "x", "output_ids": [1], "meta_info": meta})


class PD:
    """prefill.test answers /tokenize and /generate with the prompt's tops; router.test drops them."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        body = json.loads(request.content) if request.content else {}
        self.seen.append((host, path, body))
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
        if path == "/tokenize":
            if host == "router.test":
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(200, json={"tokens": IDS, "count": len(IDS)})
        if path == "/generate":
            return _generate(body, tops=host == "prefill.test")
        return httpx.Response(404, json={})


def _backend(pd: PD, **kw: Any) -> HttpBackend:
    transport = httpx.MockTransport(pd)
    return HttpBackend("http://router.test", "m", api="sglang", transport=transport, backoff=0.001, **kw)


def test_the_router_alone_drops_the_prompts_top_logprobs() -> None:
    pd = PD()
    backend = _backend(pd)
    with pytest.raises(ServerError, match="input logprobs do not match the prompt"):
        asyncio.run(backend.prompt_logprobs(IDS, 2))


def test_the_stacks_probe_tokenizes_at_the_prefill_and_asks_it_for_the_prompt() -> None:
    pd = PD()
    backend = _backend(pd, tokenize_url="http://prefill.test", prompt_url="http://prefill.test")

    async def go() -> Any:
        prompt = await backend.render([{"role": "user", "content": "hi"}])
        return prompt, await backend.prompt_logprobs(prompt, 2)

    prompt, lp = asyncio.run(go())
    assert list(prompt) == IDS  # the router had no /tokenize: the prefill's
    assert len(lp.positions) == len(IDS) and lp.positions[1] is not None and len(lp.positions[1].top) == 2
    generated = [(h, b) for h, p, b in pd.seen if p == "/generate"]
    assert [h for h, _ in generated] == ["prefill.test"]
    assert generated[0][1]["bootstrap_host"] == "2.2.2.2" and generated[0][1]["bootstrap_room"] == 0
    assert ("router.test", "/tokenize") in [(h, p) for h, p, _ in pd.seen]  # asked first, then the fallback
