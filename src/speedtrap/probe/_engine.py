"""Greedy generation and logprobs on an in-process model, shared by the in-process backend and ``serve``.

A chat request is split at the start of its last message: the prefix (the conversation so far) is
prefilled once into a KV cache kept in a small LRU, the rest (the question and the generation
prompt) is run through a copy of that cache, and answer tokens are decoded greedily. A cache miss
computes the prefix exactly as a hit would have been computed, so the numbers never depend on the
order requests arrive in: the in-process probe and ``speedtrap serve`` give the same answers.

Requests given together (:meth:`Engine.generate_many`) are decoded together: one step for all
unfinished sequences, each attending to its own unpadded KV cache, the weight GEMMs run once for all
of them (decoding is memory-bound: a step reads every weight, for one sequence or twenty): smol-moe in
one forward over a ragged cache, other models (``hf:``, a user's) in lockstep, a forward per sequence
with the GEMMs shared. A sequence gets the same tokens, bit for bit the same logits, alone or in any
batch (``InProcessModel.decode_step``); a finished one drops out of the next step.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from speedtrap._errors import CONTEXT_LENGTH_EXCEEDED, ProbeError
from speedtrap.targets import InProcessModel

if TYPE_CHECKING:
    from torch import Tensor

Message = dict[str, str]
DEFAULT_CONTEXT = 8192


@dataclass(frozen=True)
class StepLogprobs:
    """One generated (or scored) position: the token, its logprob and the top-k alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" or "length"
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    steps: list[StepLogprobs] = field(default_factory=list)


@dataclass(frozen=True)
class Request:
    """One greedy continuation: ``ids[:split]`` goes through the prefix cache."""

    ids: Sequence[int]
    split: int
    max_tokens: int
    stop: Sequence[str] = ()
    top_k: int = 0


@dataclass
class _Decoding:
    """A sequence being decoded: its cache, the logits that pick its next token, what it has so far."""

    request: Request
    cache: Any
    logits: Tensor
    cached: int
    out: list[int] = field(default_factory=list)
    steps: list[StepLogprobs] = field(default_factory=list)
    text: str = ""
    finish: str = "length"


