"""``speedtrap serve``: an OpenAI-compatible server for an in-process target.

Endpoints: ``/health``, ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` (``echo`` +
``logprobs``, and vLLM's ``prompt_logprobs``), ``/tokenize`` (vLLM's shape: a prompt or chat
messages) and SGLang's ``/generate`` (``return_logprob``, ``logprob_start_len``,
``top_logprobs_num``). Decoding is greedy. Chat requests go through the same engine as the
in-process backend, with its prefix cache, so a probe over HTTP gets the in-process answers.

``dialect="sglang"`` answers as SGLang 0.5.23 does where speedtrap's client reads it (see
:mod:`speedtrap.serve._sglang`): flags it lacks are dropped, errors have its shapes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from speedtrap._errors import ProbeError
from speedtrap.probe import Engine, Generation, StepLogprobs, top_logprobs
from speedtrap.serve import _sglang
from speedtrap.serve._schemas import (
    ChatRequest,
    CompletionRequest,
    GenerateRequest,
    TokenizeRequest,
    error_body,
    messages_json,
    stops,
)
from speedtrap.serve._stale import StalePromptCache
from speedtrap.targets import InProcessModel

T = TypeVar("T")
Dialect = Literal["vllm", "sglang"]
VERSION = "0.1.0"  # speedtrap's, reported by /version and /server_info


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def create_app(
    model: InProcessModel,
    *,
    model_name: str | None = None,
    prefix_cache: int = 8,
    dialect: Dialect = "vllm",
    context: int | None = None,
    allow_auto_truncate: bool = False,
    stale_prompt_cache: bool = False,
) -> FastAPI:
    """A FastAPI app serving ``model`` with the patches now applied to it.

    ``stale_prompt_cache`` switches on a constructed bug (see serve/_stale.py): a repeated prompt's
    logprobs are computed on stale KV.
    """
    engine = Engine(model, prefix_cache_entries=prefix_cache)
    if context is not None:
        engine.context = context
    stale = StalePromptCache(engine) if stale_prompt_cache else None
    name = model_name or model.name
    tokenizer = model.tokenizer
    sglang = dialect == "sglang"
    vocab_size = int(model.config.get("vocab_size", len(tokenizer)))
    app = FastAPI(title="speedtrap serve", docs_url=None, redoc_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        if not sglang:
            return JSONResponse(error_body(exc.message, code=exc.code), status_code=exc.status)
        if request.url.path == "/generate":
            return JSONResponse(_sglang.generate_error_body(exc.message), status_code=exc.status)
        return JSONResponse(_sglang.error_body(exc.message, exc.status), status_code=exc.status)

    if sglang:

        @app.exception_handler(RequestValidationError)
        async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
            return JSONResponse(_sglang.error_body(f"{exc} {exc.errors()}"[:2000], 400, "Bad Request"), 400)

        @app.get("/server_info")
        async def server_info() -> dict[str, Any]:
            return _sglang.server_info(VERSION)

    else:

        @app.get("/version")
        async def version() -> dict[str, Any]:
            return {"version": VERSION, "engine": "speedtrap serve", "dialect": "vllm"}

    def fit(ids: list[int], max_new: int) -> tuple[list[int], int]:
        return _sglang.truncate(ids, max_new, engine.context) if sglang and allow_auto_truncate else (ids, max_new)

    async def run(fn: Callable[[], T]) -> T:
        try:
            return await run_in_threadpool(fn)
        except ProbeError as exc:
            raise ApiError(400, exc.one_line(), exc.code) from None

    def check_model(requested: str) -> None:
        if sglang:  # SGLang serves any name asked for, echoing it (serving_base.py:40-60: only a ":" picks LoRA)
            return
        if requested and requested != name:
            message = f"The model {requested!r} does not exist; this server serves {name!r}"
            raise ApiError(404, message, "model_not_found")

    def piece(token: int, as_ids: bool) -> str:
        return f"token_id:{token}" if as_ids else tokenizer.decode([token])

    def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            # SGLang reports cached tokens only under --enable-cache-report (usage_processor.py:38-44)
            "prompt_tokens_details": None if sglang else {"cached_tokens": cached},
        }

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": name, "patches": list(model.active)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": name, "object": "model", "owned_by": "speedtrap", "root": name, "max_model_len": engine.context}
        return {"object": "list", "data": [card]}

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        check_model(req.model)
        if req.messages is not None:
            ids = model.chat_ids(messages_json(req.messages), add_generation_prompt=req.add_generation_prompt)
        elif req.prompt is not None:
            ids = tokenizer.encode(req.prompt, add_special_tokens=False)
        else:
            raise ApiError(400, "give a prompt or messages")
        limit = _sglang.tokenize_max_len(tokenizer, engine.context) if sglang else engine.context
        return {"count": len(ids), "max_model_len": limit, "tokens": [int(t) for t in ids]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> dict[str, Any]:
        check_model(req.model)
        if req.stream:
            raise ApiError(400, "streaming is not supported; send stream: false")
        max_tokens = req.max_completion_tokens or req.max_tokens or 256
        top_k = (req.top_logprobs or 1) if req.logprobs else 0
        gen: Generation = await run(
            lambda: engine.chat(messages_json(req.messages), max_tokens, stops(req.stop), top_k=top_k)
        )
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": gen.text},
            "finish_reason": gen.finish_reason,
            "logprobs": None,
        }
        if req.logprobs:
            choice["logprobs"] = {"content": [_chat_logprob(s, req.top_logprobs or 0, piece) for s in gen.steps]}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": (req.model or name) if sglang else name,
            "choices": [choice],
            "usage": usage(gen.prompt_tokens, len(gen.token_ids), gen.cached_tokens),
        }

    def prompt_ids(prompt: str | list[int] | list[str]) -> list[int]:
        if isinstance(prompt, str):
            return [int(t) for t in tokenizer.encode(prompt, add_special_tokens=False)]
        if prompt and all(isinstance(t, int) for t in prompt):
            return [int(t) for t in prompt]
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return [int(t) for t in tokenizer.encode(prompt[0], add_special_tokens=False)]
        raise ApiError(400, "prompt must be a string, one string in a list, or a list of token ids")

    def scored(ids: list[int], k: int) -> list[StepLogprobs]:
        logits = stale.prompt_logits(ids) if stale is not None else engine.prompt_logits(ids)
        return top_logprobs(logits[:-1], ids[1:], max(k, 1))

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict[str, Any]:
        check_model(req.model)
        if req.stream:
            raise ApiError(400, "streaming is not supported; send stream: false")
        ids = prompt_ids(req.prompt)
        if not ids:
            raise ApiError(400, "the prompt is empty")
        if sglang:  # fields SGLang's CompletionRequest lacks are dropped (protocol.py:365-441)
            req = req.model_copy(update={"return_tokens_as_token_ids": False, "prompt_logprobs": None})
        k_prompt = max(req.logprobs or 0, req.prompt_logprobs or 0)
        want_prompt = (req.echo and req.logprobs is not None) or req.prompt_logprobs is not None
        ids, max_tokens = fit(ids, req.max_tokens if req.max_tokens is not None else 16)

        def work() -> tuple[list[StepLogprobs], Generation | None]:
            engine.check_fits(len(ids), max_tokens)
            scores = scored(ids, k_prompt) if want_prompt else []
            gen = engine.generate(ids, 0, max_tokens, stops(req.stop), top_k=req.logprobs or 0) if max_tokens else None
            return scores, gen

        scores, gen = await run(work)
        as_ids = req.return_tokens_as_token_ids
        choice: dict[str, Any] = {"index": 0, "text": gen.text if gen else "", "logprobs": None}
        choice["finish_reason"] = gen.finish_reason if gen else "length"
        if req.logprobs is not None:
            out_steps = gen.steps[: len(gen.token_ids)] if gen else []
            entries: list[tuple[str, float | None, dict[str, float] | None]] = []
            if req.echo:
                entries.append((piece(ids[0], as_ids), None, None))
                entries += [(piece(s.token, as_ids), s.logprob, _top(s, req.logprobs, piece, as_ids)) for s in scores]
            entries += [(piece(s.token, as_ids), s.logprob, _top(s, req.logprobs, piece, as_ids)) for s in out_steps]
            choice["logprobs"] = _completion_logprobs(entries)
            if sglang:  # SGLang writes no offsets (entrypoints/openai/utils.py: text_offset -1 per token)
                choice["logprobs"]["text_offset"] = [-1] * len(entries)
        if req.echo:
            choice["text"] = tokenizer.decode(ids) + choice["text"]
        if req.prompt_logprobs is not None:
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": lp, "rank": r + 1, "decoded_token": piece(t, False)}
                 for r, (t, lp) in enumerate(s.top[: req.prompt_logprobs])}
                | {str(s.token): {"logprob": s.logprob, "rank": None, "decoded_token": piece(s.token, False)}}
                for s in scores
            ]  # fmt: skip
        completion = len(gen.token_ids) if gen else 0
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": (req.model or name) if sglang else name,
            "choices": [choice],
            "usage": usage(len(ids), completion),
        }

    @app.post("/generate")
    async def generate(req: GenerateRequest) -> dict[str, Any]:
        if (req.text is None) == (req.input_ids is None):
            raise ApiError(400, "give exactly one of text and input_ids")
        ids = prompt_ids(req.text) if req.text is not None else list(req.input_ids or [])
        if not ids:
            raise ApiError(400, "the prompt is empty")
        params = req.sampling_params
        k = req.top_logprobs_num
        ids, n = fit(ids, params.max_new_tokens)
        # -1: no input logprobs beyond the last position (SGLang: io_struct.py:567-568 default, schedule_batch)
        start = req.logprob_start_len if req.logprob_start_len >= 0 else len(ids)

        def work() -> tuple[list[StepLogprobs], Generation | None]:
            engine.check_fits(len(ids), n)
            scores = scored(ids, k) if req.return_logprob and start < len(ids) else []
            return scores, engine.generate(ids, 0, n, stops(params.stop), top_k=max(k, 1)) if n else None

        scores, gen = await run(work)
        meta: dict[str, Any] = {
            "prompt_tokens": len(ids),
            "completion_tokens": len(gen.token_ids) if gen else 0,
            "finish_reason": {"type": gen.finish_reason if gen else "length"},
        }
        if req.return_logprob:
            shown = (lambda t: _sglang.reported_id(t, vocab_size)) if sglang else int
            own = [[None, shown(ids[0]), None]] + [[s.logprob, shown(s.token), None] for s in scores]
            tops: list[Any] = [None] + [[[lp, t, None] for t, lp in s.top[:k]] if k else None for s in scores]
            out = gen.steps[: len(gen.token_ids)] if gen else []
            meta["input_token_logprobs"] = own[start:] if scores else []
            meta["input_top_logprobs"] = tops[start:] if scores else []
            meta["output_token_logprobs"] = [[s.logprob, s.token, None] for s in out]
            meta["output_top_logprobs"] = [[[lp, t, None] for t, lp in s.top[:k]] for s in out] if k else []
        answer = {"text": gen.text if gen else "", "output_ids": gen.token_ids if gen else [], "meta_info": meta}
        return _sglang.nulls(answer) if sglang else answer

    return app


def _top(step: StepLogprobs, k: int, piece: Callable[[int, bool], str], as_ids: bool) -> dict[str, float]:
    """The top-k entries and the token itself (as OpenAI's echo does), keyed by token text or id."""
    top = {piece(t, as_ids): lp for t, lp in step.top[:k]}
    top.setdefault(piece(step.token, as_ids), step.logprob)
    return top


def _completion_logprobs(entries: Sequence[tuple[str, float | None, dict[str, float] | None]]) -> dict[str, Any]:
    offsets, pos = [], 0
    for token, _, _ in entries:
        offsets.append(pos)
        pos += len(token)
    return {
        "tokens": [e[0] for e in entries],
        "token_logprobs": [e[1] for e in entries],
        "top_logprobs": [e[2] for e in entries],
        "text_offset": offsets,
    }


def _chat_logprob(step: StepLogprobs, k: int, piece: Callable[[int, bool], str]) -> dict[str, Any]:
    return {
        "token": piece(step.token, False),
        "logprob": step.logprob,
        "top_logprobs": [{"token": piece(t, False), "logprob": lp} for t, lp in step.top[:k]],
    }
