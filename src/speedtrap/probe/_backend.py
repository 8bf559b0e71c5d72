"""What a probe talks to: the ``Backend`` protocol and the values it returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]
Prompt = Sequence[int] | str  # token ids, or text where a server only takes text

STOP = ("\n",)  # recall answers are one line


@dataclass(frozen=True)
class ChatAnswer:
    text: str
    prompt_tokens: int
    completion_tokens: int = 0
    finish_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
        }


@dataclass(frozen=True)
class TokenDist:
    """The distribution at one position, as far as a backend reveals it.

    ``token`` is the token that actually comes next (the teacher-forced one, or the one generated),
    ``logprob`` its log-probability when known, ``top`` the top-k tokens with their logprobs. Tokens
    are named as the backend names them (text pieces, or ``token_id:N``).
    """

    token: str
    logprob: float | None
    top: dict[str, float] = field(default_factory=dict)

    def logprob_of(self, token: str) -> float | None:
        if token == self.token and self.logprob is not None:
            return self.logprob
        return self.top.get(token)

    def argmax(self) -> str:
        return max(self.top, key=lambda t: self.top[t]) if self.top else self.token


@dataclass(frozen=True)
class PromptLogprobs:
    """Teacher-forced logprobs of a prompt: ``positions[j]`` is the distribution that predicts
    ``tokens[j]`` (None where the backend gives nothing, always at j = 0)."""

    tokens: list[str]
    positions: list[TokenDist | None]
    shift: int = 0  # how the server's lists were aligned: 0 = as OpenAI documents, 1 = one late
    source: str = ""


@runtime_checkable
class Backend(Protocol):
    """A model behind one configuration: in-process with patches, or a server over HTTP."""

    name: str

    async def chat(self, messages: list[Message], max_tokens: int) -> ChatAnswer:
        """The greedy answer (stopping at end of turn or a newline) and the prompt's token count."""
        ...

    async def count_tokens(self, messages: list[Message]) -> int:
        """Prompt tokens of a chat request (the server's own count where it has one)."""
        ...

    async def render(self, messages: list[Message]) -> Prompt:
        """A whole conversation as one teacher-forcing prompt: token ids, or text."""
        ...

    async def prompt_logprobs(self, prompt: Prompt, top_k: int) -> PromptLogprobs:
        """Prefill pass: the top-k distribution at every prompt position."""
        ...

    async def decode_logprobs(self, prompt: Prompt, max_tokens: int, top_k: int) -> list[TokenDist]:
        """Decode pass: greedy continuation of ``prompt``, the top-k distribution at every step."""
        ...

    async def aclose(self) -> None: ...
