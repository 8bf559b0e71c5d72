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
from collections.abc import Callable, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from speedtrap._errors import ProbeError, ServerError, SpeedtrapError, UsageError
from speedtrap.probe._backend import STOP, ChatAnswer, Message, Prompt, PromptLogprobs, TokenDist
from speedtrap.probe._http_parse import (
    parse_chat,
    parse_generation_logprobs,
    parse_openai_echo,
    parse_sglang_generate,
    parse_sglang_output,
    parse_vllm_prompt_logprobs,
)

Api = Literal["openai", "vllm", "sglang"]
# Where the caller owns the server process: its error if the process has exited (naming its log), else None.
Watch = Callable[[], SpeedtrapError | None]
SGLANG_FAKE_BOOTSTRAP_HOST = "2.2.2.2"
DEFAULT_TIMEOUT = 600.0  # seconds to wait for an answer: a long prompt on a busy server is slow
CONTEXT_WORDS = ("context", "too long", "maximum", "exceed")
AUTO_MODEL = frozenset({"", "default"})  # model names that mean "the first model the server lists"
# What a server without an optional endpoint answers: 404/405/501 (422: an endpoint of another shape). A 400
# from /tokenize is a /tokenize that refused this request, never "no /tokenize here" (SGLang refuses
# add_generation_prompt with a non-Jinja chat template: entrypoints/openai/serving_tokenize.py:100-107,
# answered as HTTP 400 at :82-83).
ABSENT = frozenset({404, 405, 422, 501})


class Refused(ServerError):
    """A 4xx answer: the server has the endpoint and refused this request (``status``, its ``message``)."""

    def __init__(self, problem: str, fix: str, status: int, message: str) -> None:
        super().__init__(problem, fix)
        self.status, self.message = status, message


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


