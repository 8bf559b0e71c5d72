"""Rows: one per fed token, per module output; shared with the harness (SGLang dumper files are reduced alike)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .files import write_json, write_tensors
from .ranks import complete, declared, rank_world, shard_picks

if TYPE_CHECKING:
    from . import Agent

DEFAULT_CHANNELS = 256


# -- rows: one per fed token, shared with the harness (the SGLang dumper's files are reduced alike) --


def sample_index(features: int, channels: int) -> Any:
    """The fixed channel sample of a row of ``features``: all of them, or ``channels`` evenly spaced."""
    import torch

    if features <= channels:
        return None
    return torch.arange(channels, dtype=torch.long) * features // channels


def reduce_rows(rows: Any, channels: int) -> dict[str, Any]:
    """[R, F] rows -> sum of squares (float64), max |x| (float32) per row and the channel sample (float32)."""
    import torch

    floats = rows.float() if rows.dtype not in (torch.float32, torch.float64) else rows
    index = sample_index(rows.shape[1], channels)
    picked = floats if index is None else floats.index_select(1, index.to(rows.device))
    return {
        "sq": torch.linalg.vector_norm(floats, 2, dim=-1).double().square().cpu(),
        "max": floats.abs().amax(dim=-1).float().cpu() if rows.shape[1] else torch.zeros(rows.shape[0]),
        "x": picked.float().cpu().clone(),
    }


def reduce_for(rows: Any, channels: int, layout: dict[str, Any], world: int, rank: int) -> dict[str, Any]:
    """:func:`reduce_rows` of one rank's rows: a shard's sample is the full tensor's channels it holds
    (sum of squares and max |x| are its own: the harness adds and maxes them over the ranks)."""
    import torch

    if world <= 1 or layout.get("kind") != "sharded":
        return reduce_rows(rows, channels)
    _, local = shard_picks(list(layout["parts"]), world, rank, channels)
    out = reduce_rows(rows, rows.shape[1])  # every channel: then the sample's
    out["x"] = out["x"].index_select(1, torch.tensor(local, dtype=torch.long))
    return out


def float_tensors(obj: Any) -> list[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj] if obj.is_floating_point() else []
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in float_tensors(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in float_tensors(v)]
    return []


# -- the layout of one root forward: which output rows are which fed tokens ----------------------


@dataclasses.dataclass
class Layout:
    shape: tuple[int, ...]  # the fed ids' shape ([N] flat, or [B, T])
    positions: Any  # absolute position of each kept row (int64 [R])
    ids: Any  # fed token id of each kept row (int64 [R])
    keep: Any  # row indices kept (None: all)


def layout(engine: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Layout | None:
    """The rows of one root forward: SGLang and vLLM pass flat ``input_ids`` and ``positions``;
    ``speedtrap serve``'s model takes ``(input_ids [B, T], cache)`` (see :func:`embedded`)."""
    import torch

    ids = kwargs.get("input_ids", args[0] if args else None)
    if not isinstance(ids, torch.Tensor):
        return None
    if engine == "speedtrap":
        cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
        return embedded(ids, _starts(cache, ids))
    positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
    if not isinstance(positions, torch.Tensor):
        return None
    pos = positions[-1] if positions.dim() > 1 else positions  # M-RoPE: [3, N]
    return Layout(tuple(ids.shape), pos.reshape(-1).long().cpu().clone(), ids.reshape(-1).long().cpu().clone(), None)


def _starts(cache: Any, ids: Any) -> list[int]:
    """Each real sequence's first position: a batched decode's cache has one per sequence (padding rows dropped)."""
    caches = getattr(cache, "caches", None)
    if caches is not None:
        return [int(c.length) for c in caches]
    batch = 1 if ids.dim() == 1 else int(ids.shape[0])
    return [int(getattr(cache, "length", 0) or 0)] * batch


def embedded(ids: Any, starts: list[int]) -> Layout:
    """The layout of one step's ``ids`` [B, t] whose real sequences start at ``starts`` (B >= len(starts))."""
    import torch

    ids2 = ids.reshape(1, -1) if ids.dim() == 1 else ids
    t = int(ids2.shape[-1])
    pos = torch.tensor([s + i for s in starts for i in range(t)], dtype=torch.long)
    rows = len(starts) * t
    keep = None if rows == ids2.numel() else torch.arange(rows)
    flat = ids2.reshape(-1).long().cpu()
    return Layout(tuple(ids2.shape), pos, flat if keep is None else flat[keep], keep)


def as_rows(t: Any, lay: Layout) -> Any | None:
    """``t`` as [kept rows, features]: its leading dims are the fed ids', or (one sequence) one dim is its tokens."""
    n = len(lay.shape)
    if tuple(t.shape[:n]) == lay.shape:
        rows = t.reshape(math.prod(lay.shape), -1)
    elif n == 2 and lay.shape[0] == 1 and lay.shape[1] in tuple(t.shape):
        dim = tuple(t.shape).index(lay.shape[1])
        rows = t.movedim(dim, 0).reshape(lay.shape[1], -1)
    else:
        return None
    return rows if lay.keep is None else rows.index_select(0, lay.keep.to(rows.device))


def token_embedding(root: Any) -> Any:
    """The token embedding: the nn.Embedding with the largest table (its calls mark a step's tokens)."""
    import torch

    tables = [m for m in root.modules() if isinstance(m, torch.nn.Embedding)]
    return max(tables, key=lambda m: m.num_embeddings, default=None)


# -- capture ------------------------------------------------------------------------------------


