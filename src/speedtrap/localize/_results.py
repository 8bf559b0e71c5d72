"""Typed results of the localizer, with ``to_json()`` / ``from_json()``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from speedtrap._shapes import LayerGrowth

_LAYER = re.compile(r"(?:^|\.)(\d+)(?=\.|$)")


def layer_of(name: str) -> int | None:
    """The layer index in a module name: its first numeric component (``model.layers.5.mlp`` -> 5)."""
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


def layer_prefix(name: str) -> str | None:
    """``model.layers.5.mlp.gate`` -> ``model.layers.5`` (the block module), or None."""
    match = _LAYER.search(name)
    return name[: match.end()] if match else None


def _tuple_floats(values: Sequence[Any]) -> tuple[float | None, ...]:
    return tuple(None if v is None else float(v) for v in values)


# -- layer diff ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleDiff:
    """One module's comparison over every call of the run (execution order of the patched run).

    ``status``: ``compared``; ``mismatch`` (outputs of different shapes: another dispatch, not
    comparable element by element); ``patched_only`` / ``baseline_only`` (no counterpart).
    """

    name: str
    layer: int | None
    status: str
    calls: int
    compared: int
    rel_diff: float | None = None
    max_abs_diff: float | None = None
    cosine: float | None = None
    bucket_rel_diff: tuple[float | None, ...] = ()
    note: str = ""

    def diverged(self, threshold: float) -> bool:
        return self.rel_diff is not None and self.rel_diff > threshold

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layer": self.layer,
            "status": self.status,
            "calls": self.calls,
            "compared": self.compared,
            "rel_diff": self.rel_diff,
            "max_abs_diff": self.max_abs_diff,
            "cosine": self.cosine,
            "bucket_rel_diff": list(self.bucket_rel_diff),
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModuleDiff:
        return cls(
            name=str(data["name"]),
            layer=None if data.get("layer") is None else int(data["layer"]),
            status=str(data["status"]),
            calls=int(data["calls"]),
            compared=int(data["compared"]),
            rel_diff=data.get("rel_diff"),
            max_abs_diff=data.get("max_abs_diff"),
            cosine=data.get("cosine"),
            bucket_rel_diff=_tuple_floats(data.get("bucket_rel_diff", [])),
            note=str(data.get("note", "")),
        )


@dataclass(frozen=True)
class LayerDiffResult:
    target: str
    patches: tuple[str, ...]
    baseline: tuple[str, ...]
    tokens: int
    decode_tokens: int
    threshold: float
    position_edges: tuple[int, ...]
    modules: tuple[ModuleDiff, ...]
    first_divergent: str | None
    growth: tuple[LayerGrowth, ...] = field(default=())

    def module(self, name: str) -> ModuleDiff:
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(name)

    def over_threshold(self) -> list[ModuleDiff]:
        return [m for m in self.modules if m.diverged(self.threshold)]

    def to_json(self) -> dict[str, Any]:
        first = self.module(self.first_divergent) if self.first_divergent else None
        return {
            "kind": "layer_diff",
            "target": self.target,
            "patches": list(self.patches),
            "baseline": list(self.baseline),
            "tokens": self.tokens,
            "decode_tokens": self.decode_tokens,
            "threshold": self.threshold,
            "position_edges": list(self.position_edges),
            "first_divergent": self.first_divergent,
            "first_divergent_detail": first.to_json() if first else None,
            "modules_over_threshold": len(self.over_threshold()),
            "growth": [g.to_json() for g in self.growth],
            "modules": [m.to_json() for m in self.modules],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LayerDiffResult:
        return cls(
            target=str(data["target"]),
            patches=tuple(data["patches"]),
            baseline=tuple(data.get("baseline", [])),
            tokens=int(data["tokens"]),
            decode_tokens=int(data.get("decode_tokens", 0)),
            threshold=float(data["threshold"]),
            position_edges=tuple(int(e) for e in data["position_edges"]),
            modules=tuple(ModuleDiff.from_json(m) for m in data["modules"]),
            first_divergent=data.get("first_divergent"),
            growth=tuple(LayerGrowth.from_json(g) for g in data.get("growth", [])),
        )


# -- scale check ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerFit:
    """The exponent of a unit's routed output in one consumer's copy of the scalar, others held."""

    module: str
    exponent: float | None
    fit_residual: float | None

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "exponent": self.exponent, "fit_residual": self.fit_residual}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConsumerFit:
        return cls(str(data["module"]), data.get("exponent"), data.get("fit_residual"))


@dataclass(frozen=True)
class FactorSite:
    """A place that used the factor's value while the unit ran (``speedtrap_agent.provenance``).

    ``kind``: ``tensor operand`` (an operation with the factor as an operand), ``kernel argument`` (a
    custom op or a kernel launcher that receives it), ``call argument`` (a call of the model's code
    that receives it). ``exponent``: what the site adds to the unit's exponent, measured by doubling
    its operand alone; ``applies``: that exponent as a count (0: it reads the factor without applying it).
    """

    file: str
    line: int
    function: str
    kind: str
    op: str
    calls: int
    exponent: float | None
    shape_residual: float | None
    applies: int
    passes_on: bool = False

    @property
    def where(self) -> str:
        """``topk.py:1451``: the file's name and the line."""
        return f"{self.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{self.line}"

    def words(self) -> str:
        """```patches.py:93` (ScaledHashTopK.forward, tensor operand of Tensor.__mul__)``."""
        return f"`{self.where}` ({self.function}, {self.kind} of {self.op})"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "kind": self.kind, "op": self.op,
                "calls": self.calls, "exponent": self.exponent, "shape_residual": self.shape_residual,
                "applies": self.applies, "passes_on": self.passes_on}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FactorSite:
        return cls(
            file=str(data["file"]),
            line=int(data["line"]),
            function=str(data.get("function", "")),
            kind=str(data.get("kind", "")),
            op=str(data.get("op", "")),
            calls=int(data.get("calls", 0)),
            exponent=None if data.get("exponent") is None else float(data["exponent"]),
            shape_residual=None if data.get("shape_residual") is None else float(data["shape_residual"]),
            applies=int(data.get("applies", 0)),
            passes_on=bool(data.get("passes_on", False)),
        )


