"""Error paths of the HTTP backend: the network swapped for a function (the happy path runs on real servers).

Unreachable URLs use a real closed port on loopback; the rest count the requests a server saw, so
"retried" and "never retried" are measured, not assumed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from probe_helpers import free_port

from speedtrap._errors import ProbeError, ServerError, UsageError
from speedtrap.probe import HttpBackend

MESSAGES = [{"role": "user", "content": "What is the access code? Answer with the number only."}]
MODELS = {"object": "list", "data": [{"id": "m", "object": "model"}]}


def _chat_body(text: str = "123456", prompt_tokens: int = 20) -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2},
    }


class Server:
    """A scripted server: ``routes[path]`` answers each request; ``calls`` counts them by path."""

    def __init__(self, routes: dict[str, Callable[[httpx.Request], httpx.Response]]) -> None:
        self.routes = {"/v1/models": lambda r: httpx.Response(200, json=MODELS), **routes}
        self.calls: dict[str, int] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls[path] = self.calls.get(path, 0) + 1
        route = self.routes.get(path)
        return route(request) if route else httpx.Response(404, json={"detail": "Not Found"})

    def backend(self, **kwargs: Any) -> HttpBackend:
        return HttpBackend("http://server.test", "m", transport=httpx.MockTransport(self), backoff=0.001, **kwargs)


def _chat(backend: HttpBackend) -> Any:
    return asyncio.run(backend.chat(MESSAGES, 8))


def test_happy_path_without_tokenize_uses_one_request_per_question() -> None:
    server = Server({"/v1/chat/completions": lambda r: httpx.Response(200, json=_chat_body())})
    backend = server.backend()
    answer = _chat(backend)
    assert (answer.text, answer.prompt_tokens) == ("123456", 20)
    _chat(backend)
    assert server.calls == {"/v1/models": 1, "/tokenize": 1, "/v1/chat/completions": 2}  # checked once


def test_unreachable_url_is_retried_then_one_line() -> None:
    backend = HttpBackend(f"http://127.0.0.1:{free_port()}", "m", retries=2, backoff=0.01)
    with pytest.raises(ServerError, match=r"failed after 3 attempts: cannot connect") as err:
        _chat(backend)
    assert "\n" not in err.value.one_line()


def test_4xx_is_never_retried() -> None:
    server = Server({"/v1/chat/completions": lambda r: httpx.Response(404, json={"error": {"message": "no such"}})})
    with pytest.raises(ServerError, match=r"rejected the request \(HTTP 404\): no such"):
        _chat(server.backend(retries=5))
    assert server.calls["/v1/chat/completions"] == 1


def test_5xx_storm_is_retried_with_backoff_then_fails() -> None:
    server = Server({"/v1/chat/completions": lambda r: httpx.Response(503, text="overloaded")})
    with pytest.raises(ServerError, match=r"failed after 4 attempts: HTTP 503: overloaded"):
        _chat(server.backend(retries=3))
    assert server.calls["/v1/chat/completions"] == 4


def test_5xx_and_timeouts_recover() -> None:
    answers = iter(
        [httpx.Response(500, text="boom"), httpx.ReadTimeout("slow"), httpx.Response(200, json=_chat_body("777"))]
    )

    def flaky(request: httpx.Request) -> httpx.Response:
        nxt = next(answers)
        if isinstance(nxt, Exception):
            raise nxt
        return nxt

    server = Server({"/v1/chat/completions": flaky})
    assert _chat(server.backend(retries=3)).text == "777"
    assert server.calls["/v1/chat/completions"] == 3


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("<html>Bad gateway</html>", "answered invalid JSON"),
        ('{"choices": [{"message": {"content": "12', "answered invalid JSON"),
        ('{"choices": []}', r"lacks \['choices'\]\[0\]"),
        ('{"choices": [{"message": {"content": 5}}]}', "not text"),
    ],
)
def test_garbage_and_truncated_json_are_one_line_errors(body: str, expected: str) -> None:
    server = Server({"/v1/chat/completions": lambda r: httpx.Response(200, text=body)})
    with pytest.raises(ServerError, match=expected) as err:
        _chat(server.backend())
    assert "\n" not in err.value.one_line()
    # Invalid JSON may be a body cut on the way: retried like a 5xx, never scored; other shapes fail at once.
    assert server.calls["/v1/chat/completions"] == (5 if "invalid JSON" in expected else 1)


def test_prompt_longer_than_the_context_fails_loudly() -> None:
    message = "This model's maximum context length is 2048 tokens. However, you requested 3000 tokens"
    body = {"error": {"message": message, "code": "context_length_exceeded"}}
    server = Server({"/v1/chat/completions": lambda r: httpx.Response(400, json=body)})
    with pytest.raises(ProbeError, match="longer than the server's context"):
        _chat(server.backend())


def test_context_announced_by_tokenize_is_checked_before_sending() -> None:
    tokenize = {"count": 1995, "max_model_len": 2000, "tokens": list(range(1995))}  # + 8 new tokens > 2000
    server = Server(
        {
            "/tokenize": lambda r: httpx.Response(200, json=tokenize),
            "/v1/chat/completions": lambda r: httpx.Response(200, json=_chat_body()),
        }
    )
    with pytest.raises(ProbeError, match="does not fit the server's context of 2000"):
        _chat(server.backend())
    assert "/v1/chat/completions" not in server.calls


def test_silent_truncation_is_caught_by_the_usage_check() -> None:
    tokenize = {"count": 900, "tokens": list(range(900))}
    server = Server(
        {
            "/tokenize": lambda r: httpx.Response(200, json=tokenize),
            "/v1/chat/completions": lambda r: httpx.Response(200, json=_chat_body(prompt_tokens=512)),
        }
    )
    with pytest.raises(ProbeError, match="processed 512 prompt tokens where its tokenizer counts 900"):
        _chat(server.backend())


def test_model_not_served_and_bad_urls() -> None:
    server = Server({})
    backend = HttpBackend("http://server.test", "other", transport=httpx.MockTransport(server))
    with pytest.raises(UsageError, match="serves m, not 'other'"):
        _chat(backend)
    with pytest.raises(UsageError, match="not an http"):
        HttpBackend("ftp://x", "m")


def test_requests_carry_greedy_settings_and_the_bearer_key() -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=_chat_body())

    server = Server({"/v1/chat/completions": record})
    _chat(HttpBackend("http://s.test", "m", transport=httpx.MockTransport(server), api_key="k-123"))
    body = json.loads(seen[0].content)
    assert body["temperature"] == 0.0 and body["stop"] == ["\n"] and body["max_tokens"] == 8
    assert seen[0].headers["authorization"] == "Bearer k-123"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "speedtrap", *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("probe", "recall", "--target", "http://127.0.0.1:{port}", "--retries", "1", "--json"), "cannot connect"),
        (("probe", "recall", "--target", "smol-moe", "--lengths", "1k"), "--lengths must be integers"),
        (("probe", "recall", "--target", "smol-moe", "--depths", "0.5,2"), "depths must lie in [0, 1]"),
        (("probe", "divergence", "--target", "http://127.0.0.1:1"), "needs --baseline URL"),
        (("probe", "recall", "--target", "http://x:1", "--patches", "a"), "patches are set when it is launched"),
        (("serve", "--set", "novalue"), "--set expects key=value"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args: tuple[str, ...], expected: str) -> None:
    done = _cli(*(a.format(port=free_port()) for a in args))
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_concurrency_is_bounded() -> None:
    flight = {"now": 0, "max": 0}

    async def slow(request: httpx.Request) -> httpx.Response:
        flight["now"] += 1
        flight["max"] = max(flight["max"], flight["now"])
        await asyncio.sleep(0.01)
        flight["now"] -= 1
        return httpx.Response(200, json=_chat_body())

    async def main(backend: HttpBackend) -> list[Any]:
        try:
            return await asyncio.gather(*(backend.chat(MESSAGES, 8) for _ in range(20)))
        finally:
            await backend.aclose()

    server = Server({"/v1/chat/completions": slow})  # type: ignore[dict-item]
    backend = server.backend(concurrency=3)
    assert [a.text for a in asyncio.run(main(backend))] == ["123456"] * 20
    assert flight["max"] == 3
    assert [a.text for a in asyncio.run(main(backend))] == ["123456"] * 20  # a second event loop, a fresh pool


# One request fails while others hang; the caller closes the backend in a finally, then asyncio.run
# cancels the hanging requests. Nothing may be printed at shutdown (no traceback, no warning).
CLOSE_IN_FLIGHT = """
import asyncio, httpx
from speedtrap._errors import ServerError
from speedtrap.probe import HttpBackend