def _check_kept(data: Any, sent: int | None) -> Any:
    """``data`` unless its usage says the server kept fewer prompt tokens than were sent (silent truncation)."""
    usage = data.get("usage") if isinstance(data, dict) else None
    kept = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if sent is not None and isinstance(kept, int) and not isinstance(kept, bool) and 0 < kept < sent:
        raise ProbeError(
            f"the server kept {kept} of the prompt's {sent} tokens: it truncated the prompt silently "
            "(SGLang --allow-auto-truncate, tokenizer_manager.py:1338-1346, cuts inputs longer than its context)",
            "use shorter --lengths, or start the server with a larger context",
        )
    return data


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
    """A server at ``base_url`` serving ``model`` ("" or "default": the first model it lists).

    ``watch``: where the caller started the server, a check that returns its error once the process
    has exited (naming its log); a request then fails at the first retry instead of retrying a corpse.
    """

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
        watch: Watch | None = None,
        tokenize_url: str | None = None,
        retry_timeouts: bool = True,
        prompt_url: str | None = None,
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
        self._watch = watch  # a dead server fails the request at once, with its log, instead of retries
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._pool: _Pool | None = None  # this event loop's clients
        self._tls: ssl.SSLContext | None = None  # one for every client (httpx would load one each: 20 ms)
        self._urls: dict[str, httpx.URL] = {}  # parsed once per path (httpx parses a str twice a request)
        self._connected = False
        self._tokenize: bool | None = None  # whether POST /tokenize takes chat messages
        self._shift: int | None = None  # the echo alignment, once detected
        self.context: int | None = None  # the server's context length, where it says
        self._context_from_models = False  # /v1/models' max_model_len wins over /tokenize's
        self.adapter: str | None = None  # the LoRA adapter served as ``model`` (its card names a parent)
        self._pieces: dict[str, int | None] = {}  # text piece -> token id, from /tokenize
        self.name = f"{self.base_url}[{model or 'default'}]"
        # where /tokenize is asked when the server has none (a router in front of model servers); same model
        self._tokenizer = (
            HttpBackend(
                tokenize_url,
                model,
                timeout=timeout,
                retries=retries,
                backoff=backoff,
                api_key=api_key,
                transport=transport,
            )
            if tokenize_url
            else None
        )
        self.retry_timeouts = retry_timeouts  # False: a request that times out fails at once (a hung stack)
        # where the prompt's logprobs are asked (a PD stack's prefill: SGLang's router drops input_top_logprobs)
        self._prompter = (
            HttpBackend(
                prompt_url,
                model,
                timeout=timeout,
                retries=retries,
                backoff=backoff,
                api_key=api_key,
                api=api,
                transport=transport,
            )
            if prompt_url
            else None
        )

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
                died = self._watch() if self._watch is not None else None
                if died is not None:  # checked after the pause: a crashing process has exited by then
                    raise died
            try:
                resp = await self._send(pool, method, path, payload)
            except httpx.ConnectError as exc:
                last = f"cannot connect ({_one_line(str(exc), 80) or 'connection refused'})"
                continue
            except httpx.TimeoutException as exc:
                last = f"timed out ({type(exc).__name__})"
                if not self.retry_timeouts:
                    raise ServerError(
                        f"{method} {url} got no answer within {self._timeout:g} s",
                        "a request that hangs is not retried here: find the process that holds it",
                    ) from None
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
        return Refused(
            f"{self.base_url}{path} rejected the request (HTTP {resp.status_code}): {message}",
            "check --model and that the server supports this endpoint",
            resp.status_code,
            message,
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
            if not isinstance(m, dict) or m.get("id") != self.model:
                continue
            if isinstance(m.get("max_model_len"), int) and not isinstance(m["max_model_len"], bool):
                # SGLang's card carries the server's context (http_server.py:2005, model_config.context_len);
                # an adapter's card has max_model_len None (http_server.py:2018), so the tokenizer's stands.
                self.context = m["max_model_len"]
                self._context_from_models = True
            if m.get("parent"):
                # a LoRA adapter listed beside its base model (SGLang http_server.py:2010-2019, vLLM alike)
                self.adapter = self.model
        self.name = f"{self.base_url}[{self.model}]"
        self._connected = True

    async def _tokenize_count(self, messages: list[Message]) -> int | None:
        """The server's own count from ``/tokenize`` (vLLM's shape), or None where it has none."""
        if self._tokenize is False:
            return None
        # add_generation_prompt left out: vLLM's and speedtrap serve's default is True, and SGLang renders
        # as for a chat completion when it is absent (entrypoints/openai/protocol.py:1763-1769); sending it
        # makes SGLang refuse a non-Jinja chat template (serving_tokenize.py:100-107).
        payload = {"model": self.model, "messages": messages}
        data = await self._tokenize_post(payload)
        count, tokens = (data.get("count"), data.get("tokens")) if isinstance(data, dict) else (None, None)
        if isinstance(count, int) or isinstance(tokens, list):
            self._tokenize = True
            if isinstance(data.get("max_model_len"), int) and not self._context_from_models:
                # SGLang's /tokenize reports the tokenizer's model_max_length (serving_tokenize.py:46-52),
                # not the server's context: used only where /v1/models gives none.
                self.context = data["max_model_len"]
            return count if isinstance(count, int) else len(tokens)  # type: ignore[arg-type]
        self._tokenize = False
        return None

    async def _tokenize_post(self, payload: dict[str, Any]) -> Any:
        """POST /tokenize: None where the server has none (nor ``tokenize_url``); HTTP 400 is a one-line error."""
        try:
            data = await self._post("/tokenize", payload, ABSENT)
            if data is None and self._tokenizer is not None:
                data = await self._tokenizer._post("/tokenize", payload, ABSENT)
            return data
        except Refused as exc:
            if exc.status != 400:
                raise
            raise ServerError(
                f"{self.base_url}/tokenize refused the request (HTTP 400): {exc.message}",
                "serve the model with a Jinja chat template (SGLang: --chat-template FILE.jinja) so /tokenize "
                "renders chats, or probe with --api openai and text prompts",
            ) from None

    async def piece_ids(self, pieces: Sequence[str]) -> dict[str, int | None]:
        """Token ids of text pieces (as a server names tokens without ``return_tokens_as_token_ids``), by the
        server's own ``/tokenize``: a piece that is not exactly one token, or a server without ``/tokenize``,
        maps to None. Cached per backend."""
        await self.connect()
        todo = [p for p in dict.fromkeys(pieces) if p not in self._pieces]

        async def one(piece: str) -> int | None:
            data = await self._tokenize_post({"model": self.model, "prompt": piece, "add_special_tokens": False})
            if data is None:
                self._tokenize = False
            tokens = data.get("tokens") if isinstance(data, dict) else None
            ok = isinstance(tokens, list) and len(tokens) == 1 and isinstance(tokens[0], int)
            return int(tokens[0]) if ok and tokens is not None else None

        if todo and self._tokenize is None:  # one request first: a server without /tokenize answers it once
            self._pieces[todo[0]] = await one(todo.pop(0))
        if self._tokenize is False:
            return {p: self._pieces.get(p) for p in pieces}
        for piece, tid in zip(todo, await asyncio.gather(*(one(p) for p in todo)), strict=True):
            self._pieces[piece] = tid
        return {p: self._pieces[p] for p in pieces}

    async def describe(self) -> str:
        """Which engine and version answers here: vLLM's ``/version``, SGLang's ``/server_info``
        (http_server.py:863-890: ``version``, ``frontend``), speedtrap serve's ``/version``."""
        await self.connect()
        info = await self.request("GET", "/version", None, ABSENT | {400})
        if isinstance(info, dict) and isinstance(info.get("version"), str):
            engine = str(info.get("engine", "vLLM"))
            dialect = f", {info['dialect']} dialect" if info.get("dialect") else ""
            return f"{engine} {info['version']}{dialect}"
        info = await self.request("GET", "/server_info", None, ABSENT | {400})
        if isinstance(info, dict) and isinstance(info.get("version"), str):
            engine = str(info.get("engine", "SGLang"))
            dialect = f", {info['dialect']} dialect" if info.get("dialect") else ""
            return f"{engine} {info['version']} ({info.get('frontend', '?')} frontend{dialect})"
        return "an OpenAI-compatible server that does not say its engine"

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
            data = await self._tokenize_post(payload)
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
            if self.adapter:  # /generate names no model: the adapter goes as lora_path (io_struct.py:277)
                payload["lora_path"] = self.adapter
            if self._prompter is not None:
                # SGLang's PD prefill asked directly: its fake bootstrap host (disaggregation/utils.py:53, the
                # one its own warmup sends) lets it finish the request without a decode
                payload.update(bootstrap_host=SGLANG_FAKE_BOOTSTRAP_HOST, bootstrap_room=0)
                return parse_sglang_generate(await self._prompter._post("/generate", payload), ids)
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
            data = _check_kept(await self._post("/v1/completions", payload), len(ids))
            return parse_vllm_prompt_logprobs(data, ids)
        payload.update(echo=True, logprobs=top_k)
        n = None if ids is None else len(ids)
        result = parse_openai_echo(_check_kept(await self._post("/v1/completions", payload), n), n, self._shift)
        self._shift = result.shift
        return result

    async def decode_logprobs(self, prompt: Prompt, max_tokens: int, top_k: int) -> list[TokenDist]:
        await self.connect()
        if self.api == "sglang" and not isinstance(prompt, str):
            # SGLang's /v1/completions has no return_tokens_as_token_ids (its CompletionRequest,
            # entrypoints/openai/protocol.py:365-441, ignores unknown fields) and names tokens by text
            # (serving_completions.py:122 return_text_in_logprobs=True); /generate names them by id.
            ids = [int(t) for t in prompt]
            body: dict[str, Any] = {
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0},
                "return_logprob": True,
                "top_logprobs_num": top_k,
            }
            if self.adapter:
                body["lora_path"] = self.adapter
            return parse_sglang_output(await self._post("/generate", body), len(ids))
        payload = {
            "model": self.model,
            "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": top_k,
            "return_tokens_as_token_ids": True,
        }
        sent = None if isinstance(prompt, str) else len(prompt)
        return parse_generation_logprobs(_check_kept(await self._post("/v1/completions", payload), sent))

    async def aclose(self) -> None:
        """Close every client of this loop's pool, idle or leased: requests still under way fail (and open
        no new connection); a request made afterwards starts a fresh pool."""
        pool, self._pool = self._pool, None
        if pool is not None and pool.loop is asyncio.get_running_loop():
            await pool.aclose()
        for other in (self._tokenizer, self._prompter):
            if other is not None:
                await other.aclose()


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
