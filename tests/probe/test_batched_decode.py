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


@pytest.mark.parametrize("op", ["sigmoid", "exp", "rsqrt", "silu", "softplus"])
def test_an_elementwise_row_has_the_same_bits_at_any_multiple_of_8_rows(op: str) -> None:
    """The fact smol-moe's batched decode rests on (``BATCH_CACHE_ROWS``), checked on the machine that runs
    the tests: an elementwise op gives a row the same bits at 8-40 rows, at every row width smol-moe has.
    (At 4 rows of 4 values an AVX-512 CPU takes the scalar tail and the bits differ; AVX2 does not.)"""
    import torch
    import torch.nn.functional as F

    fn = {"sigmoid": torch.sigmoid, "exp": torch.exp, "rsqrt": torch.rsqrt, "silu": F.silu, "softplus": F.softplus}[op]
    gen = torch.Generator().manual_seed(0)
    for width in (4, 16, 24, 108, 576, 1428):
        x = torch.rand(40, width, generator=gen) + 0.5
        alone = torch.cat([fn(torch.cat([x[i : i + 1], x[:1].expand(7, width)]))[:1] for i in range(40)])
        for rows in (8, 16, 24, 40):
            assert torch.equal(fn(x[:rows]), alone[:rows]), (op, width, rows)