MAX_BATCH = 32  # sequences decoded together at most (a 1,300-token smol-moe KV cache is about 60 MB)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _stop_ids(tok: Any) -> set[int]:
    """End-of-turn token ids (none for a model without a tokenizer: it decodes to the token limit)."""
    if tok is None:
        return set()
    stops = {tok.eos_token_id, *(tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>"))}
    return {int(t) for t in stops if isinstance(t, int) and t != tok.unk_token_id}


class Engine:
    """Runs one in-process model for many callers; a lock serializes them (patches are global state)."""

    def __init__(self, model: InProcessModel, prefix_cache_entries: int = 4) -> None:
        self.model = model
        self.prefix_cache_entries = prefix_cache_entries
        self._prefixes: OrderedDict[tuple[tuple[str, ...], tuple[int, ...]], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.context = int(model.config.get("max_positions", DEFAULT_CONTEXT))
        self.stop_ids = _stop_ids(model.tokenizer)
        self.prefills = 0  # prefix prefills computed (a cache miss each); tests and benchmarks read it

    # -- requests ---------------------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[Message],
        max_tokens: int,
        stop: Sequence[str] = (),
        patches: Sequence[str] | None = None,
        top_k: int = 0,
    ) -> Generation:
        """Greedy answer to a chat; the conversation before the last message is a cached prefix."""
        return self.generate_many([self.chat_request(messages, max_tokens, stop, top_k)], patches)[0]

    def chat_request(
        self, messages: Sequence[Message], max_tokens: int, stop: Sequence[str] = (), top_k: int = 0
    ) -> Request:
        """The request of a chat: split at the start of its last message."""
        ids = self.model.chat_ids(messages)
        prefix = self.model.chat_ids(messages[:-1], add_generation_prompt=False) if len(messages) > 1 else []
        split = min(common_prefix(prefix, ids), len(ids) - 1)
        return Request(ids, split, max_tokens, stop, top_k)

    def generate(
        self,
        ids: Sequence[int],
        split: int,
        max_tokens: int,
        stop: Sequence[str] = (),
        patches: Sequence[str] | None = None,
        top_k: int = 0,
    ) -> Generation:
        """Greedy continuation of ``ids``; ``ids[:split]`` goes through the prefix cache."""
        return self.generate_many([Request(ids, split, max_tokens, stop, top_k)], patches)[0]

    def generate_many(
        self,
        requests: Sequence[Request],
        patches: Sequence[str] | None = None,
        on_done: Callable[[int, Generation], None] | None = None,
        max_batch: int = MAX_BATCH,
    ) -> list[Generation]:
        """Greedy continuations of ``requests``, decoded together (``max_batch`` at a time); ``on_done``
        sees each one (its index, its generation) as it finishes."""
        for r in requests:
            if not r.ids:
                raise ProbeError("empty prompt", "send at least one token")
            self.check_fits(len(r.ids), r.max_tokens)
        done: dict[int, Generation] = {}
        with self._lock, self._patched(patches):
            for lo in range(0, len(requests), max(1, max_batch)):
                chunk = list(enumerate(requests))[lo : lo + max(1, max_batch)]
                for i, gen in self._decode_together(chunk):
                    done[i] = gen
                    if on_done is not None:
                        on_done(i, gen)
        return [done[i] for i in range(len(requests))]

    def prompt_logits(self, ids: Sequence[int], patches: Sequence[str] | None = None) -> Tensor:
        """Logits [T, V] of one forward over ``ids`` (a prefill pass)."""
        self.check_fits(len(ids), 0)
        with self._lock, self._patched(patches):
            return self.model.logits(list(ids)).float()

    def logits_on(self, ids: Sequence[int], cache: Any) -> Tensor:
        """Logits [T, V] of ``ids`` run on top of ``cache`` (which they extend), under the engine's lock."""
        self.check_fits(len(ids), 0)
        with self._lock:
            return self.model.logits(list(ids), cache).float()

    def decode_logits(self, ids: Sequence[int], decode_tokens: int, patches: Sequence[str] | None = None) -> Tensor:
        """Logits [decode_tokens, V] predicting the last ``decode_tokens`` tokens of ``ids``, computed by
        prefilling the rest and feeding one token at a time through the KV cache (a decode pass)."""
        n = len(ids)
        if not 0 < decode_tokens < n:
            raise ProbeError(f"decode_tokens={decode_tokens} must be in 1..{n - 1}", "use a shorter decode tail")
        self.check_fits(n, 0)
        import torch

        with self._lock, self._patched(patches):
            cache = self.model.new_cache()
            start = n - decode_tokens - 1
            if start > 0:
                with self._no_head():
                    self.model.logits(list(ids[:start]), cache)
            rows = [self.model.logits([int(t)], cache)[-1].float() for t in ids[start : n - 1]]
            return torch.stack(rows)

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens + max_tokens > self.context:
            raise ProbeError(
                f"prompt of {prompt_tokens} tokens plus {max_tokens} new tokens exceeds the context of "
                f"{self.context} tokens",
                "use shorter prompts",
                code=CONTEXT_LENGTH_EXCEEDED,
            )

    # -- internals ---------------------------------------------------------------------------

    def _patched(self, patches: Sequence[str] | None) -> Any:
        from contextlib import nullcontext

        return nullcontext() if patches is None else self.model.patched(patches)

    @contextmanager
    def _no_head(self) -> Iterator[None]:
        """While only the KV cache is wanted, skip the vocabulary projection (a quarter of a prefill's
        work on smol-moe) by swapping ``lm_head`` (whatever a patch made it) for a stub, then back."""
        from torch.nn import Module

        net = self.model.model
        head = getattr(net, "lm_head", None)
        if not isinstance(head, Module):
            yield
            return
        net.lm_head = _no_head_module()
        try:
            yield
        finally:
            net.lm_head = head

    def _prefix_cache(self, prefix: list[int]) -> tuple[Any, int]:
        """A private copy of the KV cache after ``prefix`` (computed on a miss), and its length."""
        if not prefix:
            return self.model.new_cache(), 0
        key = (tuple(self.model.active), tuple(prefix))
        cache = self._prefixes.get(key)
        if cache is None:
            cache = self.model.new_cache()
            with self._no_head():
                self.model.logits(prefix, cache)
            self.prefills += 1
            self._prefixes[key] = cache
            while len(self._prefixes) > self.prefix_cache_entries:
                self._prefixes.popitem(last=False)
        else:
            self._prefixes.move_to_end(key)
        return cache.copy(), len(prefix)

    def _decode_together(self, chunk: Sequence[tuple[int, Request]]) -> Iterator[tuple[int, Generation]]:
        """Prefill each request (one at a time: prefills are compute-bound), then decode all of them
        together; yields each (index, generation) as it finishes."""
        live: list[tuple[int, _Decoding]] = []
        for i, r in chunk:
            cache, cached = self._prefix_cache(list(r.ids[: r.split]))
            logits = self.model.logits(list(r.ids[r.split :]), cache)[-1]
            live.append((i, _Decoding(r, cache, logits, cached)))
        while live:
            fed: list[tuple[int, _Decoding, int]] = []
            for i, d in live:
                token = self._next(d)
                if token is None:
                    yield i, Generation(d.text, d.out, len(d.request.ids), d.finish, d.cached, d.steps)
                else:
                    fed.append((i, d, token))
            if fed:
                rows = self.model.decode_step([t for _, _, t in fed], [d.cache for _, d, _ in fed])
                for row, (_, d, _) in enumerate(fed):
                    d.logits = rows[row]
            live = [(i, d) for i, d, _ in fed]

    def _next(self, d: _Decoding) -> int | None:
        """Picks ``d``'s next token from its logits; the token to feed, or None when ``d`` has finished."""
        r = d.request
        if len(d.out) >= r.max_tokens:
            return None
        token = int(d.logits.argmax())
        if r.top_k:
            d.steps.append(_step(d.logits, token, r.top_k))
        if token in self.stop_ids:
            d.finish = "stop"
            return None
        d.out.append(token)
        tok = self.model.tokenizer
        d.text = tok.decode(d.out, skip_special_tokens=True) if tok is not None else ""
        cut = min((d.text.find(s) for s in r.stop if s and s in d.text), default=-1)
        if cut >= 0:
            d.text, d.finish = d.text[:cut], "stop"
            return None
        return token if len(d.out) < r.max_tokens else None


def _no_head_module() -> Any:
    """A module that stands in for ``lm_head`` when no logits are read: one zero per position."""
    from torch import nn

    class NoHead(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x[..., :1] * 0

    return NoHead()


def _step(logits: Tensor, token: int, top_k: int) -> StepLogprobs:
    logprobs = logits.double().log_softmax(-1)
    values, indices = logprobs.topk(top_k)
    top = tuple((int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist(), strict=True))
    return StepLogprobs(token, float(logprobs[token]), top)


def top_logprobs(logits: Tensor, tokens: Sequence[int], top_k: int) -> list[StepLogprobs]:
    """Per row of ``logits``: the logprob of ``tokens[row]`` and the top-k alternatives."""
    return [_step(logits[i], int(t), top_k) for i, t in enumerate(tokens)]
