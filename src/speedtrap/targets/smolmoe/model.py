"""smol-moe: SmolLM2-135M-Instruct rebuilt in DeepSeek-V4's shape, computing the same function.

Top-down: the model holds a scheduler, an embedding, decoder blocks and a head. Each block mixes
``hc_mult`` residual streams with hyper-connections (mHC), runs attention and an MoE MLP. The MoE
has a shared expert and routed experts that share one weight set (a slice of the dense MLP's
neurons); the first ``num_hash_layers`` layers route with a fixed token-id table (``HashTopK``), the
others by score (``TopKRouter``). ``routed_scaling_factor`` is applied exactly once, in the combine,
and the routed experts' down projection is divided by it, so the block equals the dense MLP.

Speed patches (``patches.py``) swap the modules named here; the model itself has no switches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speedtrap.targets.smolmoe.config import SmolMoEConfig


@dataclass
class LayerCache:
    """One layer's stored keys and values, shape [batch, kv_heads, tokens, head_dim]."""

    k: Tensor | None = None
    v: Tensor | None = None


@dataclass
class KVCache:
    layers: list[LayerCache] = field(default_factory=list)
    length: int = 0

    @classmethod
    def empty(cls, num_layers: int) -> KVCache:
        return cls([LayerCache() for _ in range(num_layers)], 0)

    def copy(self) -> KVCache:
        """A copy that can grow without changing this one (the tensors are shared, never mutated)."""
        return KVCache([LayerCache(c.k, c.v) for c in self.layers], self.length)


@dataclass
class RaggedCache:
    """The caches of several sequences decoded together, one token each a step: every sequence keeps its
    own unpadded cache and attends only to it, while the weight GEMMs run once for all rows.

    ``rows`` may exceed ``len(caches)``: the extra rows (padding, fed a copy of the first row's token)
    only give the GEMMs at least that many rows; they read no cache and store nothing.
    """

    caches: list[KVCache]
    rows: int
    layers: list[RaggedLayerCache] = field(init=False)

    def __post_init__(self) -> None:
        self.layers = [RaggedLayerCache([c.layers[i] for c in self.caches]) for i in range(len(self.caches[0].layers))]


@dataclass
class RaggedLayerCache:
    """One layer of a :class:`RaggedCache`: each sequence's own layer cache."""

    caches: list[LayerCache]


StepFn = Callable[[Tensor, "KVCache | RaggedCache | None"], Tensor]


class SmolMoE(nn.Module):
    def __init__(self, config: SmolMoEConfig) -> None:
        super().__init__()
        self.config = config
        self.scheduler: nn.Module = OneShotPrefill()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rope = RotaryEmbedding(config)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.head_hc = HyperHead(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head: nn.Module = LMHead(self.embed.weight)

    def forward(self, input_ids: Tensor, cache: KVCache | RaggedCache | None = None) -> Tensor:
        """Logits [batch, tokens, vocab] for ``input_ids``; ``cache`` (if given) grows in place."""
        result: Tensor = self.scheduler(self.step, input_ids, cache)
        return result

    def step(self, input_ids: Tensor, cache: KVCache | RaggedCache | None) -> Tensor:
        if isinstance(cache, RaggedCache):
            return self._ragged_step(input_ids, cache)
        start = cache.length if cache is not None else 0
        cos, sin = self.rope(start, input_ids.shape[1])
        return self._layers(input_ids, cos, sin, cache)

    def _ragged_step(self, input_ids: Tensor, cache: RaggedCache) -> Tensor:
        """One token for each sequence of ``cache`` (input_ids [rows, 1]), each at its own position."""
        starts = [c.length for c in cache.caches]
        starts += [starts[0]] * (cache.rows - len(starts))
        tables = [self.rope(s, 1) for s in starts]  # [1, head_dim] each
        cos = torch.stack([c for c, _ in tables]).unsqueeze(1)  # [rows, 1, 1, head_dim]: broadcast per row
        sin = torch.stack([s for _, s in tables]).unsqueeze(1)
        logits = self._layers(input_ids, cos, sin, cache)
        for c in cache.caches:
            c.length += 1
        return logits

    def _layers(self, input_ids: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | RaggedCache | None) -> Tensor:
        streams = self.embed(input_ids).unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1)
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layers[i] if cache is not None else None
            streams = layer(streams, input_ids, cos, sin, layer_cache)
        if isinstance(cache, KVCache):
            cache.length += input_ids.shape[1]
        logits: Tensor = self.lm_head(self.norm(self.head_hc(streams)))
        return logits

    def new_cache(self) -> KVCache:
        return KVCache.empty(self.config.num_layers)

    def batch_cache(self, caches: list[KVCache], rows: int) -> RaggedCache:
        """The cache of one decode step over ``caches`` together (see :class:`RaggedCache`)."""
        return RaggedCache(caches, rows)

    def blocks(self) -> list[Block]:
        return [cast(Block, block) for block in self.layers]


