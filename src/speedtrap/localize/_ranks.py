"""Every rank of a tensor- or expert-parallel server: one capture per rank, put back together per tensor.

Each rank's capture records its rank, the world size and each output's layout (see
``agent/speedtrap_agent/ranks.py``). :func:`merge_ranks` builds the unsharded view, as SGLang's
comparator does per parallel axis: a sharded output's blocks are concatenated in rank order (its
channel sample is the full tensor's), a partial one is summed, a replicated one is checked to agree
over the ranks (a disagreement is named: role, rank, module; rank 0's rows are kept, never an average),
and an undeclared one is replicated when the ranks agree, else rank-local (compared rank by rank only).
:func:`combine_scale` combines each MoE unit's routed outputs over the ranks that hold its experts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from speedtrap._errors import ServerError
from speedtrap.localize._capture import REPLICATED, Capture, ModuleRows
from speedtrap.localize.agent.speedtrap_agent import shard_picks

AGREE = 1e-5  # the relative difference under which two ranks hold the same tensor
_KEYS = ("pos", "ids", "occ", "fwd")


def rel(a: Tensor, b: Tensor) -> float:
    """||a - b|| / ||b|| (float64; 0 when both are zero)."""
    a64, b64 = a.double(), b.double()
    base = float(torch.linalg.vector_norm(b64))
    diff = float(torch.linalg.vector_norm(a64 - b64))
    return diff / base if base > 0 else (0.0 if diff == 0 else float("inf"))


def merge_ranks(ranks: Sequence[Capture]) -> Capture:
    """Every rank's capture of one request -> one capture of the whole tensors, the ranks kept beside it."""
    ranks = sorted(ranks, key=lambda c: c.rank)
    world = len(ranks)
    if world == 1 and ranks[0].world == 1:
        return ranks[0]
    if [c.rank for c in ranks] != list(range(world)) or any(c.world != world for c in ranks):
        seen = ", ".join(f"rank {c.rank} of {c.world}" for c in ranks)
        raise ServerError(
            f"the {ranks[0].role} server's captures are not one per rank ({seen})",
            "capture again once every rank's agent has attached",
        )
    tables = [{(m.name, m.tensor): m for m in c.modules} for c in ranks]
    head = ranks[0]
    modules: list[ModuleRows] = []
    disagree: list[dict[str, Any]] = []
    local: list[str] = []
    for m0 in ranks[0].modules:
        key = (m0.name, m0.tensor)
        parts = [t.get(key) for t in tables]
        found = [p for p in parts if p is not None]
        merged = _merge(head.role, found, head.channels, disagree) if len(found) == world else None
        if merged is None:
            local += [] if m0.name in local else [m0.name]
        else:
            modules.append(merged)
    summary = {"world": world, "disagree": disagree, "rank_local": local, "per_rank": [_cost(c) for c in ranks]}
    return replace(
        head, modules=tuple(modules), skipped=tuple(sorted({s for c in ranks for s in c.skipped})),
        raw_bytes=sum(c.raw_bytes for c in ranks), extra={**head.extra, "ranks": summary}, rank=0, world=world,
        ranks=tuple(ranks),
    )  # fmt: skip


def _cost(capture: Capture) -> dict[str, Any]:
    held = sum(t.numel() * t.element_size() for m in capture.modules for t in m.rows.values())
    return {"rank": capture.rank, "raw_bytes": capture.raw_bytes, "row_bytes": held, "seconds": capture.seconds}


def _merge(role: str, parts: list[ModuleRows], channels: int, disagree: list[dict[str, Any]]) -> ModuleRows | None:
    """One module over the ranks, or None when it is rank-local (no way to put it back together)."""
    first = parts[0]
    if any(p.layout != first.layout or p.features != first.features for p in parts):
        return None
    if any(not torch.equal(p.rows[k], first.rows[k]) for p in parts[1:] for k in _KEYS):
        return None  # the ranks saw different rows (another batch): not one tensor
    kind = first.layout.kind
    if kind == "sharded":
        return _concat(parts, channels)
    if kind == "partial":
        return _sum(parts)
    diffs = [rel(p.rows["x"], first.rows["x"]) for p in parts]
    if all(d <= AGREE for d in diffs):
        return replace(first, layout=REPLICATED)
    if kind == "auto":
        return None
    for rank, d in enumerate(diffs):
        if d > AGREE:
            disagree.append({"role": role, "rank": rank, "module": first.name, "rel_diff": d})
    return replace(first, layout=REPLICATED)  # rank 0's rows, the disagreement named, never averaged


def _concat(parts: list[ModuleRows], channels: int) -> ModuleRows:
    world = len(parts)
    layout = parts[0].layout
    full = sum(layout.parts) * world
    glob = [g for r in range(world) for g in shard_picks(list(layout.parts), world, r, channels)[0]]
    order = torch.tensor(sorted(range(len(glob)), key=glob.__getitem__), dtype=torch.long)
    x = torch.cat([p.rows["x"] for p in parts], dim=1).index_select(1, order)
    rows = {**parts[0].rows, "x": x.contiguous()}
    rows["sq"] = torch.stack([p.rows["sq"] for p in parts]).sum(0)
    rows["max"] = torch.stack([p.rows["max"] for p in parts]).amax(0)
    return ModuleRows(parts[0].name, parts[0].tensor, full, rows, REPLICATED)


