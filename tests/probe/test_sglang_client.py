"""The client against SGLang 0.5.23's answers, one test per mismatch found by reading its source.

The answers are written as SGLang writes them (the file:line of each shape is cited in
``speedtrap.serve._sglang`` and ``speedtrap.probe._http``); the network is swapped for a function
that counts requests and keeps their bodies, so what the client sends is measured, not assumed.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest

from speedtrap._errors import ProbeError, ServerError, UsageError
from speedtrap.probe import DivergenceSettings, HttpBackend, TokenDist, run_divergence
from speedtrap.probe._divergence import _approximation, approx_kl
from speedtrap.probe._http_parse import parse_generation_logprobs, parse_sglang_generate
from speedtrap.probe._keys import KeyTally, check_keys, dists_by_ids, mapper_of

MESSAGES = [{"role": "user", "content": "What is the access code? Answer with the number only."}]
SGLANG_400 = {
    "object": "error",
    "message": "add_generation_prompt is supported only with a Jinja chat template.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


class Server:
    """A scripted server: ``routes[path]`` answers; ``bodies[path]`` keeps each request's JSON body."""

    def __init__(self, routes: dict[str, Callable[[dict[str, Any]], httpx.Response]], models: list[Any]) -> None:
        self.routes = routes
        self.models = models
        self.bodies: dict[str, list[dict[str, Any]]] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": self.models})
        body = json.loads(request.content) if request.content else {}
        self.bodies.setdefault(path, []).append(body)
        route = self.routes.get(path)
        return route(body) if route else httpx.Response(404, json={"detail": "Not Found"})

    def backend(self, model: str = "m", **kwargs: Any) -> HttpBackend:
        return HttpBackend("http://sglang.test", model, transport=httpx.MockTransport(self), backoff=0.001, **kwargs)


def _card(name: str = "m", context: int | None = 8192, parent: str | None = None) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "owned_by": "sglang",
        "root": name,
        "parent": parent,
        "max_model_len": context,
    }


def _chat_body(prompt_tokens: int) -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "1"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1},
    }


def _generate_body(ids: Sequence[int], reported: Sequence[int] | None = None, k: int = 2) -> dict[str, Any]:
    """A /generate answer with input logprobs (``reported``: the ids SGLang names, default the prompt's)."""
    named = list(ids if reported is None else reported)
    own: list[Any] = [[None, named[0], None]] + [[-1.0, t, None] for t in named[1:]]
    tops: list[Any] = [None] + [[[-1.0, t, None], [-2.0, t + 1, None]][:k] for t in ids[1:]]
    return {
        "text": "",
        "output_ids": [],
        "meta_info": {"prompt_tokens": len(ids), "input_token_logprobs": own, "input_top_logprobs": tops},
    }


# (2) /tokenize's max_model_len is the tokenizer's; the context is /v1/models'.


def test_context_comes_from_v1_models_not_from_tokenize() -> None:
    tokenize = {"count": 3000, "max_model_len": 2048, "tokens": list(range(3000))}  # the tokenizer's 2048
    server = Server(
        {
            "/tokenize": lambda b: httpx.Response(200, json=tokenize),
            "/v1/chat/completions": lambda b: httpx.Response(200, json=_chat_body(3000)),
        },
        [_card(context=32768)],
    )
    backend = server.backend()
    assert asyncio.run(backend.chat(MESSAGES, 8)).prompt_tokens == 3000  # fits the server's 32,768
    assert backend.context == 32768


def test_without_a_context_in_v1_models_tokenize_still_bounds_the_prompt() -> None:
    tokenize = {"count": 3000, "max_model_len": 2048, "tokens": list(range(3000))}
    server = Server({"/tokenize": lambda b: httpx.Response(200, json=tokenize)}, [_card(context=None)])
    with pytest.raises(ProbeError, match="does not fit the server's context of 2048"):
        asyncio.run(server.backend().chat(MESSAGES, 8))


# (3) A 400 from /tokenize is a refusal, not "no /tokenize here".


