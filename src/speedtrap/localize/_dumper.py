"""SGLang's own dumper as the layer-capture mechanism (``sglang/srt/debug_utils/dumper.py``, 0.5.23).

Launched with :func:`dumper_env`: the dumper's non-intrusive hooks sit on every module of the
loaded model (registered by SGLang's model runner), disabled, controlled over the server's own port
(``POST /dumper/configure``). For one request it is enabled with a fresh ``exp_name``, then
disabled; its files (``DUMPER_DIR/<exp_name>/step=..___rank=..___dump_index=..___name=..[___k=v].pt``,
each ``{"value": tensor, "meta": {...}}``) are read with ``torch.load(weights_only=True)``, reduced to
speedtrap's capture rows (the agent's reduction, shared) and deleted; the bytes of both are kept.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import torch

from speedtrap._errors import ServerError
from speedtrap.localize._capture import REPLICATED, Capture, DumperSource, ModuleRows, keep_prompt_rows, parse_layout
from speedtrap.localize._ranks import merge_ranks
from speedtrap.localize.agent.speedtrap_agent import complete, reduce_for

PREFIX = "non_intrusive__"
# Module outputs (``non_intrusive__<module>.output[.<i>]``) and the forward batch's token ids and positions.
DUMP_FILTER = (
    'name in ("input_ids", "positions") or search(r"^non_intrusive__(.+\\.)?output(\\.\\d+)?$", name) is not None'
)
_OUTPUT = re.compile(r"^non_intrusive__(?:(?P<module>.+)\.)?output(?:\.(?P<index>\d+))?$")
_TAG = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.DOTALL)


def dumper_env(folder: Path) -> dict[str, str]:
    """The variables that make SGLang's dumper ready (off) in the launched server, files under ``folder``."""
    return {
        "DUMPER_SERVER_PORT": "reuse",
        "DUMPER_ENABLE": "0",
        "DUMPER_NON_INTRUSIVE_MODE": "all",
        "DUMPER_DIR": str(Path(folder).resolve()),
        "DUMPER_FILTER": DUMP_FILTER,
        "DUMPER_ENABLE_OUTPUT_CONSOLE": "0",
    }


def parse_dump_name(filename: str) -> dict[str, str | int]:
    """``step=3___rank=0___dump_index=7___name=x.output.pt`` -> its tags (integers as int); ValueError if not one."""
    if not filename.endswith(".pt"):
        raise ValueError(f"{filename!r} is not a dumper file (.pt)")
    tags: dict[str, str | int] = {}
    for part in filename[: -len(".pt")].split("___"):
        match = _TAG.match(part)
        if match is None:
            raise ValueError(f"{filename!r}: tag {part!r} is not key=value")
        value = match["value"]
        tags[match["key"]] = int(value) if re.fullmatch(r"-?\d+", value) else value
    for key in ("step", "dump_index", "name"):
        if key not in tags:
            raise ValueError(f"{filename!r} has no {key} tag")
    if not isinstance(tags["step"], int) or not isinstance(tags["dump_index"], int):
        raise ValueError(f"{filename!r}: step and dump_index must be integers")
    return tags


def output_of(name: str) -> tuple[str, int] | None:
    """``non_intrusive__model.layers.0.mlp.output.1`` -> (``model.layers.0.mlp``, 1); None for other names."""
    match = _OUTPUT.match(name)
    if match is None:
        return None
    return match["module"] or "", int(match["index"] or 0)


_LAYERS = re.compile(r"(^|\.)layers\.(\d+)(?=\.|$)")


def in_layer(name: str, tags: dict[str, str | int]) -> str:
    """A module shared by every layer (one rotary embedding) is hooked once, under its first name; the
    dumper's ``layer_id`` tag says which layer called it: ``...layers.0.self_attn.rotary_emb.output`` in
    layer 2 becomes ``...layers.2.self_attn.rotary_emb.output``."""
    layer = tags.get("layer_id")
    match = _LAYERS.search(name)
    if not isinstance(layer, int) or match is None or int(match.group(2)) == layer:
        return name
    return f"{name[: match.start(2)]}{layer}{name[match.end(2) :]}"


def _configure(client: httpx.Client, url: str, body: dict[str, Any]) -> None:
    try:
        response = client.post(f"{url}/dumper/configure", json=body)
    except httpx.HTTPError as exc:
        raise ServerError(f"{url}/dumper/configure failed: {type(exc).__name__}", "check the server") from None
    if response.status_code != 200:
        raise ServerError(
            f"{url}/dumper/configure answered HTTP {response.status_code}: {response.text[:200]}",
            "launch SGLang with dumper_env(folder) in its environment (DUMPER_SERVER_PORT=reuse)",
        )