class Capture:
    """Hooks on every module while armed; rows accumulated per (module, output tensor)."""

    def __init__(self, agent: Agent, command: dict[str, Any]) -> None:
        self.agent = agent
        self.id = str(command["id"])
        self.channels = int(command.get("channels", DEFAULT_CHANNELS))
        self.parts: dict[tuple[str, int], dict[str, list[Any]]] = {}
        self.features: dict[tuple[str, int], int] = {}
        self.skipped: set[str] = set()
        self.forwards: list[dict[str, Any]] = []
        self.layout: Layout | None = None
        self.calls: dict[str, int] = {}
        self.starts: list[int] = []
        self.offset = 0
        # Tensor parallelism: this rank, and each output's layout over the ranks (see ranks.py).
        self.rank, self.world = rank_world()
        self.layouts: dict[tuple[str, int], dict[str, Any]] = {}
        self.declared = {id(m): declared(m, self.world) for _, m in agent.root.named_modules()}
        self.outputs: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(tensor) -> (weakref, its layout)
        # A module object reachable under several names (vLLM and SGLang share one rotary embedding
        # across layers) is named by the call: the alias whose parent is the module now running.
        aliases: dict[int, list[str]] = {}
        for n, m in agent.root.named_modules(remove_duplicate=False):
            aliases.setdefault(id(m), []).append(n)
        self.running: list[str] = []
        self.handles = []
        for _, m in agent.root.named_modules():
            self.handles.append(m.register_forward_pre_hook(self._enter(aliases[id(m)])))
            self.handles.append(m.register_forward_hook(self._hook()))
        embedding = token_embedding(agent.root) if agent.engine == "speedtrap" else None
        if embedding is not None:  # a model that steps through its input in chunks inside one forward
            self.handles.append(embedding.register_forward_pre_hook(self._step))

    def begin(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.layout = layout(self.agent.engine, args, kwargs)
        self.calls = {}
        self.running = []
        self.outputs = {}
        if self.agent.engine == "speedtrap":
            cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.starts, self.offset = (_starts(cache, ids) if ids is not None else []), 0
        if self.layout is not None:
            pos = self.layout.positions
            self.forwards.append({"rows": int(pos.numel()), "first": int(pos.min()) if pos.numel() else -1})

    def _step(self, _module: Any, args: Any) -> None:
        ids = args[0] if args else None
        if self.layout is None or ids is None or not self.starts:
            return
        self.layout = embedded(ids, [s + self.offset for s in self.starts])
        self.offset += int(ids.shape[-1])

    def _enter(self, names: list[str]) -> Any:
        def pre_hook(_module: Any, _args: Any) -> None:
            name = names[0]
            if len(names) > 1 and self.running:
                parent = self.running[-1]
                name = next((n for n in names if n.rpartition(".")[0] == parent), name)
            self.running.append(name)

        return pre_hook

    def _hook(self) -> Any:
        def hook(module: Any, _args: Any, output: Any) -> None:
            name = self.running.pop() if self.running else ""
            lay = self.layout
            if lay is None:
                return
            occurrence = self.calls.get(name, 0)
            self.calls[name] = occurrence + 1
            for j, t in enumerate(float_tensors(output)):
                own = self._layout_of(module, t)
                rows = as_rows(t.detach(), lay)
                if rows is None:
                    self.skipped.add(name)
                    continue
                self.layouts.setdefault((name, j), complete(own, int(rows.shape[1])))
                self._add((name, j), rows, lay, occurrence)

        return hook

    def _layout_of(self, module: Any, t: Any) -> dict[str, Any]:
        """The class's layout; a module that hands on a child's output tensor as it is has that child's."""
        import weakref

        own = self.declared.get(id(module), {"kind": "auto"})
        if self.world <= 1:
            return own
        if own.get("kind") == "auto":
            seen = self.outputs.get(id(t))
            if seen is not None and seen[0]() is t:
                return seen[1]
        with contextlib.suppress(TypeError):  # a tensor subclass without weak references: nothing handed on
            self.outputs[id(t)] = (weakref.ref(t), own)
        return own

    def _reduce(self, key: tuple[str, int], rows: Any) -> dict[str, Any]:
        layout = self.layouts.get(key, {"kind": "replicated"})
        return reduce_for(rows, self.channels, layout, self.world, self.rank)

    def _add(self, key: tuple[str, int], rows: Any, lay: Layout, occurrence: int) -> None:
        import torch

        self.features.setdefault(key, int(rows.shape[1]))
        part = self.parts.setdefault(key, {"x": [], "sq": [], "max": [], "pos": [], "ids": [], "occ": [], "fwd": []})
        for k, v in self._reduce(key, rows).items():
            part[k].append(v)
        n = rows.shape[0]
        part["pos"].append(lay.positions)
        part["ids"].append(lay.ids)
        part["occ"].append(torch.full((n,), occurrence, dtype=torch.long))
        part["fwd"].append(torch.full((n,), len(self.forwards) - 1, dtype=torch.long))

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def finish(self, out: Path) -> None:
        import torch

        self.close()
        tensors: dict[str, Any] = {}
        modules = []
        for i, (key, part) in enumerate(self.parts.items()):
            modules.append({"key": f"m{i}", "name": key[0], "tensor": key[1], "features": self.features[key],
                            "layout": self.layouts.get(key, {"kind": "replicated"})})  # fmt: skip
            for k, v in part.items():
                tensors[f"m{i}.{k}"] = torch.cat(v).contiguous()
        meta = {
            "modules": modules,
            "forwards": self.forwards,
            "skipped": sorted(self.skipped),
            "channels": self.channels,
            "rank": self.rank,
            "world": self.world,
        }
        write_tensors(out / "capture", tensors)
        write_json(out / "capture.json", meta)