@dataclass(frozen=True)
class ScaleUnit:
    """One module whose output depends on the scalar (an MoE block: its routed contribution).

    ``times`` is the verdict in numbers: how many times the scalar is applied (0, 1, 2, ...), None
    when the dependence is not a power law with an integer exponent; ``verdict`` says it in words.
    """

    module: str
    layer: int | None
    measured: str  # what was measured: "output - shared_experts" or "output"
    consumers: tuple[ConsumerFit, ...]
    norms: tuple[float, ...]
    exponent: float | None
    fit_residual: float | None
    shape_residual: float | None
    times: int | None
    verdict: str
    sites: tuple[FactorSite, ...] | None = None  # None: provenance not recorded (an older run)

    @property
    def applying(self) -> tuple[FactorSite, ...]:
        """The sites that apply the factor (each ``applies`` times), in the order they ran."""
        return tuple(s for s in self.sites or () if s.applies != 0)

    def sites_words(self) -> str:
        """``applied twice: `patches.py:93` (...) and `model.py:322` (...)``, or why the sites fall short."""
        if self.sites is None:
            return ""
        applying = self.applying
        total = sum(s.applies for s in applying)
        listed = _and([s.words() + (f" x{s.applies}" if s.applies not in (0, 1) else "") for s in applying])
        if not applying:
            return "no site that applies it was recorded"
        text = f"{_times_words(total)}: {listed}"
        if self.times is not None and total != self.times:
            text += f" (the sites add up to {total}, the unit's exponent is {self.times}: a site chains or is unseen)"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "layer": self.layer,
            "measured": self.measured,
            "consumers": [c.to_json() for c in self.consumers],
            "norms": list(self.norms),
            "exponent": self.exponent,
            "fit_residual": self.fit_residual,
            "shape_residual": self.shape_residual,
            "times": self.times,
            "verdict": self.verdict,
            "sites": None if self.sites is None else [x.to_json() for x in self.sites],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScaleUnit:
        return cls(
            module=str(data["module"]),
            layer=None if data.get("layer") is None else int(data["layer"]),
            measured=str(data.get("measured", "")),  # the report keeps the fields it shows, not these
            consumers=tuple(ConsumerFit.from_json(c) for c in data.get("consumers", [])),
            norms=tuple(float(n) for n in data.get("norms", [])),
            exponent=data.get("exponent"),
            fit_residual=data.get("fit_residual"),
            shape_residual=data.get("shape_residual"),
            times=None if data.get("times") is None else int(data["times"]),
            verdict=str(data["verdict"]),
            sites=None if data.get("sites") is None else tuple(FactorSite.from_json(x) for x in data["sites"]),
        )


