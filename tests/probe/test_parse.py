"""The server-answer parsers: alignment detection on constructed echoes, and garbage never escapes as a crash."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from speedtrap._errors import ProbeError, ServerError, SpeedtrapError
from speedtrap.probe._http_parse import (
    detect_shift,
    parse_chat,
    parse_generation_logprobs,
    parse_openai_echo,
    parse_sglang_generate,
    parse_vllm_prompt_logprobs,
)

VOCAB = [f"w{i}" for i in range(40)]


def _language(seed: int, n: int) -> tuple[list[str], list[dict[str, float]]]:
    """A constructed "language model": dist j predicts token j, which is its peak 80% of the time."""
    rng = random.Random(seed)
    tokens: list[str] = [rng.choice(VOCAB)]
    dists: list[dict[str, float]] = [{}]
    for _ in range(1, n):
        peak = rng.choice(VOCAB)
        logits = {t: rng.gauss(0, 1) + (8.0 if t == peak else 0.0) for t in VOCAB}
        z = math.log(sum(math.exp(v) for v in logits.values()))
        dist = {t: v - z for t, v in logits.items()}
        dists.append(dist)
        tokens.append(peak if rng.random() < 0.8 else rng.choice(VOCAB))
    return tokens, dists


def _top(dist: dict[str, float], k: int) -> dict[str, float]:
    return dict(sorted(dist.items(), key=lambda kv: -kv[1])[:k])


def _echo(tokens: list[str], dists: list[dict[str, float]], k: int, shifted: bool) -> dict[str, Any]:
    """An echo answer as OpenAI documents it, or as llama-cpp-python 0.3 returns it (one entry late)."""
    n = len(tokens)
    if not shifted:
        tops: list[dict[str, float] | None] = [None] + [_top(dists[j], k) for j in range(1, n)]
        own: list[float | None] = [None] + [dists[j][tokens[j]] for j in range(1, n)]
    else:  # entry i holds the distribution after token i, with token i forced in at that distribution's value
        tops = [None] + [{**_top(dists[i + 1], k), tokens[i]: dists[i + 1][tokens[i]]} for i in range(1, n - 1)]
        tops.append({tokens[-1]: -1.0})
        own = [None] + [dists[i + 1][tokens[i]] for i in range(1, n - 1)] + [-1.0]
    logprobs = {"tokens": tokens, "token_logprobs": own, "top_logprobs": tops, "text_offset": list(range(n))}
    return {"choices": [{"text": "".join(tokens), "logprobs": logprobs}], "usage": {"prompt_tokens": n}}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**9), st.integers(24, 120), st.integers(2, 8), st.booleans())
def test_echo_alignment_is_detected_and_undone(seed: int, n: int, k: int, shifted: bool) -> None:
    tokens, dists = _language(seed, n)
    parsed = parse_openai_echo(_echo(tokens, dists, k, shifted))
    assert parsed.shift == (1 if shifted else 0)
    assert parsed.tokens == tokens
    for j in range(2, n - 1):  # every position both readings cover: ground truth from the construction
        pos = parsed.positions[j]
        assert pos is not None and pos.token == tokens[j]
        assert _top(pos.top, k) == _top(dists[j], k)
        if tokens[j] in _top(dists[j], k) or not shifted:
            assert pos.logprob == pytest.approx(dists[j][tokens[j]])


def test_alignment_that_cannot_be_told_fails_loudly() -> None:
    tokens = ["a", "b"] * 10
    flat = {"a": math.log(0.5), "b": math.log(0.5)}
    tops: list[dict[str, float] | None] = [None] + [flat] * 19
    with pytest.raises(ProbeError, match="cannot tell how the server aligns"):
        detect_shift(tokens, tops)


def test_generation_logprobs_must_be_greedy_and_aligned() -> None:
    ok = {"choices": [{"logprobs": {"tokens": ["x", "y"], "token_logprobs": [-0.1, -0.2],
                                    "top_logprobs": [{"x": -0.1, "y": -3.0}, {"y": -0.2, "x": -2.0}]}}]}  # fmt: skip
    steps = parse_generation_logprobs(ok)
    assert [s.token for s in steps] == ["x", "y"] and steps[1].top == {"y": -0.2, "x": -2.0}
    bad = {"choices": [{"logprobs": {"tokens": ["x", "y"], "token_logprobs": [-3.0, -2.0],
                                     "top_logprobs": [{"y": -0.1, "x": -3.0}, {"z": -0.2, "y": -2.0}]}}]}  # fmt: skip
    with pytest.raises(ProbeError, match="not the argmax"):
        parse_generation_logprobs(bad)


def test_vllm_and_sglang_shapes() -> None:
    ids = [5, 6, 7]
    vllm = {"choices": [{"prompt_logprobs": [None, {"6": {"logprob": -0.5, "rank": 1}, "9": {"logprob": -1.5}},
                                             {"7": {"logprob": -2.0}, "5": {"logprob": -0.2}}]}]}  # fmt: skip
    parsed = parse_vllm_prompt_logprobs(vllm, ids)
    assert parsed.positions[1] is not None and parsed.positions[1].logprob == -0.5
    assert parsed.positions[2] is not None and parsed.positions[2].argmax() == "token_id:5"
    own = [[None, 5, None], [-0.5, 6, None], [-2.0, 7, None]]
    tops = [None, [[-0.5, 6, None]], [[-0.2, 5, None], [-2.0, 7, None]]]
    sglang = {"meta_info": {"input_token_logprobs": own, "input_top_logprobs": tops}}
    parsed = parse_sglang_generate(sglang, ids)
    assert parsed.positions[2] is not None and parsed.positions[2].logprob == -2.0
    assert parsed.positions[2].top == {"token_id:5": -0.2, "token_id:7": -2.0}
    with pytest.raises(ProbeError, match="another token"):
        parse_sglang_generate(sglang, [5, 6, 8])


def test_chat_answer_and_missing_fields() -> None:
    answer = parse_chat({"choices": [{"message": {"content": "42"}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 30, "completion_tokens": 2}})  # fmt: skip
    assert (answer.text, answer.prompt_tokens, answer.completion_tokens) == ("42", 30, 2)
    with pytest.raises(ServerError, match=r"lacks \['choices'\]\[0\]"):
        parse_chat({"choices": []})


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from(["choices", "message", "content", "logprobs", "tokens", "token_logprobs", "top_logprobs",
                        "usage", "prompt_tokens", "prompt_logprobs", "meta_info", "input_token_logprobs",
                        "input_top_logprobs", "logprob"])  # fmt: skip
SHAPED = st.recursive(
    st.none() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, SHAPED))
@example({"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": -math.inf}})
@example({"choices": [{"prompt_logprobs": [None, {"abc": {"logprob": 0}}, None]}]})
@example({"meta_info": {"input_token_logprobs": [[0, "x"]] * 3, "input_top_logprobs": [None, [[0, 1e309]], []]}})
def test_garbage_is_a_one_line_error_never_a_crash(data: Any) -> None:
    for parse in (
        parse_chat,
        parse_generation_logprobs,
        parse_openai_echo,
        lambda d: parse_vllm_prompt_logprobs(d, [1, 2, 3]),
        lambda d: parse_sglang_generate(d, [1, 2, 3]),
    ):
        try:
            parse(data)
        except SpeedtrapError as exc:
            assert "\n" not in exc.one_line()