def _sum(parts: list[ModuleRows]) -> ModuleRows:
    x = torch.stack([p.rows["x"].double() for p in parts]).sum(0)
    rows = {**parts[0].rows, "x": x.float().contiguous()}
    if parts[0].features <= x.shape[1]:  # every channel kept: the whole row's statistics are exact
        rows["sq"] = x.square().sum(1)
        rows["max"] = x.abs().amax(1).float() if x.shape[1] else torch.zeros(x.shape[0])
    else:  # not measured: the sum of a sample says nothing of the channels left out
        rows["sq"] = torch.full_like(parts[0].rows["sq"], float("nan"))
        rows["max"] = torch.full_like(parts[0].rows["max"], float("nan"))
    return ModuleRows(parts[0].name, parts[0].tensor, parts[0].features, rows, REPLICATED)


def rank_pairs(base: Capture, trial: Capture) -> list[tuple[Capture, Capture]]:
    """Rank by rank when both were captured at one world size (the layouts agree), else the unsharded views."""
    if base.ranks and trial.ranks and base.world == trial.world:
        return list(zip(base.ranks, trial.ranks, strict=True))
    return [(base, trial)]


def rank_notes(capture: Capture) -> dict[str, list[str]]:
    """Per module: the ranks that disagree on a replicated output (role, rank), in words."""
    notes: dict[str, list[str]] = {}
    for d in capture.extra.get("ranks", {}).get("disagree", []):
        text = f"{d['role']} rank {d['rank']} disagrees with rank 0 on this replicated output"
        text += f" (rel diff {d['rel_diff']:.3g})"
        notes.setdefault(str(d["module"]), []).append(text)
    return notes


def combine_scale(per_rank: Sequence[tuple[int, dict[str, Any], dict[str, Tensor]]]) -> dict[str, Any]:
    """Every rank's scale result -> one: each unit's routed outputs combined over the ranks, said in ``over_ranks``.

    ``per_rank``: (rank, its ``scale.json``, its tensors: ``u<i>.out`` / ``u<i>.shared`` (and ``u<i>.c<j>.*`` per
    consumer), one row per value). The unit's output and its shared experts' output are combined apart, each
    as its ranks hold it: the same on every rank (all-reduced inside the unit: replicated) is taken once,
    else each rank holds a part (its experts under expert parallelism, its slice of each expert under tensor
    parallelism, the all-reduce coming later) and the parts are summed. The routed contribution is the
    combined output minus the combined shared output; the Gram matrix is the routed contribution's.
    """
    per_rank = sorted(per_rank, key=lambda t: t[0])
    _, head, _ = per_rank[0]
    if len(per_rank) == 1:
        return head
    names = [[u["module"] for u in data["units"]] for _, data, _ in per_rank]
    if any(n != names[0] for n in names):
        raise ValueError("the ranks replayed different MoE units")
    ranks = ", ".join(str(r) for r, _, _ in per_rank)
    units = []
    for i, entry in enumerate(head["units"]):
        gram, how = _combined([vec for _, _, vec in per_rank], f"u{i}")
        consumers = []
        for j, consumer in enumerate(entry["consumers"]):
            sub = None if consumer["gram"] is None else _combined([vec for _, _, vec in per_rank], f"u{i}.c{j}")[0]
            consumers.append({**consumer, "gram": sub})
        over = f", {how} over ranks {ranks}"
        units.append({**entry, "gram": gram, "consumers": consumers, "over_ranks": over})
    seconds = [d["provenance_seconds"] for _, d, _ in per_rank if d.get("provenance_seconds") is not None]
    # the factor's sites are source lines, the same on every rank: the first rank's are kept; its cost is the
    # slowest rank's (the ranks replay at once)
    return {**head, "units": units, **({"provenance_seconds": max(seconds)} if seconds else {})}


def _combined(per_rank: list[dict[str, Tensor]], key: str) -> tuple[list[list[float]], str]:
    output, out_how = _over_ranks([v[f"{key}.out"] for v in per_rank])
    shared, shared_how = _over_ranks([v[f"{key}.shared"] for v in per_rank])
    routed = output - shared
    how = f"output {out_how}" + ("" if not bool(shared.any()) else f", shared experts {shared_how}")
    return (routed @ routed.T).tolist(), how


def _over_ranks(stacks: list[Tensor]) -> tuple[Tensor, str]:
    first = stacks[0].double()
    if any(s.shape != first.shape for s in stacks):
        raise ValueError("the ranks' outputs of one unit differ in shape")
    if all(rel(s, first) <= AGREE for s in stacks[1:]):
        return first, "the same on every rank (taken once)"
    return torch.stack([s.double() for s in stacks]).sum(0), "summed (each rank holds a part)"