def test_a_400_from_tokenize_is_a_one_line_refusal_not_a_missing_endpoint() -> None:
    server = Server({"/tokenize": lambda b: httpx.Response(400, json=SGLANG_400)}, [_card()])
    with pytest.raises(ServerError, match=r"/tokenize refused the request \(HTTP 400\): add_generation_prompt") as err:
        asyncio.run(server.backend().render(MESSAGES))
    assert "--chat-template" in err.value.one_line() and "\n" not in err.value.one_line()


def test_counting_tokens_leaves_add_generation_prompt_to_the_server_default() -> None:
    """SGLang refuses the field itself with a non-Jinja template; left out, it renders as a chat completion."""

    def tokenize(body: dict[str, Any]) -> httpx.Response:
        if "add_generation_prompt" in body:
            return httpx.Response(400, json=SGLANG_400)
        return httpx.Response(200, json={"count": 20, "max_model_len": 4096, "tokens": list(range(20))})

    server = Server(
        {"/tokenize": tokenize, "/v1/chat/completions": lambda b: httpx.Response(200, json=_chat_body(20))},
        [_card()],
    )
    assert asyncio.run(server.backend().count_tokens(MESSAGES)) == 20
    assert "/v1/chat/completions" not in server.bodies  # counted by /tokenize, not by a completion's usage


# (4) LoRA: the adapter reaches /generate as lora_path.


def test_an_adapter_model_is_sent_to_generate_as_lora_path() -> None:
    ids = list(range(5, 15))
    server = Server(
        {"/generate": lambda b: httpx.Response(200, json=_generate_body(b["input_ids"]))},
        [_card("base"), _card("my-adapter", context=None, parent="base")],
    )
    adapter = server.backend("my-adapter", api="sglang")
    asyncio.run(adapter.prompt_logprobs(ids, 2))
    base = server.backend("base", api="sglang")
    asyncio.run(base.prompt_logprobs(ids, 2))
    sent = server.bodies["/generate"]
    assert sent[0]["lora_path"] == "my-adapter" and "lora_path" not in sent[1]


# (5) Prompt ids at or above vocab_size - 1 come back as 0.


def test_an_id_sglang_reports_as_0_says_why() -> None:
    ids = [1, 700, 49151, 42]
    data = _generate_body(ids, reported=[1, 700, 0, 42])
    with pytest.raises(ProbeError, match=r"replaces prompt ids at or above the model's vocab_size - 1 by 0"):
        parse_sglang_generate(data, ids)
    with pytest.raises(ProbeError, match=r"names another token \(9\) than the prompt's 700"):
        parse_sglang_generate(_generate_body(ids, reported=[1, 9, 49151, 42]), ids)


# (6) --allow-auto-truncate: the kept prompt is shorter than the sent one.


def test_silent_truncation_by_generate_is_named() -> None:
    ids = list(range(1, 300))
    data = _generate_body(ids[:128])  # SGLang kept the first 128 (tokenizer_manager.py:1338-1346)
    with pytest.raises(ProbeError, match="kept 128 of the prompt's 299 tokens: it truncated the prompt silently"):
        parse_sglang_generate(data, ids)


def test_silent_truncation_by_completions_is_named() -> None:
    ids = list(range(1, 300))
    body = {
        "choices": [{"index": 0, "text": "", "logprobs": {"tokens": [], "token_logprobs": [], "top_logprobs": []}}],
        "usage": {"prompt_tokens": 128, "completion_tokens": 0},
    }
    server = Server({"/v1/completions": lambda b: httpx.Response(200, json=body)}, [_card()])
    with pytest.raises(ProbeError, match="kept 128 of the prompt's 299 tokens"):
        asyncio.run(server.backend().decode_logprobs(ids, 4, 2))


# (7) Non-finite logprobs arrive as null: read as -inf on every path.