async def handler(request):
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": "m"}]})
    if request.url.path == "/v1/chat/completions" and b"fail" not in request.content:
        await asyncio.sleep(3600)
    return httpx.Response(404, json={"detail": "Not Found"})

async def main():
    backend = HttpBackend("http://s.test", "m", concurrency=4, transport=httpx.MockTransport(handler))
    try:
        await asyncio.gather(*(backend.chat([{"role": "user", "content": c}], 8) for c in ("a", "b", "c", "fail")))
    finally:
        await backend.aclose()

try:
    asyncio.run(main())
except ServerError as exc:
    print(exc.one_line())
"""


def test_closing_with_requests_in_flight_leaves_nothing_at_shutdown() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", CLOSE_IN_FLIGHT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "HTTP 404" in done.stdout
    assert done.stderr == ""


def test_a_request_waiting_for_a_slot_when_the_backend_closes_sends_nothing() -> None:
    release = asyncio.Event()
    seen: list[str] = []

    async def held(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["messages"][0]["content"])
        await release.wait()
        return httpx.Response(200, json=_chat_body())

    async def main(backend: HttpBackend) -> tuple[Any, Any]:
        await backend.connect()
        backend._tokenize = False  # no /tokenize round trip: the two chats race for the one slot
        first = asyncio.ensure_future(backend.chat([{"role": "user", "content": "first"}], 8))
        second = asyncio.ensure_future(backend.chat([{"role": "user", "content": "second"}], 8))
        await asyncio.sleep(0.05)
        await backend.aclose()
        release.set()
        return await asyncio.gather(first, second, return_exceptions=True)

    server = Server({"/v1/chat/completions": held})  # type: ignore[dict-item]
    answered, refused = asyncio.run(main(server.backend(concurrency=1)))
    assert answered.text == "123456"  # under way on a client of its own; the mock transport is not cut
    assert isinstance(refused, ServerError) and "the backend was closed" in str(refused)
    assert seen == ["first"]
