"""Batched greedy decoding gives every sequence the tokens (and the logits, bit for bit) it gets alone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from speedtrap.probe import build_conversation
from speedtrap.probe._backend import STOP
from speedtrap.probe._engine import Engine, Generation, Request
from speedtrap.targets import InProcessModel


def _requests(model: InProcessModel, lengths: Sequence[int]) -> list[Request]:
    async def count(messages: list[dict[str, str]]) -> int:
        return len(model.chat_ids(messages))

    engine = Engine(model)
    out = []
    for i, n in enumerate(lengths):
        conv, _ = asyncio.run(build_conversation(f"c{i}", n, (0.3 + 0.1 * i,), 100 + i, count))
        # different token limits: sequences finish at different steps and drop out of the batch
        out.append(engine.chat_request(conv.messages(conv.facts[0]), 2 + 2 * i, STOP, top_k=4))
    return out


def _same(alone: list[Generation], together: list[Generation]) -> None:
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
        assert [(s.token, s.logprob, s.top) for s in a.steps] == [(s.token, s.logprob, s.top) for s in b.steps]


class _Counting:
    """Counts the model's batched decode steps and the rows they carried."""

    def __init__(self, model: InProcessModel) -> None:
        self.model, self.inner = model, model.decode_step
        self.steps: list[int] = []

    def __call__(self, tokens: Sequence[int], caches: Sequence[Any]) -> Any:
        self.steps.append(len(tokens))
        return self.inner(tokens, caches)


PATCHED = ("fp8_kv_cache", "hash_topk_routed_scaling", "moe_fused_experts")


@pytest.mark.parametrize("patches", [(), pytest.param(PATCHED, marks=pytest.mark.slow)])
def test_smolmoe_batched_decoding_is_one_at_a_time_bit_for_bit(smol: InProcessModel, patches: tuple[str, ...]) -> None:
    requests = _requests(smol, [96, 130, 100, 160, 110])
    engine = Engine(smol)
    alone = [engine.generate_many([r], patches)[0] for r in requests]
    counting = _Counting(smol)
    smol.decode_step = counting  # type: ignore[method-assign]
    try:
        together = engine.generate_many(requests, patches)
    finally:
        del smol.decode_step
    _same(alone, together)
    assert smol.batches
    assert max(counting.steps) == len(requests)  # all five in one forward a step ...
    assert counting.steps[-1] < len(requests)  # ... and the finished ones dropped out
    assert len(counting.steps) < sum(len(g.token_ids) for g in together)


def test_hf_batched_decoding_is_one_at_a_time() -> None:
    from speedtrap.targets import load_target

    model = load_target("hf:qwen3_moe")
    engine = Engine(model)
    requests = [Request(model.synthetic_ids(f"p{i}", 20 + 7 * i), 0, 3 + 2 * i, (), 4) for i in range(4)]
    alone = [engine.generate_many([r])[0] for r in requests]
    together = engine.generate_many(requests)
    _same(alone, together)
    assert [len(g.token_ids) for g in together] == [3, 5, 7, 9]
