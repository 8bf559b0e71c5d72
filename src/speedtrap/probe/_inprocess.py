"""The in-process backend: one loaded model, this backend's patches applied around each call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from speedtrap.patching import select_patches
from speedtrap.probe._backend import STOP, ChatAnswer, Message, Prompt, PromptLogprobs, TokenDist
from speedtrap.probe._engine import Engine, Generation, Request, StepLogprobs, top_logprobs
from speedtrap.targets import InProcessModel

if TYPE_CHECKING:
    from torch import Tensor

MEMO_ENTRIES = 4


def token_name(token_id: int) -> str:
    """How the in-process backend (and ``speedtrap serve`` asked for ids) names a token."""
    return f"token_id:{token_id}"


def _dist(step: StepLogprobs, truth: int | None = None) -> TokenDist:
    token = step.token if truth is None else truth
    return TokenDist(token_name(token), step.logprob, {token_name(t): lp for t, lp in step.top})


def _synthetic_count(messages: Sequence[Message]) -> int:
    """The length a tokenizer-less model's stand-in ids get: about four characters a token."""
    return sum(len(m["content"]) // 4 + 4 for m in messages)


class InProcessBackend:
    """``model`` with ``patches`` applied around every call, so one loaded model serves many configurations.

    Calls run on the caller's thread in the order they are made: the prefix cache (one entry per
    conversation) then serves every question of a conversation after the first. Chats in flight
    together (``asyncio.gather``) are decoded together, one batch (``Engine.generate_many``): the
    same answers as one at a time, a weight read a step for all of them.
    """

    def __init__(
        self,
        model: InProcessModel,
        patches: Sequence[str] = (),
        *,
        engine: Engine | None = None,
        name: str | None = None,
    ) -> None:
        self.model = model
        self.patches = tuple(patches)
        select_patches(model.catalog, self.patches)  # an unknown name fails here, not mid-probe
        self.engine = engine if engine is not None else Engine(model)
        self.name = name or f"{model.name}[{','.join(self.patches) or 'baseline'}]"
        self._memo: dict[tuple[str, tuple[int, ...], int], Tensor] = {}
        self._pending: list[tuple[Request, asyncio.Future[Generation]]] = []

    async def chat(self, messages: list[Message], max_tokens: int) -> ChatAnswer:
        request = self.engine.chat_request(messages, max_tokens, STOP)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Generation] = loop.create_future()
        self._pending.append((request, answer))
        if len(self._pending) == 1:  # runs once every chat already scheduled has queued its request
            loop.call_soon(self._decode_pending)
        gen = await answer
        return ChatAnswer(gen.text, gen.prompt_tokens, len(gen.token_ids), gen.finish_reason)

    def _decode_pending(self) -> None:
        pending, self._pending = self._pending, []
        live = [(r, f) for r, f in pending if not f.done()]  # a cancelled caller's request is dropped
        if not live:
            return
        try:
            gens = self.engine.generate_many([r for r, _ in live], self.patches)
        except BaseException as exc:  # every waiting caller gets the error (ProbeError, interrupt)
            for _, f in live:
                if not f.done():
                    f.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, f), gen in zip(live, gens, strict=True):
            if not f.done():
                f.set_result(gen)

    async def count_tokens(self, messages: list[Message]) -> int:
        if self.model.tokenizer is None:
            return _synthetic_count(messages)
        return len(self.model.chat_ids(messages))

    async def render(self, messages: list[Message]) -> list[int]:
        if self.model.tokenizer is None:  # no tokenizer: seeded ids of the same length stand in for the text
            return self.model.synthetic_ids(repr(messages), _synthetic_count(messages))
        return self.model.chat_ids(messages, add_generation_prompt=False)

    def _ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str) and self.model.tokenizer is None:
            return self.model.synthetic_ids(prompt, _synthetic_count([{"role": "user", "content": prompt}]))
        if isinstance(prompt, str):
            return [int(t) for t in self.model.tokenizer.encode(prompt, add_special_tokens=False)]
        return [int(t) for t in prompt]

    async def prompt_logprobs(self, prompt: Prompt, top_k: int) -> PromptLogprobs:
        ids = self._ids(prompt)
        rows = top_logprobs(self.prefill_logits(ids)[:-1], ids[1:], top_k)
        positions: list[TokenDist | None] = [None, *(_dist(r) for r in rows)]
        return PromptLogprobs([token_name(t) for t in ids], positions, 0, "in-process")

    async def decode_logprobs(self, prompt: Prompt, max_tokens: int, top_k: int) -> list[TokenDist]:
        ids = self._ids(prompt)
        gen = self.engine.generate(ids, len(ids) - 1, max_tokens, (), self.patches, top_k=top_k)
        return [_dist(s) for s in gen.steps]

    async def piece_ids(self, pieces: Sequence[str]) -> dict[str, int | None]:
        """Token ids of text pieces with this model's tokenizer (None: not exactly one token)."""
        out: dict[str, int | None] = {}
        for piece in pieces:
            ids = self.model.tokenizer.encode(piece, add_special_tokens=False)
            out[piece] = int(ids[0]) if len(ids) == 1 else None
        return out

    async def describe(self) -> str:
        import torch
        import transformers

        return f"in-process {self.model.name} (torch {torch.__version__}, transformers {transformers.__version__})"

    # Exact, full-vocabulary distributions (the in-process divergence probe uses these directly).

    # A baseline compared with several candidates computes each sequence once: the last few results
    # are kept (a 1,024-token prefill is 200 MB of float32 logits, so only a few).

    def prefill_logits(self, ids: Sequence[int]) -> Tensor:
        """Logits [T, V]: one forward over ``ids``; row i predicts token i + 1."""
        return self._memoized(("prefill", tuple(ids), 0), lambda: self.engine.prompt_logits(ids, self.patches))

    def decode_logits(self, ids: Sequence[int], decode_tokens: int) -> Tensor:
        """Logits [decode_tokens, V] predicting the last ``decode_tokens`` tokens, fed one by one."""
        key = ("decode", tuple(ids), decode_tokens)
        return self._memoized(key, lambda: self.engine.decode_logits(ids, decode_tokens, self.patches))

    def _memoized(self, key: tuple[str, tuple[int, ...], int], compute: Callable[[], Tensor]) -> Tensor:
        if key not in self._memo:
            self._memo[key] = compute()
            while len(self._memo) > MEMO_ENTRIES:
                del self._memo[next(iter(self._memo))]
        return self._memo[key]

    async def aclose(self) -> None:
        return None