@dataclass(frozen=True)
class PinnedSite:
    """A module attribute named like the scalar that holds another value (a patch pinned it)."""

    module: str
    value: float

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "value": self.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PinnedSite:
        return cls(str(data["module"]), float(data["value"]))


@dataclass(frozen=True)
class ScaleCheckResult:
    target: str
    param: str
    nominal: float
    values: tuple[float, ...]
    patches: tuple[str, ...]
    tokens: int
    units: tuple[ScaleUnit, ...]
    pinned: tuple[PinnedSite, ...] = ()
    provenance: dict[str, float] | None = None  # what recording the sites cost: seconds, bytes

    def times_by_module(self) -> dict[str, int | None]:
        return {u.module: u.times for u in self.units}

    def times_by_layer(self) -> dict[int, int | None]:
        return {u.layer: u.times for u in self.units if u.layer is not None}

    @property
    def exactly_once(self) -> bool:
        return bool(self.units) and all(u.times == 1 for u in self.units)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "scale_check",
            "target": self.target,
            "param": self.param,
            "nominal": self.nominal,
            "values": list(self.values),
            "patches": list(self.patches),
            "tokens": self.tokens,
            "exactly_once": self.exactly_once,
            "units": [u.to_json() for u in self.units],
            "pinned": [p.to_json() for p in self.pinned],
            "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScaleCheckResult:
        return cls(
            target=str(data["target"]),
            param=str(data["param"]),
            nominal=float(data["nominal"]),
            values=tuple(float(v) for v in data["values"]),
            patches=tuple(data["patches"]),
            tokens=int(data["tokens"]),
            units=tuple(ScaleUnit.from_json(u) for u in data["units"]),
            pinned=tuple(PinnedSite.from_json(p) for p in data.get("pinned", [])),
            provenance=data.get("provenance"),
        )


def _times_words(times: int) -> str:
    return {1: "applied once", 2: "applied twice"}.get(times, f"applied {times} times")


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""


def _layers_list(layers: Sequence[int]) -> str:
    ordered = sorted(layers)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"layers {ordered[0]}-{ordered[-1]}"
    return ("layer " if len(ordered) == 1 else "layers ") + ", ".join(str(x) for x in ordered)


def scale_words(units: Sequence[ScaleUnit]) -> str:
    """``layers 0-5: exponent ≈ 2.00, applied twice: `patches.py:93` (...) and `model.py:322` (...); layers
    6-29: exponent ≈ 1.00, applied once: `model.py:322` (...)`` (the sites where provenance was recorded)."""
    groups: dict[tuple[int | None, tuple[str, ...]], list[ScaleUnit]] = {}
    for r in units:
        if r.layer is not None:
            groups.setdefault((r.times, tuple(x.where for x in r.applying)), []).append(r)
    words = {0: "never applied", 1: "applied once", 2: "applied twice", None: "not a clean power law"}
    parts = []
    for times, where in sorted(groups, key=lambda g: (g[0] is None, -(g[0] or 0) if g[0] != 1 else 99, g[1])):
        members = groups[(times, where)]
        exps = [r.exponent for r in members if r.exponent is not None]
        mean = f"exponent ≈ {sum(exps) / len(exps):.2f}, " if exps else ""
        said = words.get(times, f"applied {times} times")
        sites = members[0].sites_words()
        if sites.startswith(said + ":"):
            said = sites
        elif sites:
            said += f" (sites: {sites})"
        parts.append(f"{_layers_list([r.layer for r in members if r.layer is not None])}: {mean}{said}")
    return "; ".join(parts)
