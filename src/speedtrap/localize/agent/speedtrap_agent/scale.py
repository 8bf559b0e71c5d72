"""The scale check in the worker: the units holding a scalar, replayed at several values (Gram matrices)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .files import write_json, write_tensors
from .provenance import Provenance
from .ranks import rank_world
from .rows import float_tensors

if TYPE_CHECKING:
    from . import Agent

SHARED = re.compile(r"^shared_?(experts?|mlp)$")


def unit_of(name: str, children: dict[str, set[str]]) -> str | None:
    """The nearest module at or above ``name`` with an ``experts`` child (an MoE block), or None."""
    probe = name
    while True:
        if "experts" in children.get(probe, set()):
            return probe
        if not probe:
            return None
        probe = probe.rpartition(".")[0]


def shared_children(unit: Any) -> list[str]:
    return [n for n, _ in unit.named_children() if SHARED.match(n)]


# -- scale --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Site:
    name: str
    obj: Any
    unit: str | None


def find_sites(root: Any, param: str, nominal: float) -> tuple[list[Site], list[dict[str, Any]]]:
    """Objects holding ``param`` at ``nominal``: modules, and one level of their non-module attributes."""
    import torch

    children = {n: {c for c, _ in m.named_children()} for n, m in root.named_modules()}
    sites: list[Site] = []
    pinned: list[dict[str, Any]] = []
    seen: set[int] = set()
    for name, module in root.named_modules():
        holders = [(name, module)]
        for attr, obj in vars(module).items():
            if attr.startswith("_") or isinstance(obj, (torch.nn.Module, torch.Tensor, type)) or _plain(obj):
                continue
            holders.append((f"{name}.{attr}" if name else attr, obj))
        for holder_name, obj in holders:
            value = _own(obj, param)
            if value is None or id(obj) in seen:
                continue
            seen.add(id(obj))
            if math.isclose(value, nominal, rel_tol=1e-9):
                unit = unit_of(name, children)
                # a module outside any MoE block is its own unit; an object there is only varied along
                sites.append(Site(holder_name, obj, name if unit is None and obj is module else unit))
            elif obj is module:
                pinned.append({"module": holder_name, "value": value})
    return sites, pinned


def _plain(obj: Any) -> bool:
    return obj is None or isinstance(obj, (str, bytes, int, float, bool, list, tuple, dict, set, frozenset))


def _own(obj: Any, param: str) -> float | None:
    """``obj``'s own number ``param`` (an instance attribute or a dataclass field), else None."""
    fields = getattr(obj, "__dataclass_fields__", None)
    if not (param in getattr(obj, "__dict__", {}) or (fields is not None and param in fields)):
        return None
    value = getattr(obj, param, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _assign(obj: Any, param: str, value: float) -> None:
    try:
        setattr(obj, param, value)
    except (AttributeError, TypeError, dataclasses.FrozenInstanceError):
        object.__setattr__(obj, param, value)  # a frozen dataclass (SGLang's TopKConfig)


@contextlib.contextmanager
def assigned(objs: list[Any], param: str, value: float) -> Any:
    old = [getattr(o, param) for o in objs]
    try:
        for o in objs:
            _assign(o, param, value)
        yield
    finally:
        for o, v in zip(objs, old, strict=True):
            _assign(o, param, v)


def _clone(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, tuple):
        return tuple(_clone(v) for v in obj)
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj  # engine state (a forward batch): by reference, used right after the forward


def nominal_of(root: Any, param: str) -> float | None:
    config = getattr(root, "config", None)
    value = config.get(param) if isinstance(config, dict) else getattr(config, param, None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    values = [v for _, m in root.named_modules() if (v := _own(m, param)) is not None]
    return max(set(values), key=values.count) if values else None


def _keeper(into: list[Any]) -> Any:
    """A forward hook that keeps a copy of a module's first float output (engines reuse buffers)."""

    def hook(_module: Any, _args: Any, output: Any) -> None:
        into.extend(t.detach().clone() for t in float_tensors(output)[:1])

    return hook


class Scale:
    """Captures each unit's inputs on one forward, then replays the units at each value (same thread)."""

    def __init__(self, agent: Agent, command: dict[str, Any]) -> None:
        self.agent = agent
        self.id = str(command["id"])
        self.param = str(command["param"])
        root = agent.root
        nominal = command.get("nominal") or nominal_of(root, self.param)
        self.absent = ""  # why nothing can be measured (said in the result, not raised: a dense model has no factor)
        if nominal is None:
            self.absent = f"no config value or module attribute of {type(root).__name__} is named {self.param!r}"
            nominal, command = 0.0, {**command, "values": [], "multipliers": []}
        self.nominal = float(nominal)
        self.values = [float(v) for v in command.get("values") or [self.nominal * m for m in command["multipliers"]]]
        self.sites, self.pinned = find_sites(root, self.param, self.nominal)
        modules = dict(root.named_modules())
        order = list(modules)
        names = {s.unit for s in self.sites if s.unit is not None}
        children = {n: {c for c, _ in m.named_children()} for n, m in modules.items()}
        names |= {unit_of(p["module"], children) or p["module"] for p in self.pinned}
        self.units = sorted(names, key=order.index)
        self.modules = modules
        self.inputs: dict[str, tuple[Any, Any]] = {}
        # Under tensor or expert parallelism each rank's routed outputs (not only their Gram) go to the
        # harness, which combines a unit's contributions over the ranks (``scale.safetensors``).
        self.world = rank_world()[1]
        self.vectors: dict[str, Any] = {}
        self.handles = [modules[u].register_forward_pre_hook(self._pre(u), with_kwargs=True) for u in self.units]

    def _pre(self, name: str) -> Any:
        def hook(_module: Any, args: Any, kwargs: Any) -> None:
            if name not in self.inputs:
                self.inputs[name] = (_clone(args), _clone(dict(kwargs)))

        return hook

    def replay(self, out: Path) -> None:
        import torch

        for h in self.handles:
            h.remove()
        every = [s.obj for s in self.sites]
        units: list[dict[str, Any]] = []
        seconds = 0.0
        with torch.inference_mode():
            for name in self.units:
                if name not in self.inputs:
                    continue  # never ran on this input
                unit = self.modules[name]
                consumers = [s for s in self.sites if s.unit == name]
                entry: dict[str, Any] = {"module": name, "shared": shared_children(unit)}
                key = f"u{len(units)}"
                provenance = Provenance(self.values, self.nominal)
                pairs = [self._pair(unit, name, every, v, provenance.recording(i)) for i, v in enumerate(self.values)]
                ref = min(range(len(self.values)), key=lambda i: abs(self.values[i] - self.nominal))
                provenance.measure(
                    partial(self._routed, unit, name, every, self.values[ref]),
                    pairs[ref][0] - pairs[ref][1],
                    self.values[ref],
                )
                seconds += provenance.seconds
                entry["gram"] = self._gram(unit, name, every, key, pairs)
                entry["sites"] = provenance.to_json()
                entry["consumers"] = (
                    [
                        {"module": s.name, "gram": self._gram(unit, name, [s.obj], f"u{len(units)}.c{i}")}
                        for i, s in enumerate(consumers)
                    ]
                    if len(consumers) > 1
                    else [{"module": s.name, "gram": None} for s in consumers]
                )
                units.append(entry)
        if self.vectors:
            write_tensors(out / "scale", self.vectors)
        along = [s.name for s in self.sites if s.unit is None]
        write_json(out / "scale.json", {
            "param": self.param, "nominal": self.nominal, "values": self.values, "units": units,
            "pinned": self.pinned, "varied_along": along, "absent": self.absent,
            "provenance_seconds": round(seconds, 4),
        })  # fmt: skip

    def _gram(
        self, unit: Any, name: str, objs: list[Any], key: str, pairs: list[tuple[Any, Any]] | None = None
    ) -> list[list[float]]:
        """The routed outputs' Gram matrix over the values (``pairs``: already replayed)."""
        import torch

        pairs = pairs if pairs is not None else [self._pair(unit, name, objs, v) for v in self.values]
        output = torch.stack([p[0] for p in pairs])
        shared = torch.stack([p[1] for p in pairs])
        if self.world > 1:  # the output and the shared experts' apart: each may be replicated or a partial sum
            self.vectors[f"{key}.out"] = output.contiguous()
            self.vectors[f"{key}.shared"] = shared.contiguous()
        routed = output - shared
        return (routed @ routed.T).tolist()  # type: ignore[no-any-return]

    def _routed(self, unit: Any, name: str, objs: list[Any], value: float, context: Any = None) -> Any:
        """The unit's output minus its shared experts' at ``value`` (under ``context``: provenance), flat."""
        output, share = self._pair(unit, name, objs, value, context)
        return output - share

    def _pair(self, unit: Any, name: str, objs: list[Any], value: float, context: Any = None) -> tuple[Any, Any]:
        """The unit's output and its shared experts' (summed) at ``value``, under ``context``: flat, float64."""
        import torch

        args, kwargs = _clone(self.inputs[name])
        shared: list[Any] = []
        keep = _keeper(shared)
        hooks = [getattr(unit, n).register_forward_hook(keep) for n in shared_children(unit)]
        try:
            with assigned(objs, self.param, value), context or contextlib.nullcontext():
                result = float_tensors(unit(*args, **kwargs))
        finally:
            for h in hooks:
                h.remove()
        if not result:
            raise ValueError(f"module {name!r} returns no tensor")
        output = result[0].detach().double().clone()
        share = torch.zeros_like(output)
        for s in shared:
            share = share + s.double().reshape(output.shape)
        return output.reshape(-1), share.reshape(-1)
