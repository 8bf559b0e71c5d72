"""Lockstep decoding (models without their own batched decode: ``hf:`` targets, a user's model) gives
every sequence the logits, bit for bit, that it gets alone, while the weight GEMMs run once a step for all.

Ground truth: each request decoded alone through the same engine (one sequence a step).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speedtrap.patching import Patch, PatchInfo
from speedtrap.probe._engine import Engine, Generation, Request
from speedtrap.targets import InProcessModel, LockstepStats, load_target
from speedtrap.targets._lockstep import lockstep


def _requests(model: InProcessModel, n: int = 5) -> list[Request]:
    """Prompts of 11-47 tokens with token limits 2-10: the sequences drop out at different steps."""
    return [Request(model.synthetic_ids(f"prompt {i}", 11 + 9 * i), 0, 2 + 2 * i, (), 4) for i in range(n)]


def _same(alone: list[Generation], together: list[Generation]) -> None:
    for a, b in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert [(s.token, s.logprob, s.top) for s in a.steps] == [(s.token, s.logprob, s.top) for s in b.steps]


@dataclasses.dataclass
class _Run:
    alone: list[Generation]
    together: list[Generation]
    step_sizes: list[int]  # sequences per decode_step of the batched run
    stats: LockstepStats  # GEMMs and F.linear / grouped calls of the batched run


def _alone_and_together(model: InProcessModel) -> _Run:
    requests = _requests(model)
    engine = Engine(model)
    alone = [engine.generate_many([r])[0] for r in requests]
    sizes: list[int] = []
    inner = model.decode_step

    def counting(tokens: Sequence[int], caches: Sequence[Any]) -> Tensor:
        sizes.append(len(tokens))
        return inner(tokens, caches)

    model.lockstep_stats = LockstepStats()
    model.decode_step = counting  # type: ignore[method-assign]
    try:
        together = engine.generate_many(requests)
    finally:
        del model.decode_step
    return _Run(alone, together, sizes, model.lockstep_stats)


def _check_batched(run: _Run, head: Tensor) -> None:
    _same(run.alone, run.together)
    assert [len(g.steps) for g in run.together] == [2, 4, 6, 8, 10]  # every step's top-4 compared
    assert max(run.step_sizes) == 5 and run.step_sizes[-1] == 1  # all five a step, then they drop out
    assert run.stats.reads[head.data_ptr()] == len(run.step_sizes)  # the head: one GEMM a step for all
    assert run.stats.gemms < run.stats.calls  # and the other weights' reads are shared too


@pytest.mark.parametrize("spec", ["hf:qwen3_moe", "hf:deepseek_v3", "hf:deepseek_v4", "hf:mixtral"])
def test_hf_lockstep_decoding_is_one_at_a_time_bit_for_bit(spec: str) -> None:
    model = load_target(spec)
    run = _alone_and_together(model)
    assert model.batches
    _check_batched(run, model.model.hf.lm_head.weight)


def test_a_saved_model_directory_batches_bit_for_bit(tmp_path: Path) -> None:
    """A user's own transformers model, as ``hf:<directory>`` loads it (a tiny Llama saved here)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = load_target(f"hf:{tmp_path}")
    run = _alone_and_together(model)
    assert model.batches
    _check_batched(run, model.model.hf.lm_head.weight)


# More of the model kinds the venv's transformers ships, built from tiny configs (as hf:<directory> would
# load them once saved): dense, sliding-window, MoE with other expert layouts, GPT-2's Conv1D (its GEMMs
# are addmm, not F.linear: not shared, still exact; only the head's reads are).
_KINDS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "mistral": {},
    "gemma2": {"head_dim": 16, "sliding_window": 8},
    "olmoe": {"num_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 32},
    "granitemoe": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16, "sliding_window": 8},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256},
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_more_transformers_kinds_batch_bit_for_bit(kind: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from speedtrap.targets.hf import HFCausalLM

    base = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
            "initializer_range": 0.2, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}  # fmt: skip
    config = AutoConfig.for_model(kind, **(base | _KINDS[kind]))
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(config).float().eval().requires_grad_(False)
    model = InProcessModel(f"hf:{kind}", HFCausalLM(hf), None, [], {"vocab_size": 128})
    run = _alone_and_together(model)
    assert model.batches
    _check_batched(run, hf.lm_head.weight)


# -- a user's own nn.Module (the Target protocol, not transformers) -----------------------------------


@dataclasses.dataclass
class _ListCache:
    k: Tensor | None = None
    v: Tensor | None = None


