"""Parsers of what servers answer: chat completions, prompt logprobs (three dialects) and their alignment.

Every parser takes decoded JSON and either returns a typed value or raises a one-line
:class:`ServerError` naming the field that is missing or malformed; nothing here trusts a server.

Alignment. OpenAI documents that with ``echo`` entry i of ``top_logprobs`` is the distribution that
predicted token i. At least one real server (llama-cpp-python 0.3.x) returns entry i as the
distribution *after* token i, with ``token_logprobs`` shifted alike. The shift is therefore
detected from the data: under the right alignment the distributions give the prompt's actual
tokens a much higher likelihood than under the wrong one (a language model predicts its text far
better than chance). A prompt where the two readings are too close to call fails loudly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from speedtrap._errors import ProbeError, ServerError
from speedtrap.probe._backend import ChatAnswer, PromptLogprobs, TokenDist

# SGLang 0.5.23 sources cited below are paths under sglang/srt/ in the PyPI wheel sglang==0.5.23.
SGLANG = "sglang 0.5.23"
MIN_ALIGNMENT_POSITIONS = 8
ALIGNMENT_MARGIN = 1.0  # nats per position between the best and the other reading
MISSING_PENALTY = 2.0  # a token outside the top-k counts as this far below the k-th logprob


def _get(data: Any, *path: str | int) -> Any:
    """``data[path0][path1]...`` or a ServerError naming the path."""
    cur = data
    for i, key in enumerate(path):
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError):
            where = "".join(f"[{k!r}]" if isinstance(k, str) else f"[{k}]" for k in path[: i + 1])
            raise ServerError(
                f"server answer lacks {where}", "check that the URL is an OpenAI-compatible server and --model"
            ) from None
    return cur


def _num(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value == math.inf:
        raise ServerError(f"server answer has a non-numeric {what}: {str(value)[:40]!r}", "check the server")
    return float(value)


def _logprob(value: Any, what: str) -> float:
    """A logprob, with ``null`` read as -inf (probability 0), the same on every path.

    SGLang serializes its answers with orjson (utils/json_response.py:15-17, ``orjson.dumps``), which
    writes a non-finite float as ``null``; a log-softmax's non-finite value is -inf (a masked token).
    A literal ``-Infinity`` is read the same way; NaN and +inf are refused.
    """
    return -math.inf if value is None else _num(value, what)


def _count(value: Any, what: str) -> int:
    """A non-negative integer (a token count or id), or a ServerError."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ServerError(f"server answer has an invalid {what}: {str(value)[:40]!r}", "check the server")
    return int(value)


