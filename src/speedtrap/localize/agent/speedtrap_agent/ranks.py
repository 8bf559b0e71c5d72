"""Ranks: which tensor-parallel rank this worker is, and how each module's output is laid out over the ranks.

A layout (a small dict, written into the capture's header) is one of:

- ``replicated``: every rank holds the whole tensor (a norm, an all-reduced row-parallel output);
- ``sharded``: the last dim is split over the ranks, block by block (``parts``: this rank's size of
  each block, in order; column-parallel ``qkv_proj`` has three blocks q, k, v, ``gate_up_proj`` two),
  so the full tensor is each block's rank slices concatenated in rank order;
- ``partial``: every rank holds a summand of the whole tensor (a row-parallel or MoE output whose
  all-reduce comes later: ``reduce_results`` False);
- ``auto``: not declared by the module's class; the harness calls it replicated when the ranks agree.

The channel sample of a sharded output is the full tensor's sample (the same global channels as at
one rank): each rank keeps the sampled channels it holds, so the harness can put the sample back together.
"""

from __future__ import annotations

import bisect
import sys
from typing import Any

# The engines' own tensor-parallel group (the global rank is not the TP rank under data or pipeline parallelism).
_TP_GROUP = (
    ("vllm.distributed.parallel_state", "get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size"),
    ("sglang.srt.distributed.parallel_state", "get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size"),
)


def rank_world() -> tuple[int, int]:
    """This process's tensor-parallel rank and size: the engine's TP group, else torch.distributed's, else (0, 1)."""
    for module, rank, size in _TP_GROUP:
        found = sys.modules.get(module)
        if found is None:
            continue
        try:
            return int(getattr(found, rank)()), int(getattr(found, size)())
        except Exception:  # the group is not initialized in this process
            continue
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        pass
    return 0, 1


def _classes(module: Any) -> set[str]:
    return {c.__name__ for c in type(module).__mro__}


def declared(module: Any, world: int) -> dict[str, Any]:
    """The layout of ``module``'s output that its class declares (``auto`` when it declares none)."""
    if world <= 1:
        return {"kind": "replicated"}
    names = _classes(module)
    reduce = getattr(module, "reduce_results", None)
    if "QKVParallelLinear" in names:
        dims = [getattr(module, a, None) for a in ("num_heads", "num_kv_heads", "head_size")]
        dims.append(getattr(module, "v_head_size", dims[2]))
        if getattr(module, "num_kv_head_replicas", 1) != 1 or not all(isinstance(v, int) for v in dims):
            return {"kind": "auto"}  # KV heads repeated over ranks: not one slice per rank
        heads, kv, size, v_size = (int(v) for v in dims)  # type: ignore[arg-type]
        return {"kind": "sharded", "parts": [heads * size, kv * size, kv * v_size]}
    if names & {"ColumnParallelLinear", "MergedColumnParallelLinear"}:
        if getattr(module, "gather_output", False):
            return {"kind": "replicated"}
        sizes = getattr(module, "output_sizes", None)
        if isinstance(sizes, (list, tuple)) and len(sizes) > 1 and all(int(s) % world == 0 for s in sizes):
            return {"kind": "sharded", "parts": [int(s) // world for s in sizes]}
        return {"kind": "sharded", "parts": None}
    if "ParallelLMHead" in names:
        return {"kind": "auto"}
    if "VocabParallelEmbedding" in names or "ReplicatedLinear" in names:
        return {"kind": "replicated"}
    if reduce is True:
        return {"kind": "replicated"}
    if reduce is False:
        return {"kind": "partial"}
    if names & {"Attention", "RadixAttention"}:
        return {"kind": "sharded", "parts": None}  # [tokens, local heads x head size]
    if any("Norm" in n for n in names):  # a norm over the whole row; a per-head one (q_norm) sees its rank's heads
        weight = getattr(module, "weight", None)
        return {"kind": "replicated", "width": int(weight.numel())} if weight is not None else {"kind": "auto"}
    return {"kind": "auto"}


def complete(layout: dict[str, Any], features: int) -> dict[str, Any]:
    """A sharded layout with one block of this rank's ``features`` when the class left the blocks open; a
    norm's (``width``: its weight's size) is replicated only when it normalizes whole rows."""
    if "width" in layout:
        return {"kind": "replicated"} if layout["width"] == features else {"kind": "auto"}
    if layout.get("kind") == "sharded" and (not layout.get("parts") or sum(layout["parts"]) != features):
        return {"kind": "sharded", "parts": [features]}
    return layout


def shard_picks(parts: list[int], world: int, rank: int, channels: int) -> tuple[list[int], list[int]]:
    """The full tensor's channel sample that ``rank`` holds: (global channel, this rank's channel) pairs.

    Full layout: block ``p`` of ``parts[p] * world`` channels, rank ``r`` holding its slice
    ``[r * parts[p], (r + 1) * parts[p])``; the sample is :func:`rows.sample_index` of the full width.
    """
    full = [p * world for p in parts]
    width = sum(full)
    sample = range(width) if width <= channels else (i * width // channels for i in range(channels))
    full_off = [sum(full[:i]) for i in range(len(full))]
    local_off = [sum(parts[:i]) for i in range(len(parts))]
    glob: list[int] = []
    local: list[int] = []
    for g in sample:
        block = bisect.bisect_right(full_off, g) - 1
        offset = g - full_off[block]
        if offset // parts[block] == rank:
            glob.append(g)
            local.append(local_off[block] + offset % parts[block])
    return glob, local
