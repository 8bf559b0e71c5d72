"""``speedtrap serve --dialect sglang``: SGLang 0.5.23's behaviour where speedtrap's client reads it.

Each rule cites its source in the PyPI wheel sglang==0.5.23 (paths under ``sglang/srt/``). The
imitation exists so tests see what a real SGLang server would hand the client, not a friendlier
server that hides the differences:

- ``/v1/completions`` has no ``return_tokens_as_token_ids`` and no ``prompt_logprobs``: its
  ``CompletionRequest`` (entrypoints/openai/protocol.py:365-441) is a pydantic model that ignores unknown
  fields, and logprobs name tokens by text (serving_completions.py:122 ``return_text_in_logprobs=True``,
  rendered by entrypoints/openai/utils.py:126-171).
- ``/tokenize`` reports the tokenizer's ``model_max_length`` (serving_tokenize.py:46-52), not the
  server's context; ``/v1/models`` carries the context (http_server.py:1994-2022).
- errors: OpenAI routes answer ``{"object": "error", "message", "type", "param", "code"}``
  (serving_base.py:205-221), validation errors as HTTP 400 in that shape (http_server.py:635-708);
  ``/generate`` answers ``{"error": {"message"}}`` (http_server.py:2246-2250).
- ``/generate`` reports prompt ids at or above ``vocab_size - 1`` as 0
  (scheduler_components/logprob_result_processor.py:52-56), and non-finite floats as ``null``
  (orjson, utils/json_response.py:15-17).
- ``--allow-auto-truncate`` cuts a prompt of ``context`` tokens or more to its first ``context``
  tokens and ``max_new_tokens`` to what is left, silently (managers/tokenizer_manager.py:1333-1367).
- any ``model`` name is served and echoed (entrypoints/openai/serving_base.py:40-60: only ``base:adapter``
  picks a LoRA adapter); the real server answered ``"model": "default"`` for the folder it serves
  (tests/data/sglang-shapes/chat_completions.json).
- ``usage.prompt_tokens_details`` is ``null`` (entrypoints/openai/usage_processor.py:38-44: only with
  ``--enable-cache-report``).
- ``/v1/completions`` logprobs carry ``text_offset`` -1 for every token (entrypoints/openai/utils.py).
- no ``/version``; ``/server_info`` says the version (http_server.py:863-890).
"""

from __future__ import annotations

import math
from typing import Any

SGLANG_VERSION = "0.5.23"
ORJSON_INT_LIMIT = 2**63  # serving_tokenize.py:48-51: a model_max_length orjson cannot write -> context_len


def error_body(message: str, status: int = 400, kind: str = "BadRequestError") -> dict[str, Any]:
    """An OpenAI-route error as SGLang writes it (serving_base.py:205-221)."""
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def generate_error_body(message: str) -> dict[str, Any]:
    """A ``/generate`` error as SGLang writes it (http_server.py:2246-2250)."""
    return {"error": {"message": message}}


def tokenize_max_len(tokenizer: Any, context: int) -> int:
    """What SGLang's ``/tokenize`` reports as ``max_model_len``: the tokenizer's model_max_length."""
    value = getattr(tokenizer, "model_max_length", -1)
    if isinstance(value, int) and not -ORJSON_INT_LIMIT <= value < 2 * ORJSON_INT_LIMIT:
        return context
    return int(value) if isinstance(value, int) else -1


def reported_id(token: int, vocab_size: int) -> int:
    """A prompt id as SGLang reports it in ``input_token_logprobs`` (logprob_result_processor.py:52-56)."""
    return token if token < vocab_size - 1 else 0


def nulls(value: Any) -> Any:
    """``value`` with every non-finite float as None, as orjson writes it (utils/json_response.py:15-17)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [nulls(v) for v in value]
    if isinstance(value, dict):
        return {k: nulls(v) for k, v in value.items()}
    return value


def truncate(ids: list[int], max_new_tokens: int, context: int) -> tuple[list[int], int]:
    """``--allow-auto-truncate`` (tokenizer_manager.py:1338-1367): the prompt cut to ``context`` tokens when it
    has ``context`` or more, then max_new_tokens cut to what is left."""
    if len(ids) >= context:
        ids = ids[:context]
    if len(ids) + max_new_tokens > context:
        max_new_tokens = max(0, context - len(ids))
    return ids, max_new_tokens


def server_info(version: str) -> dict[str, Any]:
    """``/server_info``'s identity fields (http_server.py:886-889), naming this imitation honestly."""
    return {
        "version": version,
        "engine": "speedtrap serve",
        "dialect": f"sglang {SGLANG_VERSION}",
        "frontend": "python",
    }
