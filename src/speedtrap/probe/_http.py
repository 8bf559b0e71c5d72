"""The HTTP backend: an OpenAI-compatible server (plus SGLang's and vLLM's extensions), over httpx.

Requests run concurrently up to ``concurrency``; connection errors, timeouts and 5xx answers are
retried with exponential backoff, 4xx answers never are. A prompt the server cannot hold fails
loudly: token counts come from the server's ``/tokenize`` where it has one (else from the usage it
reports), the count is checked against the context the server announces, and the usage of every
answer is checked against the count, so a server that truncates silently is caught.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from speedtrap._errors import ProbeError, ServerError, UsageError
from speedtrap.probe._backend import STOP, ChatAnswer, Message, Prompt, PromptLogprobs, TokenDist
from speedtrap.probe._http_parse import (
    parse_chat,
    parse_generation_logprobs,
    parse_openai_echo,
    parse_sglang_generate,
    parse_vllm_prompt_logprobs,
)

Api = Literal["openai", "vllm", "sglang"]
DEFAULT_TIMEOUT = 600.0  # seconds to wait for an answer: a long prompt on a busy server is slow
CONTEXT_WORDS = ("context", "too long", "maximum", "exceed")
AUTO_MODEL = frozenset({"", "default"})  # model names that mean "the first model the server lists"
FALLBACK = frozenset({400, 404, 405, 422, 501})  # what a server without an optional endpoint answers


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return _one_line(resp.text)
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        return _one_line(str(err if err is not None else body))
    return _one_line(str(body))


def _token_ids(tokens: list[Any], where: str) -> list[int]:
    """Token ids as a server listed them: integers, or a one-line error."""
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ServerError(f"{where} answered token ids that are not integers", "check the server's /tokenize")
    return tokens


def plain_text(messages: Sequence[Message]) -> str:
    """A conversation as plain text ("role: content" paragraphs), for servers that cannot tokenize chats.

    No chat-template markup: special tokens in a text prompt are echoed unreliably (llama-cpp-python
    drops its BOS token, which SmolLM2's template uses as ``<|im_start|>``, from echoed logprobs).
    """
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


class HttpBackend:
    """A server at ``base_url`` serving ``model`` ("" or "default": the first model it lists)."""

    def __init__(
        self,
        base_url: str,
        model: str = "",
        *,
        concurrency: int = 8,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = 4,
        backoff: float = 0.5,
        api: Api = "openai",
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise UsageError(f"not an http(s) URL: {base_url!r}", "give a base URL like http://127.0.0.1:8000")
        if concurrency < 1:
            raise UsageError("concurrency must be at least 1", "pass --concurrency 1 or more")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api: Api = api
        self.retries = retries
        self.backoff = backoff
        self.concurrency = concurrency
        self._timeout = timeout
        self._transport = transport
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._pool: _Pool | None = None  # this event loop's clients
        self._tls: ssl.SSLContext | None = None  # one for every client (httpx would load one each: 20 ms)
        self._urls: dict[str, httpx.URL] = {}  # parsed once per path (httpx parses a str twice a request)
        self._connected = False
        self._tokenize: bool | None = None  # whether POST /tokenize takes chat messages
        self._shift: int | None = None  # the echo alignment, once detected
        self.context: int | None = None  # the server's context length, where it says
        self.name = f"{self.base_url}[{model or 'default'}]"

    # -- transport -----------------------------------------------------------------------

    def _pool_here(self) -> _Pool:
        """This event loop's pool (each ``asyncio.run`` gets a fresh one: clients cannot change loops)."""
        loop = asyncio.get_running_loop()
        pool = self._pool
        if pool is None or pool.loop is not loop:
            # a previous loop's clients cannot be closed from here; their sockets close when collected
            pool = self._pool = _Pool(loop, self.concurrency)
        return pool

    def _new_client(self) -> httpx.AsyncClient:
        if self._tls is None and self._transport is None:
            self._tls = ssl.create_default_context()
        return httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(self._timeout, connect=min(10.0, self._timeout)),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            transport=self._transport,
            headers=self._headers,
            verify=self._tls or True,
        )

    async def _send(self, pool: _Pool, method: str, path: str, payload: dict[str, Any] | None) -> httpx.Response:
        """One attempt, on a client leased from the pool for its duration (at most ``concurrency`` at once)."""
        async with pool.slots:
            if pool.closed:  # closed while this request waited: open no new connection
                raise ServerError(
                    f"{method} {self.base_url}{path} was cut short: the backend was closed",
                    "close the backend after its requests finish",
                )
            client = pool.idle.pop() if pool.idle else pool.add(self._new_client())
            url = self._urls.get(path)
            if url is None:
                url = self._urls[path] = httpx.URL(self.base_url + path)
            try:
                return await client.request(method, url, json=payload)
            finally:
                pool.give_back(client)

    async def request(
        self, method: str, path: str, payload: dict[str, Any] | None = None, fallback: frozenset[int] = frozenset()
    ) -> Any:
        """The decoded JSON answer; None if the status is in ``fallback``. Retries what may pass."""
        pool = self._pool_here()  # every attempt uses it: a request under way when it closes stops
        url = self.base_url + path
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1) * (1 + random.random() / 4))
            try:
                resp = await self._send(pool, method, path, payload)
            except httpx.ConnectError as exc:
                last = f"cannot connect ({_one_line(str(exc), 80) or 'connection refused'})"
                continue
            except httpx.TimeoutException as exc:
                last = f"timed out ({type(exc).__name__})"
                continue
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {_one_line(str(exc), 80)}"
                continue
            if resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {_error_message(resp)}"
                continue
            if resp.status_code in fallback:
                return None
            if resp.status_code >= 400:
                raise self._client_error(resp, path)
            try:
                return resp.json()
            except (ValueError, json.JSONDecodeError):
                # A body cut short on the way (a proxy, a server restarting) is retried like a 5xx;
                # it is never scored. One that stays invalid is not an OpenAI-compatible server.
                last = f"answered invalid JSON (HTTP {resp.status_code}): {_one_line(resp.text, 80)!r}"
                if attempt == self.retries:
                    raise ServerError(
                        f"{url} {last} {self.retries + 1} times", "check that the URL is an OpenAI-compatible server"
                    ) from None
                continue
        raise ServerError(
            f"{method} {url} failed after {self.retries + 1} attempts: {last}",
            "check that the server is running and healthy at that URL",
        )

    def _client_error(self, resp: httpx.Response, path: str) -> Exception:
        message = _error_message(resp)
        lowered = message.lower()
        if resp.status_code in {400, 413, 422} and any(w in lowered for w in CONTEXT_WORDS) and "token" in lowered:
            return ProbeError(
                f"the prompt is longer than the server's context: {message}",
                "use shorter --lengths, or start the server with a larger context (llama.cpp: --n_ctx)",
            )
        if resp.status_code in {401, 403}:
            return ServerError(f"{self.base_url}{path} refused the request (HTTP {resp.status_code})", "set an API key")
        return ServerError(
            f"{self.base_url}{path} rejected the request (HTTP {resp.status_code}): {message}",
            "check --model and that the server supports this endpoint",
        )

    async def _post(self, path: str, payload: dict[str, Any], fallback: frozenset[int] = frozenset()) -> Any:
        return await self.request("POST", path, payload, fallback)

    # -- the Backend protocol -----------------------------------------------------------

    async def connect(self) -> None:
        """Check the server answers and serves the model (picks the first model if none was given)."""
        if self._connected:
            return
        data = await self.request("GET", "/v1/models")
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            raise ServerError(f"{self.base_url}/v1/models is not a model list", "check the URL")
        ids = [str(m.get("id")) for m in models if isinstance(m, dict)]
        if self.model in AUTO_MODEL and ids:
            self.model = ids[0]
        elif ids and self.model not in ids:
            raise UsageError(f"the server serves {', '.join(ids)}, not {self.model!r}", f"pass --model {ids[0]}")
        for m in models:
            if isinstance(m, dict) and m.get("id") == self.model and isinstance(m.get("max_model_len"), int):
                self.context = m["max_model_len"]
        self.name = f"{self.base_url}[{self.model}]"
        self._connected = True

    async def _tokenize_count(self, messages: list[Message]) -> int | None:
        """The server's own count from ``/tokenize`` (vLLM's shape), or None where it has none."""
        if self._tokenize is False:
            return None
        payload = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        data = await self._post("/tokenize", payload, FALLBACK)
        count, tokens = (data.get("count"), data.get("tokens")) if isinstance(data, dict) else (None, None)
        if isinstance(count, int) or isinstance(tokens, list):
            self._tokenize = True
            if isinstance(data.get("max_model_len"), int):
                self.context = data["max_model_len"]
            return count if isinstance(count, int) else len(tokens)  # type: ignore[arg-type]
        self._tokenize = False
        return None

    async def count_tokens(self, messages: list[Message]) -> int:
        await self.connect()
        counted = await self._tokenize_count(messages)
        if counted is not None:
            return counted
        answer = await self._chat(messages, 1)
        if answer.prompt_tokens <= 0:
            raise ServerError(f"{self.base_url} reports no token usage and has no /tokenize", "use another server")
        return answer.prompt_tokens

    async def _chat(self, messages: list[Message], max_tokens: int) -> ChatAnswer:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "top_p": 1.0,
            "seed": 0,
            "stop": list(STOP),
        }
        return parse_chat(await self._post("/v1/chat/completions", payload))

    async def chat(self, messages: list[Message], max_tokens: int) -> ChatAnswer:
        await self.connect()
        counted = await self._tokenize_count(messages)
        if counted is not None and self.context is not None and counted + max_tokens > self.context:
            raise ProbeError(
                f"a prompt of {counted} tokens plus {max_tokens} new tokens does not fit the server's context "
                f"of {self.context}",
                "use shorter --lengths, or start the server with a larger context",
            )
        answer = await self._chat(messages, max_tokens)
        if counted is not None and answer.prompt_tokens and answer.prompt_tokens != counted:
            raise ProbeError(
                f"the server processed {answer.prompt_tokens} prompt tokens where its tokenizer counts {counted} "
                "(a truncated prompt)",
                "use shorter --lengths, or start the server with a larger context",
            )
        return answer

    async def render(self, messages: list[Message]) -> Prompt:
        await self.connect()
        if self._tokenize is not False:
            payload = {"model": self.model, "messages": messages, "add_generation_prompt": False}
            data = await self._post("/tokenize", payload, FALLBACK)
            if isinstance(data, dict) and isinstance(data.get("tokens"), list):
                self._tokenize = True
                return _token_ids(data["tokens"], f"{self.base_url}/tokenize")
            self._tokenize = False
        return plain_text(messages)

    async def prompt_logprobs(self, prompt: Prompt, top_k: int) -> PromptLogprobs:
        await self.connect()
        ids = None if isinstance(prompt, str) else [int(t) for t in prompt]
        if self.api == "sglang":
            if ids is None:
                raise UsageError("SGLang prompt logprobs need token ids", "use a server with /tokenize")
            payload: dict[str, Any] = {
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True,
                "logprob_start_len": 0,
                "top_logprobs_num": top_k,
            }
            return parse_sglang_generate(await self._post("/generate", payload), ids)
        payload = {
            "model": self.model,
            "prompt": prompt if ids is None else ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "return_tokens_as_token_ids": True,
        }
        if self.api == "vllm":
            if ids is None:
                raise UsageError("vLLM prompt_logprobs need token ids", "use a server with /tokenize")
            payload["prompt_logprobs"] = top_k
            return parse_vllm_prompt_logprobs(await self._post("/v1/completions", payload), ids)
        payload.update(echo=True, logprobs=top_k)
        result = parse_openai_echo(
            await self._post("/v1/completions", payload), None if ids is None else len(ids), self._shift
        )
        self._shift = result.shift
        return result

    async def decode_logprobs(self, prompt: Prompt, max_tokens: int, top_k: int) -> list[TokenDist]:
        await self.connect()
        payload = {
            "model": self.model,
            "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": top_k,
            "return_tokens_as_token_ids": True,
        }
        return parse_generation_logprobs(await self._post("/v1/completions", payload))

    async def aclose(self) -> None:
        """Close every client of this loop's pool, idle or leased: requests still under way fail (and open
        no new connection); a request made afterwards starts a fresh pool."""
        pool, self._pool = self._pool, None
        if pool is not None and pool.loop is asyncio.get_running_loop():
            await pool.aclose()


class _Pool:
    """Clients of one connection each, reused last-in first-out, for one event loop.

    One httpx client per connection, not one client with ``concurrency`` connections: httpx's pool
    rescans all its connections for every request, which cost more than 1 ms a request at 64 in
    flight. Leases are plain method calls in ``try``/``finally`` (no async generator to finalize), and
    a client given back after :meth:`aclose` is not kept.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.loop = loop
        self.slots = asyncio.Semaphore(size)  # bounds the clients leased at once, hence the clients made
        self.idle: list[httpx.AsyncClient] = []
        self.clients: list[httpx.AsyncClient] = []
        self.closed = False

    def add(self, client: httpx.AsyncClient) -> httpx.AsyncClient:
        self.clients.append(client)
        return client

    def give_back(self, client: httpx.AsyncClient) -> None:
        if not self.closed:
            self.idle.append(client)

    async def aclose(self) -> None:
        self.closed = True
        clients, self.clients, self.idle = self.clients, [], []
        for client in clients:
            await client.aclose()
