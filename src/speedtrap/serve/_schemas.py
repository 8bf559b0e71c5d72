"""Request bodies of ``speedtrap serve`` (the OpenAI API, vLLM's and SGLang's extensions)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ChatMessage(_Request):
    role: str
    content: str | None = ""


class ChatRequest(_Request):
    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = None  # decoding is always greedy
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False


class CompletionRequest(_Request):
    model: str = ""
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(default=16, ge=0)
    temperature: float | None = None
    stop: str | list[str] | None = None
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)  # vLLM
    return_tokens_as_token_ids: bool = False  # vLLM
    stream: bool = False


class TokenizeRequest(_Request):
    model: str = ""
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True


class SamplingParams(_Request):
    max_new_tokens: int = Field(default=128, ge=0)
    temperature: float | None = None
    stop: str | list[str] | None = None


class GenerateRequest(_Request):
    """SGLang's native ``/generate``."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = False
    logprob_start_len: int = Field(default=-1, ge=-1)
    top_logprobs_num: int = Field(default=0, ge=0, le=20)


def stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)


def messages_json(messages: list[ChatMessage]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content or ""} for m in messages]


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}