def test_null_logprobs_are_minus_infinity_on_every_path() -> None:
    ids = [3, 4, 5]
    data = _generate_body(ids)
    data["meta_info"]["input_token_logprobs"][1][0] = None
    data["meta_info"]["input_top_logprobs"][2][1][0] = None
    parsed = parse_sglang_generate(data, ids)
    assert parsed.positions[1] is not None and parsed.positions[1].logprob == -math.inf
    assert parsed.positions[2] is not None and parsed.positions[2].top["token_id:6"] == -math.inf
    gen = {
        "choices": [
            {
                "logprobs": {
                    "tokens": ["a", "b"],
                    "token_logprobs": [-0.1, None],
                    "top_logprobs": [{"a": -0.1, "z": None}, {"b": None}],
                }
            }
        ]
    }
    steps = parse_generation_logprobs(gen)
    assert steps[0].top["z"] == -math.inf and steps[1].logprob == -math.inf
    # A zero probability on either side keeps the figures finite (the candidate's is floored).
    q = {"a": -0.1, "z": -3.0}
    assert approx_kl({"a": -0.1, "z": -math.inf}, q) == approx_kl({"a": -0.1}, q)
    assert math.isfinite(approx_kl({"a": -0.1, "b": -2.5}, {"a": -0.1, "b": -math.inf}))


# (1) Comparison keyed by token ids: text names mapped, unmappable ones counted.


def test_text_names_are_mapped_to_ids_and_unmappable_ones_counted() -> None:
    table = {" the": 278, " cat": 2368}

    async def mapper(pieces: Sequence[str]) -> dict[str, int | None]:
        return {p: table.get(p) for p in pieces}

    tally = KeyTally()
    steps = [TokenDist(" the", -0.2, {" the": -0.2, " cat": -2.0, "\ufffd\x9f": -5.0})]
    mapped = asyncio.run(dists_by_ids(steps, mapper, tally))
    assert mapped[0].token == "token_id:278"
    assert mapped[0].top == {"token_id:278": -0.2, "token_id:2368": -2.0, "\ufffd\x9f": -5.0}  # kept, not dropped
    assert (tally.mapped, tally.unmapped, tally.examples) == (2, 1, ["\ufffd\x9f"])


def _tokenizing(tokens: list[int]) -> Server:
    return Server(
        {
            "/tokenize": lambda b: httpx.Response(
                200, json={"count": len(tokens), "max_model_len": 4096, "tokens": tokens}
            )
        },
        [_card()],
    )


def test_engines_with_different_tokenizers_are_refused_in_one_line() -> None:
    settings = DivergenceSettings(lengths=(64,), decode_tokens=4, top_k=2)
    a, b = _tokenizing(list(range(30))).backend(), _tokenizing([*range(12), 999, *range(13, 30)]).backend()
    with pytest.raises(UsageError, match=r"tokenize differently .* first difference at token 12") as err:
        run_divergence(a, b, settings, progress=False)
    assert "\n" not in err.value.one_line()


def test_the_approximation_names_each_sides_k_when_they_differ() -> None:
    assert _approximation(True, 20, {}) is None
    same = _approximation(False, 20, {"baseline": 20, "candidate": 20})
    assert same is not None and "top-20" in same and "candidate top" not in same
    differ = _approximation(False, 20, {"baseline": 20, "candidate": 5})
    assert differ is not None and "baseline top-20, candidate top-5" in differ


def test_ids_against_text_that_no_side_can_map_are_refused() -> None:
    ids = [TokenDist("token_id:5", -0.1, {"token_id:5": -0.1})]
    text = [TokenDist("a", -0.1, {"a": -0.1})]
    with pytest.raises(ProbeError, match="one side names tokens by id and the other by text"):
        check_keys(ids, text, "decode")
    check_keys(text, text, "decode")  # the same kind on both sides: compared as they are


def test_what_the_target_cannot_map_is_mapped_by_the_reference() -> None:
    class Side:
        def __init__(self, table: dict[str, int]) -> None:
            self.table = table

        async def piece_ids(self, pieces: Sequence[str]) -> dict[str, int | None]:
            return {p: self.table.get(p) for p in pieces}

    mapper = mapper_of(Side({"a": 1}), Side({"a": 9, "b": 2}))  # type: ignore[arg-type]
    assert mapper is not None
    assert asyncio.run(mapper(["a", "b", "c"])) == {"a": 1, "b": 2, "c": None}
