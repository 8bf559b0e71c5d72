"""Greedy generation and logprobs on an in-process model, shared by the in-process backend and ``serve``.

A chat request is split at the start of its last message: the prefix (the conversation so far) is
prefilled once into a KV cache kept in a small LRU, the rest (the question and the generation
prompt) is run through a copy of that cache, and answer tokens are decoded one by one. A cache miss
computes the prefix exactly as a hit would have been computed, so the numbers never depend on the
order requests arrive in: the in-process probe and ``speedtrap serve`` give the same answers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
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
        ids = self.model.chat_ids(messages)
        prefix = self.model.chat_ids(messages[:-1], add_generation_prompt=False) if len(messages) > 1 else []
        split = min(common_prefix(prefix, ids), len(ids) - 1)
        return self.generate(ids, split, max_tokens, stop, patches, top_k)

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
        if not ids:
            raise ProbeError("empty prompt", "send at least one token")
        self.check_fits(len(ids), max_tokens)
        with self._lock, self._patched(patches):
            cache, cached = self._prefix_cache(list(ids[:split]))
            logits = self.model.logits(list(ids[split:]), cache)[-1]
            return self._decode(logits, cache, len(ids), cached, max_tokens, stop, top_k)

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

    def _decode(
        self,
        logits: Tensor,
        cache: Any,
        prompt_tokens: int,
        cached: int,
        max_tokens: int,
        stop: Sequence[str],
        top_k: int,
    ) -> Generation:
        out: list[int] = []
        steps: list[StepLogprobs] = []
        text, finish = "", "length"
        while len(out) < max_tokens:
            token = int(logits.argmax())
            if top_k:
                steps.append(_step(logits, token, top_k))
            if token in self.stop_ids:
                finish = "stop"
                break
            out.append(token)
            text = self.model.tokenizer.decode(out, skip_special_tokens=True)
            cut = min((text.find(s) for s in stop if s and s in text), default=-1)
            if cut >= 0:
                text, finish = text[:cut], "stop"
                break
            if len(out) < max_tokens:
                logits = self.model.logits([token], cache)[-1]
        return Generation(text, out, prompt_tokens, finish, cached, steps)


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
