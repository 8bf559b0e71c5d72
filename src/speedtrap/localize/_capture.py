"""The live capture record: one format for every mechanism, one parser, validated on load.

A capture is one teacher-forced request through a live stack, reduced per module output tensor to
one row per fed token: its absolute position, fed token id, the call's ordinal within its forward
(``occ``), the forward's index (``fwd``), the full row's sum of squares (float64) and max |x|, and
a fixed channel sample (float32; all channels when the row has at most ``channels``). It is one
safetensors file; the header (JSON, in the file's metadata under ``speedtrap.capture``) is a tagged
union on ``source.kind``: ``agent`` (speedtrap's in-worker agent) or ``sglang-dumper`` (SGLang's
own dumper, its ``.pt`` files reduced here).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from speedtrap._errors import ServerError

FORMAT = "speedtrap-live-capture"
FORMAT_VERSION = 1
HEADER_KEY = "speedtrap.capture"
ROW_FIELDS = ("x", "sq", "max", "pos", "ids", "occ", "fwd")
_DTYPES = {"x": "float32", "sq": "float64", "max": "float32", "pos": "int64", "ids": "int64", "occ": "int64",
           "fwd": "int64"}  # fmt: skip


@dataclass(frozen=True)
class AgentSource:
    kind: Literal["agent"]
    pid: int
    engine: str
    model_class: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "pid": self.pid, "engine": self.engine, "model_class": self.model_class}


@dataclass(frozen=True)
class DumperSource:
    kind: Literal["sglang-dumper"]
    exp_name: str
    files: int  # .pt files read (then deleted)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "exp_name": self.exp_name, "files": self.files}


Source = AgentSource | DumperSource


@dataclass(frozen=True)
class Noise:
    """The base request repeated once in the same server: the largest module rel_diff between the two."""

    rel_diff: float
    module: str | None
    positions: int

    def to_json(self) -> dict[str, Any]:
        return {"rel_diff": self.rel_diff, "module": self.module, "positions": self.positions}


LAYOUTS = ("replicated", "sharded", "partial", "auto")


@dataclass(frozen=True)
class Layout:
    """How one rank's output relates to the whole tensor (see ``agent/speedtrap_agent/ranks.py``).

    ``replicated``: every rank holds it; ``sharded``: the last dim split block by block (``parts``: one
    rank's size of each block); ``partial``: a summand per rank; ``auto``: undeclared (the ranks decide).
    """

    kind: str = "replicated"
    parts: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "parts": list(self.parts)} if self.parts else {"kind": self.kind}


REPLICATED = Layout()


@dataclass(frozen=True)
class ModuleRows:
    """One module output tensor's rows (``tensor``: its index among the output's float tensors).

    In one rank's capture of a tensor-parallel server, ``layout`` says how the rows relate to the whole
    tensor; a sharded one's ``x`` holds the full tensor's sampled channels this rank has.
    """

    name: str
    tensor: int
    features: int
    rows: dict[str, Tensor]  # ROW_FIELDS -> [R] (x: [R, channels])
    layout: Layout = REPLICATED

    @property
    def count(self) -> int:
        return int(self.rows["pos"].shape[0])


@dataclass(frozen=True)
class Capture:
    source: Source
    role: str
    stack: str
    label: tuple[str, ...]  # the configuration: its patch names (empty: the base)
    prompt: tuple[int, ...]
    decode_steps: int
    channels: int
    modules: tuple[ModuleRows, ...]
    forwards: int
    skipped: tuple[str, ...] = ()  # modules whose output has no row per fed token
    seconds: float = 0.0
    raw_bytes: int = 0  # what the mechanism wrote before reduction (the dumper's .pt files, the agent's file)
    noise: Noise | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    world: int = 1  # the tensor-parallel size of the server captured
    ranks: tuple[Capture, ...] = ()  # world > 1: every rank's own capture; ``modules`` is then the unsharded view

    def header(self) -> dict[str, Any]:
        head = self._header()
        if self.world > 1:
            head |= {"rank": self.rank, "world": self.world, "ranks": [r.header() for r in self.ranks]}
            for entry, m in zip(head["modules"], self.modules, strict=True):
                entry["layout"] = m.layout.to_json()
            if self.ranks:  # the unsharded view is not stored twice: ``merge_ranks`` of the ranks, on load
                head["modules"] = []
        return head

    def _header(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": FORMAT_VERSION, "source": self.source.to_json(), "role": self.role,
            "stack": self.stack, "label": list(self.label), "prompt": list(self.prompt),
            "decode_steps": self.decode_steps, "channels": self.channels, "forwards": self.forwards,
            "skipped": list(self.skipped), "seconds": self.seconds, "raw_bytes": self.raw_bytes,
            "noise": self.noise.to_json() if self.noise else None, "extra": self.extra,
            "modules": [{"name": m.name, "tensor": m.tensor, "features": m.features} for m in self.modules],
        }  # fmt: skip


def save_capture(capture: Capture, path: Path) -> int:
    """Write ``capture`` atomically; returns the file's bytes."""
    from safetensors.torch import save_file

    tensors = {} if capture.ranks else _tensors(capture, "")  # several ranks: the unsharded view is rebuilt on load
    for r, one in enumerate(capture.ranks):
        tensors |= _tensors(one, f"r{r}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={HEADER_KEY: json.dumps(capture.header())})
    tmp.replace(path)
    return path.stat().st_size


def _tensors(capture: Capture, prefix: str) -> dict[str, Tensor]:
    return {f"{prefix}m{i}.{k}": m.rows[k].contiguous() for i, m in enumerate(capture.modules) for k in ROW_FIELDS}


def load_capture(path: Path, role: str) -> Capture:
    """Read and validate a capture file; any problem is a ServerError naming ``role`` and the file."""
    from safetensors import safe_open

    if not path.is_file():
        raise _bad(role, path, "is missing")
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118 (not a dict)
    except Exception as exc:
        raise _bad(role, path, f"is unreadable ({type(exc).__name__}: {exc})"[:300]) from None
    if HEADER_KEY not in meta:
        raise _bad(role, path, "has no speedtrap capture header")
    try:
        header = json.loads(meta[HEADER_KEY])
    except ValueError:
        raise _bad(role, path, "has a corrupt header") from None
    try:
        return parse_capture(header, tensors)
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(role, path, f"is not a valid capture: {exc}"[:300]) from None


def parse_capture(header: Any, tensors: dict[str, Tensor], prefix: str = "") -> Capture:
    """The one parser: header and tensors to a :class:`Capture`; ValueError/KeyError/TypeError when invalid."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError("not a speedtrap live capture")
    if header.get("version") != FORMAT_VERSION:
        raise ValueError(f"format version {header.get('version')!r}, expected {FORMAT_VERSION}")
    source = _source(header["source"])
    rank, world = _int(header.get("rank", 0), "rank"), _int(header.get("world", 1), "world")
    if world < 1 or rank >= world:
        raise ValueError(f"rank {rank} of {world}")
    ranks = tuple(
        parse_capture(h, tensors, f"r{r}.") for r, h in enumerate(_list(header.get("ranks", []), "ranks"))
    ) if not prefix else ()  # fmt: skip
    if ranks and (len(ranks) != world or any(c.rank != r or c.world != world for r, c in enumerate(ranks))):
        raise ValueError(f"the ranks of a capture at world size {world} are not 0..{world - 1}")
    modules = []
    for i, entry in enumerate(_list(header["modules"], "modules")):
        entry = _obj(entry, f"modules[{i}]")
        rows = {k: tensors[f"{prefix}m{i}.{k}"] for k in ROW_FIELDS}
        count = rows["pos"].shape[0] if rows["pos"].dim() == 1 else -1
        for k, t in rows.items():
            if str(t.dtype).removeprefix("torch.") != _DTYPES[k]:
                raise ValueError(f"module {i} field {k}: dtype {t.dtype}, expected {_DTYPES[k]}")
            if t.shape[0] != count or t.dim() != (2 if k == "x" else 1):
                raise ValueError(f"module {i} field {k}: shape {tuple(t.shape)} does not match {count} rows")
        features = _int(entry["features"], "features")
        layout = parse_layout(entry.get("layout"), features)
        channels = _int(header["channels"], "channels")
        if rows["x"].shape[1] != sampled(layout, features, channels, rank, world):
            raise ValueError(f"module {i}: {rows['x'].shape[1]} channels sampled of {features}")
        modules.append(ModuleRows(str(entry["name"]), _int(entry["tensor"], "tensor"), features, rows, layout))
    held = len(modules) + sum(len(r.modules) for r in ranks)
    if not prefix and len(tensors) != held * len(ROW_FIELDS):
        raise ValueError(f"{len(tensors)} tensors for {held} modules")
    if ranks and modules:
        raise ValueError("a capture of several ranks stores its ranks' rows only")
    noise = header.get("noise")
    capture = Capture(
        source=source,
        role=str(header["role"]),
        stack=str(header["stack"]),
        label=tuple(str(x) for x in _list(header["label"], "label")),
        prompt=tuple(_int(t, "prompt") for t in _list(header["prompt"], "prompt")),
        decode_steps=_int(header["decode_steps"], "decode_steps"),
        channels=_int(header["channels"], "channels"),
        modules=tuple(modules),
        forwards=_int(header["forwards"], "forwards"),
        skipped=tuple(str(s) for s in _list(header.get("skipped", []), "skipped")),
        seconds=_float(header.get("seconds", 0.0)),
        raw_bytes=_int(header.get("raw_bytes", 0), "raw_bytes"),
        noise=None if noise is None else _noise(noise),
        extra=dict(_obj(header.get("extra") or {}, "extra")),
        rank=rank,
        world=world,
        ranks=ranks,
    )  # fmt: skip
    if not ranks:
        return capture
    from dataclasses import replace

    from speedtrap.localize._ranks import merge_ranks

    merged = merge_ranks(ranks)  # the unsharded view, as it was built when captured (the same function)
    return replace(merged, **{k: getattr(capture, k) for k in _OWN})


# What a capture of several ranks keeps of its own beside its ranks' rows.
_OWN = ("source", "role", "stack", "label", "prompt", "decode_steps", "channels", "forwards", "skipped", "seconds",
        "raw_bytes", "noise", "extra")  # fmt: skip


def sampled(layout: Layout, features: int, channels: int, rank: int, world: int) -> int:
    """How many channels one rank's rows of a tensor hold (a shard: the full sample's channels it has)."""
    from speedtrap.localize.agent.speedtrap_agent import shard_picks

    if layout.kind != "sharded" or world <= 1:
        return min(features, channels)
    return len(shard_picks(list(layout.parts), world, rank, channels)[0])


def parse_layout(data: Any, features: int) -> Layout:
    if data is None:
        return REPLICATED
    data = _obj(data, "layout")
    kind = data.get("kind")
    if kind not in LAYOUTS:
        raise ValueError(f"layout kind {kind!r}, expected one of {', '.join(LAYOUTS)}")
    parts = tuple(_int(p, "layout part") for p in _list(data.get("parts") or [], "layout parts"))
    if kind == "sharded" and (not parts or sum(parts) != features or 0 in parts):
        raise ValueError(f"a sharded layout's parts {list(parts)} do not add up to its {features} features")
    return Layout(str(kind), parts if kind == "sharded" else ())


def _noise(data: Any) -> Noise:
    data = _obj(data, "noise")
    module = data.get("module")
    if module is not None and not isinstance(module, str):
        raise TypeError("noise.module must be a string or null")
    return Noise(_float(data["rel_diff"]), module, _int(data["positions"], "positions"))


def _source(data: Any) -> Source:
    data = _obj(data, "source")
    kind = data.get("kind")
    if kind == "agent":
        return AgentSource("agent", _int(data["pid"], "pid"), str(data["engine"]), str(data["model_class"]))
    if kind == "sglang-dumper":
        return DumperSource("sglang-dumper", str(data["exp_name"]), _int(data["files"], "files"))
    raise ValueError(f"unknown capture source {kind!r}")


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{what} must be a list")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _bad(role: str, path: Path, what: str) -> ServerError:
    return ServerError(
        f"the {role} capture file {path} {what}",
        "capture again from the running stack (speedtrap takes no missing or damaged capture as a pass)",
    )


def keep_prompt_rows(
    name: str,
    tensor: int,
    features: int,
    rows: dict[str, torch.Tensor],
    prompt: Sequence[int],
    layout: Layout = REPLICATED,
) -> ModuleRows:
    """Drop rows at prompt positions whose fed token is not the prompt's (another request's forward)."""
    table = torch.tensor(list(prompt), dtype=torch.long)
    pos, fed = rows["pos"].long(), rows["ids"].long()
    inside = pos < len(prompt)
    ok = ~inside | (table[pos.clamp(0, len(prompt) - 1)] == fed)
    ok &= pos >= 0
    typed = {
        "x": rows["x"].float(), "sq": rows["sq"].double(), "max": rows["max"].float(), "pos": pos,
        "ids": fed, "occ": rows["occ"].long(), "fwd": rows["fwd"].long(),
    }  # fmt: skip
    if not bool(ok.all()):
        typed = {k: v[ok] for k, v in typed.items()}
    return ModuleRows(name, tensor, features, {k: v.contiguous() for k, v in typed.items()}, layout)