class TinyUserLM(nn.Module):
    """A user's decoder: one attention layer over its own cache, then top-1 routed experts (a loop over
    an ``nn.ModuleList``, each expert a row-subset GEMM). ``stateful`` adds a forward counter kept in a
    buffer (state shared by every sequence: lockstep must not batch it)."""

    def __init__(self, vocab: int = 97, d: int = 32, experts: int = 4, stateful: bool = False) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            self.embed = nn.Embedding(vocab, d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.o = nn.Linear(d, d, bias=False)
            self.router = nn.Linear(d, experts)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d)) for _ in range(experts)
            )
            self.head = nn.Linear(d, vocab, bias=False)
        self.stateful = stateful
        self.register_buffer("forwards", torch.zeros(()))

    def forward(self, input_ids: Tensor, cache: _ListCache | None = None) -> Tensor:
        if self.stateful:
            self.forwards.add_(1)
        x = self.embed(input_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if cache is not None:
            if cache.k is not None and cache.v is not None:
                k, v = torch.cat([cache.k, k], 1), torch.cat([cache.v, v], 1)
            cache.k, cache.v = k, v
        t, n = q.shape[1], k.shape[1]
        mask = torch.arange(n).unsqueeze(0) <= torch.arange(t).unsqueeze(1) + (n - t)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        x = x + self.o(scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v)
        weight, chosen = F.softmax(self.router(x), dim=-1).max(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = chosen == e
            if bool(rows.any()):
                out[rows] = expert(x[rows]) * weight[rows].unsqueeze(-1)
        result: Tensor = self.head(x + out)
        return result

    def new_cache(self) -> _ListCache:
        return _ListCache()


@dataclasses.dataclass
class _UserTarget:
    stateful: bool = False
    name: str = "my-model"
    description: str = "a user's nn.Module"
    chats: bool = False

    def patch_infos(self) -> list[PatchInfo]:
        return []

    def load(self, overrides: Mapping[str, str] | None = None, extra_patches: Sequence[Patch] = ()) -> InProcessModel:
        model = TinyUserLM(stateful=self.stateful).eval().requires_grad_(False)
        return InProcessModel(self.name, model, None, list(extra_patches), {"vocab_size": 97})


def test_a_users_own_module_batches_bit_for_bit() -> None:
    model = load_target(_UserTarget())
    run = _alone_and_together(model)
    assert model.batches
    _check_batched(run, model.model.head.weight)


def test_a_model_that_keeps_state_decodes_one_at_a_time() -> None:
    """A forward that changes module state (a counter buffer) could make a sequence's result depend on
    its neighbours: the first decode step sees it, and every later step runs its sequences one by one."""
    model = load_target(_UserTarget(stateful=True))
    run = _alone_and_together(model)
    assert not model.batches
    assert max(run.step_sizes) == 5  # the engine still hands over all five ...
    assert run.stats.gemms == run.stats.calls  # ... but no GEMM served two sequences
    _same(run.alone, run.together)


def test_a_rope_that_rebuilds_its_table_is_not_batched() -> None:
    model = load_target("hf:qwen3_moe")
    assert model.batches
    rope = model.model.hf.model.rotary_emb
    rope.rope_type = "dynamic"
    assert not model.batches


def test_gemms_on_unpadded_rows_would_change_the_bits() -> None:
    """Why every GEMM runs on a multiple of 4 rows: with the rows as they come (1 alone, 5 together), a
    batch changes a sequence's logits, and this file's comparisons see it."""
    model = load_target("hf:qwen3_moe")

    def steps(rows: int, together: bool) -> list[Tensor]:
        caches = [model.new_cache() for _ in range(5)]
        tokens = [
            int(model.logits(model.synthetic_ids(f"p{i}", 11 + 9 * i), c)[-1].argmax()) for i, c in enumerate(caches)
        ]
        calls = [
            lambda t=t, c=c: model.model(torch.tensor([[t]]), c)[0, -1] for t, c in zip(tokens, caches, strict=True)
        ]
        if together:
            return lockstep(calls, rows=rows)
        return [lockstep([call], rows=rows)[0] for call in calls]

    assert all(torch.equal(a, b) for a, b in zip(steps(4, False), steps(4, True), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(steps(1, False), steps(1, True), strict=True))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_gemm_row_has_the_same_bits_at_any_position_of_any_multiple_of_4_rows(threads: int) -> None:
    """The measured fact lockstep rests on, checked on the machine that runs the tests: a row of
    ``F.linear`` alone (padded to 4 rows) equals the same row at every position of 4-40 rows, for weight
    shapes like the tiny targets' and a real model's head."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        for n, k in [(8, 64), (128, 64), (96, 32), (1024, 768), (8192, 576)]:
            w, x = torch.randn(n, k, generator=gen), torch.randn(40, k, generator=gen)
            alone = torch.cat([F.linear(torch.cat([x[i : i + 1], x.new_zeros(3, k)]), w)[:1] for i in range(40)])
            for rows in (4, 8, 12, 20, 28, 40):
                assert torch.equal(F.linear(x[:rows], w), alone[:rows]), (n, k, rows)
            assert not torch.equal(F.linear(x[:1], w), alone[:1])  # one row alone takes another kernel
    finally:
        torch.set_num_threads(before)