class OneShotPrefill(nn.Module):
    """Runs the whole input in one step."""

    def forward(self, step: StepFn, input_ids: Tensor, cache: KVCache | None) -> Tensor:
        return step(input_ids, cache)


class Block(nn.Module):
    def __init__(self, config: SmolMoEConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_hc = HyperConnection(config)
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config)
        self.mlp_hc = HyperConnection(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        is_hash = layer_idx < config.num_hash_layers
        self.mlp = MoE(config, HashTopK(config) if is_hash else TopKRouter(config))

    def forward(
        self, streams: Tensor, input_ids: Tensor, cos: Tensor, sin: Tensor, cache: LayerCache | RaggedLayerCache | None
    ) -> Tensor:
        post, comb, x = self.attn_hc(streams)
        streams = mix_streams(streams, post, comb, self.attn(self.attn_norm(x), cos, sin, cache))
        post, comb, x = self.mlp_hc(streams)
        return mix_streams(streams, post, comb, self.mlp(self.mlp_norm(x), input_ids))


def mix_streams(streams: Tensor, post: Tensor, comb: Tensor, out: Tensor) -> Tensor:
    """New streams: sum_j comb[j, i] * streams_j + post_i * out."""
    mixed = torch.matmul(comb.transpose(-1, -2), streams)
    return mixed + post.unsqueeze(-1) * out.unsqueeze(-2)


class HyperConnection(nn.Module):
    """mHC: pre/post/comb weights from a projection GEMM of the RMS-normed flattened streams.

    ``pre`` (sigmoid, normalized to sum 1) collapses the streams into the block input, ``post``
    (2 * sigmoid) spreads the block output over the streams, ``comb`` (softmax, then Sinkhorn to a
    doubly-stochastic matrix) mixes the streams. With identical streams, any such pre and comb give
    back the dense residual; the converted weights make ``post`` exactly 1.
    """

    def __init__(self, config: SmolMoEConfig) -> None:
        super().__init__()
        n = config.hc_mult
        self.hc_mult = n
        self.sinkhorn_iters = config.hc_sinkhorn_iters
        self.eps = config.rms_norm_eps
        self.proj = nn.Linear(n * config.hidden_size, (2 + n) * n)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, streams: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        n = self.hc_mult
        flat = streams.flatten(-2)
        flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.eps)
        mixes = self.proj(flat)
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre = torch.sigmoid(pre_w * self.scale[0])
        pre = pre / pre.sum(-1, keepdim=True)
        post = 2 * torch.sigmoid(post_w * self.scale[1])
        comb = torch.softmax((comb_w * self.scale[2]).unflatten(-1, (n, n)), dim=-1)
        for _ in range(self.sinkhorn_iters):
            comb = comb / comb.sum(-1, keepdim=True)
            comb = comb / comb.sum(-2, keepdim=True)
        collapsed = (pre.unsqueeze(-1) * streams).sum(-2)
        return post, comb, collapsed


class HyperHead(nn.Module):
    """The final collapse of the streams into one hidden state."""

    def __init__(self, config: SmolMoEConfig) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.proj = nn.Linear(config.hc_mult * config.hidden_size, config.hc_mult)

    def forward(self, streams: Tensor) -> Tensor:
        flat = streams.flatten(-2)
        flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.eps)
        pre = torch.sigmoid(self.proj(flat))
        pre = pre / pre.sum(-1, keepdim=True)
        return (pre.unsqueeze(-1) * streams).sum(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RotaryEmbedding(nn.Module):
    """A cos/sin table for every position, sliced per step."""

    def __init__(self, config: SmolMoEConfig) -> None:
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        angles = torch.outer(torch.arange(config.max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos_table", angles.cos().float(), persistent=False)
        self.register_buffer("sin_table", angles.sin().float(), persistent=False)

    def forward(self, start: int, length: int) -> tuple[Tensor, Tensor]:
        cos_table = cast(Tensor, self.cos_table)
        sin_table = cast(Tensor, self.sin_table)
        if start + length > cos_table.shape[0]:
            raise ValueError(f"position {start + length} is past the RoPE table ({cos_table.shape[0]})")
        return cos_table[start : start + length].float(), sin_table[start : start + length].float()


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: SmolMoEConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=False)
        self.kv_store = KVStore()

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: LayerCache | RaggedLayerCache | None) -> Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(cache, RaggedLayerCache):  # each sequence attends to its own cache, as it would alone
            outs = [self._attend(q[i : i + 1], k[i : i + 1], v[i : i + 1], c) for i, c in enumerate(cache.caches)]
            out = torch.cat([*outs, *([outs[0]] * (b - len(outs)))])  # padding rows: any finite values
        else:
            out = self._attend(q, k, v, cache)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, cache: LayerCache | None) -> Tensor:
        k_all, v_all = self.kv_store(k, v, cache)
        mask = causal_mask(q.shape[2], k_all.shape[2], q.device)
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)