def parse_chat(data: Any) -> ChatAnswer:
    content = _get(data, "choices", 0, "message", "content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ServerError("server answer's message content is not text", "check the server")
    usage = data.get("usage") if isinstance(data, dict) else None
    prompt_tokens = _count(usage.get("prompt_tokens", 0), "prompt_tokens") if isinstance(usage, dict) else 0
    completion = _count(usage.get("completion_tokens", 0), "completion_tokens") if isinstance(usage, dict) else 0
    finish = _get(data, "choices", 0).get("finish_reason") or ""
    return ChatAnswer(content, prompt_tokens, completion, str(finish))


def _top_dict(entry: Any, what: str) -> dict[str, float] | None:
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ServerError(f"server answer's {what} is not a token -> logprob object", "check the server")
    return {str(k): _logprob(v, what) for k, v in entry.items()}


def _score(tokens: Sequence[str], tops: Sequence[dict[str, float] | None], shift: int) -> tuple[float, int]:
    """Mean logprob of the actual tokens when entry j - shift predicts token j, and the positions scored."""
    total, n = 0.0, 0
    for j in range(1, len(tokens)):
        i = j - shift
        if i < 0 or i >= len(tops) or not tops[i]:
            continue
        top = tops[i]
        assert top is not None
        lp = top.get(tokens[j])
        total += lp if lp is not None else min(top.values()) - MISSING_PENALTY
        n += 1
    return (total / n if n else -math.inf), n


def detect_shift(tokens: Sequence[str], tops: Sequence[dict[str, float] | None]) -> int:
    """0 if ``tops[j]`` predicts ``tokens[j]`` (OpenAI's convention), 1 if it predicts ``tokens[j + 1]``."""
    (s0, n0), (s1, n1) = _score(tokens, tops, 0), _score(tokens, tops, 1)
    if min(n0, n1) < MIN_ALIGNMENT_POSITIONS or abs(s0 - s1) < ALIGNMENT_MARGIN:
        raise ProbeError(
            f"cannot tell how the server aligns prompt logprobs to tokens (mean logprob {s0:.2f} as documented, "
            f"{s1:.2f} shifted by one, over {min(n0, n1)} positions)",
            "probe with longer natural-text prompts or a larger --top-k",
        )
    return 0 if s0 > s1 else 1


def parse_openai_echo(data: Any, prompt_tokens: int | None = None, shift: int | None = None) -> PromptLogprobs:
    """``/v1/completions`` with ``echo`` + ``logprobs``: the prompt's entries, aligned (detected unless given)."""
    lp = _get(data, "choices", 0, "logprobs")
    tokens, token_lps, tops_raw = _get(lp, "tokens"), _get(lp, "token_logprobs"), _get(lp, "top_logprobs")
    if not (isinstance(tokens, list) and isinstance(token_lps, list) and isinstance(tops_raw, list)):
        raise ServerError("server answer's logprobs are not lists", "check that the server supports echo + logprobs")
    if not len(tokens) == len(token_lps) == len(tops_raw):
        raise ServerError(
            f"server answer's logprobs lists differ in length ({len(tokens)}, {len(token_lps)}, {len(tops_raw)})",
            "check the server",
        )
    usage = data.get("usage") if isinstance(data, dict) else None
    n = prompt_tokens if prompt_tokens is not None else _count(_get(usage, "prompt_tokens"), "prompt_tokens")
    # Entries past the prompt are generated tokens. A server may echo fewer entries than it counts
    # (llama-cpp-python leaves out its BOS token, even inside the prompt): then all entries are the prompt's.
    n = min(n, len(tokens))
    if n < 2:
        raise ProbeError(f"server echoed {len(tokens)} logprob entries for the prompt", "check that echo is supported")
    names = [str(t) for t in tokens]
    tops = [_top_dict(t, "top_logprobs entry") for t in tops_raw]
    s = detect_shift(names[:n], tops[:n]) if shift is None else shift
    positions: list[TokenDist | None] = [None]
    for j in range(1, n):
        top = tops[j - s] if j - s >= 0 else None
        if top is None:
            positions.append(None)
            continue
        own = _logprob(token_lps[j], "token_logprobs entry") if s == 0 else top.get(names[j])
        positions.append(TokenDist(names[j], own, top))
    return PromptLogprobs(names[:n], positions, s, "openai-echo")


def parse_vllm_prompt_logprobs(data: Any, ids: Sequence[int]) -> PromptLogprobs:
    """vLLM's ``prompt_logprobs``: per position ``{token_id: {"logprob": x, ...}}`` (None at position 0)."""
    raw = _get(data, "choices", 0, "prompt_logprobs")
    if not isinstance(raw, list) or len(raw) != len(ids):
        raise ServerError("server answer's prompt_logprobs do not match the prompt", "check the server (vLLM)")
    positions: list[TokenDist | None] = [None]
    for j in range(1, len(ids)):
        entry = raw[j]
        if not isinstance(entry, dict):
            raise ServerError(f"server answer's prompt_logprobs[{j}] is not an object", "check the server (vLLM)")
        top = {f"token_id:{_count(k, 'token id')}": _logprob(_get(v, "logprob"), "logprob") for k, v in entry.items()}
        name = f"token_id:{ids[j]}"
        positions.append(TokenDist(name, top.get(name), top))
    return PromptLogprobs([f"token_id:{t}" for t in ids], positions, 0, "vllm-prompt_logprobs")


def _sglang_truncated(data: Any, ids: Sequence[int], got: int) -> ProbeError:
    kept = data.get("meta_info", {}).get("prompt_tokens") if isinstance(data, dict) else None
    kept = kept if isinstance(kept, int) and not isinstance(kept, bool) else got
    # tokenizer_manager.py:1338-1346: with --allow-auto-truncate an input of context_len tokens or more
    # is cut to its first context_len tokens with only a log line (and max_new_tokens cut to what is left).
    return ProbeError(
        f"the server kept {kept} of the prompt's {len(ids)} tokens: it truncated the prompt silently "
        "(SGLang --allow-auto-truncate cuts inputs longer than its context)",
        "use shorter --lengths, or start the server with a larger --context-length",
    )


def _sglang_id(reported: Any, expected: int, j: int) -> None:
    """Check that SGLang names the prompt's token at position j, allowing its one known substitution."""
    got = _count(reported, "token id")
    if got == expected:
        return
    if got == 0:
        # scheduler_components/logprob_result_processor.py:52-56 reports every prompt id at or above
        # vocab_size - 1 as 0 ("clip padded hash values from image tokens"); the logprob itself is
        # computed on the id clamped to vocab_size - 1 (schedule_batch.py:3054).
        raise ProbeError(
            f"SGLang reports the prompt's token {expected} at position {j} as token 0: it replaces prompt ids at "
            "or above the model's vocab_size - 1 by 0, so this id is the vocabulary's last one or outside it "
            "(a tokenizer larger than the model's embedding)",
            "probe prompts without that token, or serve a model whose vocab_size covers the tokenizer",
        )
    raise ProbeError(
        f"SGLang input_token_logprobs[{j}] names another token ({got}) than the prompt's {expected}", "check it"
    )


def parse_sglang_generate(data: Any, ids: Sequence[int]) -> PromptLogprobs:
    """SGLang ``/generate`` with ``return_logprob``: ``meta_info.input_token_logprobs`` (``[logprob, id, text]``)
    and ``input_top_logprobs`` (a list of those per position, None at position 0).

    The triple order is tokenizer_manager.py:3104-3116 (``(logprob, token_id, text)``, text None unless
    asked); the None at position 0 is logprob_result_processor.py:38 (``[None] + values[:-1]``).
    """
    own = _get(data, "meta_info", "input_token_logprobs")
    tops = _get(data, "meta_info", "input_top_logprobs")
    if not isinstance(own, list) or not isinstance(tops, list):
        raise ServerError("server answer's input logprobs are not lists", "check the server (SGLang)")
    if len(own) < len(ids) and len(own) == len(tops):
        raise _sglang_truncated(data, ids, len(own))
    if len(own) != len(ids) or len(tops) != len(ids):
        raise ServerError("server answer's input logprobs do not match the prompt", "check the server (SGLang)")
    positions: list[TokenDist | None] = [None]
    for j in range(1, len(ids)):
        if not isinstance(tops[j], list):
            raise ServerError(f"server answer's input_top_logprobs[{j}] is not a list", "check the server (SGLang)")
        top = {f"token_id:{_count(_get(e, 1), 'token id')}": _logprob(_get(e, 0), "input top logprob") for e in tops[j]}
        _sglang_id(_get(own[j], 1), ids[j], j)
        value = _logprob(_get(own[j], 0), "logprob")
        positions.append(TokenDist(f"token_id:{ids[j]}", value, top))
    return PromptLogprobs([f"token_id:{t}" for t in ids], positions, 0, "sglang-generate")


def parse_sglang_output(data: Any, prompt_tokens: int) -> list[TokenDist]:
    """SGLang ``/generate``'s generated tokens: ``output_token_logprobs`` and ``output_top_logprobs``, by id."""
    meta = _get(data, "meta_info")
    kept = meta.get("prompt_tokens") if isinstance(meta, dict) else None
    if isinstance(kept, int) and not isinstance(kept, bool) and kept < prompt_tokens:
        raise _sglang_truncated(data, range(prompt_tokens), kept)
    own, tops = _get(meta, "output_token_logprobs"), _get(meta, "output_top_logprobs")
    if not isinstance(own, list) or not isinstance(tops, list) or len(own) != len(tops):
        raise ServerError("server answer's output logprobs do not match", "check the server (SGLang)")
    steps = []
    for entry, top_raw in zip(own, tops, strict=True):
        if not isinstance(top_raw, list):
            raise ServerError("server answer's output_top_logprobs entry is not a list", "check the server (SGLang)")
        top = {
            f"token_id:{_count(_get(e, 1), 'token id')}": _logprob(_get(e, 0), "output top logprob") for e in top_raw
        }
        token = f"token_id:{_count(_get(entry, 1), 'token id')}"
        steps.append(TokenDist(token, _logprob(_get(entry, 0), "output logprob"), top))
    _check_greedy(steps)
    return steps


def parse_generation_logprobs(data: Any) -> list[TokenDist]:
    """``/v1/completions`` logprobs of generated tokens; a greedy token must be its own step's argmax."""
    lp = _get(data, "choices", 0, "logprobs")
    tokens, token_lps, tops_raw = _get(lp, "tokens"), _get(lp, "token_logprobs"), _get(lp, "top_logprobs")
    if not (isinstance(tokens, list) and isinstance(token_lps, list) and isinstance(tops_raw, list)):
        raise ServerError("server answer's logprobs are not lists", "check the server")
    if not len(tokens) == len(token_lps) == len(tops_raw):
        raise ServerError("server answer's logprobs lists differ in length", "check the server")
    steps = []
    for token, own, top_raw in zip(tokens, token_lps, tops_raw, strict=True):
        top = _top_dict(top_raw, "top_logprobs entry") or {}
        steps.append(TokenDist(str(token), _logprob(own, "token_logprobs entry"), top))
    _check_greedy(steps)
    return steps


def _check_greedy(steps: Sequence[TokenDist]) -> None:
    misaligned = [
        i for i, s in enumerate(steps) if s.top and s.top.get(s.token, -math.inf) < max(s.top.values()) - 1e-4
    ]
    if misaligned:
        raise ProbeError(
            f"greedy tokens are not the argmax of their own logprobs at step {misaligned[0]} "
            "(shifted or sampled logprobs)",
            "check that the server decodes greedily (temperature 0) and aligns logprobs",
        )