def capture_dumper(
    url: str,
    folder: Path,
    ids: list[int],
    decode: int,
    role: str,
    stack: str,
    label: tuple[str, ...],
    channels: int,
    timeout: float,
    control_url: str | None = None,
    layouts: dict[int, dict[str, Any]] | None = None,
) -> Capture:
    """One request through ``url`` with the dumper of the SGLang server at ``control_url`` (default ``url``;
    a prefill/decode stack's router has no dumper: each role's server is switched on its own port).
    ``layouts``: per rank, each module's declared layout (the agent's, when it ran in the server too)."""
    from speedtrap.localize._agentlink import send_request

    exp = f"speedtrap-{uuid.uuid4().hex[:12]}"
    control = control_url or url
    with httpx.Client(timeout=timeout, trust_env=False) as client:
        _configure(client, control, {"enable": True, "exp_name": exp})
        try:
            send_request(url, "sglang", ids, decode + 1, timeout=timeout)
        finally:
            _configure(client, control, {"enable": False})
    where = Path(folder) / exp
    try:
        return reduce_dump(where, ids, decode, role, stack or "sglang", label, channels, layouts)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def reduce_dump(
    where: Path,
    prompt: Sequence[int],
    decode: int,
    role: str,
    stack: str,
    label: tuple[str, ...],
    channels: int,
    layouts: dict[int, dict[str, Any]] | None = None,
) -> Capture:
    """Read one request's dump folder and reduce it to a capture (rows per fed token).

    Every rank's files (the ``rank`` tag) are reduced apart, then put back together (``merge_ranks``):
    ``layouts`` (rank -> module -> the layout the agent read from the module's class, when the agent ran in
    the server too) says which outputs are sharded or partial; an undeclared one is ``auto``.
    """
    files = sorted(where.glob("*.pt")) if where.is_dir() else []
    if not files:
        raise ServerError(
            f"the {role} server's dumper wrote no file in {where}",
            "launch SGLang with dumper_env(folder), and check its log for dumper errors",
        )
    by_rank: dict[int, list[tuple[int, int, str, Path]]] = {}
    for path in files:
        try:
            tags = parse_dump_name(path.name)
        except ValueError as exc:
            raise ServerError(f"the {role} dump file {path} has an unexpected name: {exc}", "capture again") from None
        rank = tags.get("rank", 0)
        entry = (int(tags["step"]), int(tags["dump_index"]), in_layer(str(tags["name"]), tags), path)
        by_rank.setdefault(rank if isinstance(rank, int) else 0, []).append(entry)
    world = len(by_rank)
    if sorted(by_rank) != list(range(world)):
        raise ServerError(f"the {role} server's dumper wrote ranks {sorted(by_rank)}", "capture again")
    source = DumperSource("sglang-dumper", where.name, len(files))
    head = (source, role, stack, label, tuple(prompt), decode, channels)
    ranks = [
        _reduce_rank(head, entries, rank, world, (layouts or {}).get(rank, {}))
        for rank, entries in sorted(by_rank.items())
    ]
    return merge_ranks(ranks)


def _reduce_rank(
    head: tuple[DumperSource, str, str, tuple[str, ...], tuple[int, ...], int, int],
    entries: list[tuple[int, int, str, Path]],
    rank: int,
    world: int,
    layouts: dict[str, Any],
) -> Capture:
    source, role, stack, label, prompt, decode, channels = head
    entries.sort()
    raw = sum(p.stat().st_size for *_, p in entries)
    core: dict[tuple[int, str], torch.Tensor] = {}
    for step, _, name, path in entries:
        if name in ("input_ids", "positions") and (step, name) not in core:
            core[(step, name)] = _load(path, role).reshape(-1).long()
    steps = sorted({s for s, _ in core})
    parts: dict[tuple[str, int], dict[str, list[torch.Tensor]]] = {}
    features: dict[tuple[str, int], int] = {}
    shapes: dict[tuple[str, int], dict[str, Any]] = {}
    skipped: set[str] = set()
    calls: dict[tuple[int, str], int] = {}
    for step, _, name, path in entries:
        out = output_of(name)
        if out is None or (step, "positions") not in core or (step, "input_ids") not in core:
            continue
        pos, fed = core[(step, "positions")], core[(step, "input_ids")]
        value = _load(path, role)
        occurrence = calls.get((step, name), 0)
        calls[(step, name)] = occurrence + 1
        if not value.is_floating_point() or value.dim() == 0 or value.shape[0] != pos.shape[0]:
            skipped.add(out[0])
            continue
        rows = value.reshape(pos.shape[0], -1)
        features.setdefault(out, int(rows.shape[1]))
        declared = layouts.get(out[0], {"kind": "auto"}) if world > 1 else {"kind": "replicated"}
        shape = shapes.setdefault(out, complete(declared if out[1] == 0 else {"kind": "auto"}, int(rows.shape[1])))
        part = parts.setdefault(out, {k: [] for k in ("x", "sq", "max", "pos", "ids", "occ", "fwd")})
        for k, v in reduce_for(rows, channels, shape, world, rank).items():
            part[k].append(v)
        n = rows.shape[0]
        part["pos"].append(pos)
        part["ids"].append(fed)
        part["occ"].append(torch.full((n,), occurrence, dtype=torch.long))
        part["fwd"].append(torch.full((n,), steps.index(step), dtype=torch.long))
    modules: list[ModuleRows] = []
    for (module, index), part in parts.items():
        rows_of = {k: torch.cat(v) for k, v in part.items()}
        layout = parse_layout(shapes[(module, index)], features[(module, index)]) if world > 1 else None
        kept = keep_prompt_rows(module, index, features[(module, index)], rows_of, prompt, layout or REPLICATED)
        if kept.count:
            modules.append(kept)
    return Capture(
        source, role, stack, label, tuple(prompt), decode, channels, tuple(modules), len(steps),
        tuple(sorted(skipped)), 0.0, raw, rank=rank, world=world,
    )  # fmt: skip


def _load(path: Path, role: str) -> torch.Tensor:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ServerError(
            f"the {role} dump file {path} is unreadable ({type(exc).__name__})", "capture again"
        ) from None
    value = data.get("value") if isinstance(data, dict) else None
    if not isinstance(value, torch.Tensor):
        raise ServerError(f"the {role} dump file {path} holds no tensor value", "capture again")
    return value