def causal_mask(queries: int, keys: int, device: torch.device) -> Tensor:
    """Query i (the last ``queries`` of ``keys`` positions) sees keys up to its own position."""
    offset = keys - queries
    q_pos = torch.arange(queries, device=device).unsqueeze(1) + offset
    return torch.arange(keys, device=device).unsqueeze(0) <= q_pos


class KVStore(nn.Module):
    """Appends this step's keys and values to the cache and returns everything attended to."""

    def forward(self, k: Tensor, v: Tensor, cache: LayerCache | None) -> tuple[Tensor, Tensor]:
        if cache is None:
            return k, v
        if cache.k is not None and cache.v is not None:
            k = torch.cat([cache.k, k], dim=2)
            v = torch.cat([cache.v, v], dim=2)
        cache.k, cache.v = k, v
        return k, v


class MoE(nn.Module):
    """Routed experts (sharing one weight set) plus a shared expert, combined once."""

    def __init__(self, config: SmolMoEConfig, router: nn.Module) -> None:
        super().__init__()
        routed, shared = config.routed_neurons, config.intermediate_size - config.routed_neurons
        self.routed_scaling_factor = config.routed_scaling_factor
        self.gate = router
        self.experts = SharedWeightExperts(config.hidden_size, routed, config.num_experts)
        self.shared_expert = MLP(config.hidden_size, shared)

    def forward(self, x: Tensor, input_ids: Tensor) -> Tensor:
        weights, indices = self.gate(x, input_ids)
        routed = self.experts(x, weights, indices)
        return routed * self.routed_scaling_factor + self.shared_expert(x)


class HashTopK(nn.Module):
    """Expert choice from a fixed token-id table; sqrt-softplus scores weight them, renormalized."""

    def __init__(self, config: SmolMoEConfig, apply_routed_scaling_factor_on_output: bool = False) -> None:
        super().__init__()
        assert not apply_routed_scaling_factor_on_output, "not implemented"
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))
        self.register_buffer("tid2eid", torch.zeros(config.vocab_size, config.top_k, dtype=torch.long))

    def forward(self, x: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        scores = torch.sqrt(F.softplus(F.linear(x, self.weight)))
        tid2eid = cast(Tensor, self.tid2eid)
        indices = tid2eid[input_ids]
        weights = scores.gather(-1, indices)
        return weights / weights.sum(-1, keepdim=True), indices


class TopKRouter(nn.Module):
    """The top-k experts by sqrt-softplus score, renormalized."""

    def __init__(self, config: SmolMoEConfig) -> None:
        super().__init__()
        self.top_k = config.top_k
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        scores = torch.sqrt(F.softplus(F.linear(x, self.weight)))
        weights, indices = scores.topk(self.top_k, dim=-1)
        return weights / weights.sum(-1, keepdim=True), indices


class SharedWeightExperts(nn.Module):
    """``num_experts`` experts that share one SwiGLU MLP's weights.

    Dispatch as a grouped-GEMM MoE does it: (token, slot) pairs are permuted into expert order,
    run through the experts (one GEMM, since every group has the same weights), weighted by their
    gate and scattered back onto their tokens.
    """

    def __init__(self, hidden: int, intermediate: int, num_experts: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x: Tensor, weights: Tensor, indices: Tensor) -> Tensor:
        flat_x = x.reshape(-1, x.shape[-1])
        top_k = indices.shape[-1]
        order = indices.reshape(-1).argsort(stable=True)
        token = order // top_k
        rows = self.mlp(flat_x[token]) * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(flat_x).index_add_(0, token, rows).view_as(x)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LMHead(nn.Module):
    """Logits from the tied embedding matrix."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.weight = cast(nn.Parameter, weight)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)
