"""Localize inside a live server: one teacher-forced request captured, and the scale check in the worker.

    from speedtrap.localize import agent_env, capture_live, compare_captures, scale_live
    env = {**launch_env, **agent_env(agent_dir, launch_env)}          # at launch
    base = capture_live(url, agent_dir, ids, api="sglang", out=run / "base.capture", repeat=True)
    ... stop the base server, launch the trial's, then
    trial = capture_live(url, agent_dir, ids, api="sglang", out=run / "trial.capture", role="trial")
    diff = compare_captures(load_capture(run / "base.capture", "base"), trial)
    scale = scale_live(url, agent_dir, ids, api="sglang")

The request: the prompt's ids (one prefill forward, or several when the engine chunks it), then
``decode`` greedy decode forwards (``decode + 1`` new tokens: the last one is never fed).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import torch

from speedtrap._errors import UsageError
from speedtrap.localize._agentlink import AgentLink, Api, flush_cache, send_request
from speedtrap.localize._capture import AgentSource, Capture, keep_prompt_rows, parse_layout, sampled, save_capture
from speedtrap.localize._livediff import noise_of
from speedtrap.localize._ranks import combine_scale, merge_ranks
from speedtrap.localize._results import ConsumerFit, FactorSite, PinnedSite, ScaleCheckResult, ScaleUnit
from speedtrap.localize._scale import (
    DEFAULT_MULTIPLIERS,
    DEFAULT_PARAM,
    _fit,
    _values,
    norms_of,
    provenance_cost,
    unit_from_gram,
)

DEFAULT_CHANNELS = 256
Mechanism = Literal["agent", "sglang-dumper"]


def capture_live(
    url: str,
    folder: Path,
    ids: Sequence[int],
    *,
    api: Api,
    out: Path,
    decode: int = 4,
    role: str = "base",
    stack: str = "",
    label: Sequence[str] = (),
    repeat: bool = False,
    mechanism: Mechanism = "agent",
    channels: int = DEFAULT_CHANNELS,
    model: str | None = None,
    timeout: float = 300.0,
    control_url: str | None = None,
    agent_folder: Path | None = None,
) -> Capture:
    """Capture one request through the running server at ``url`` into ``out`` (a capture file).

    ``folder``: the server's agent folder (``mechanism="agent"``) or its ``DUMPER_DIR``
    (``"sglang-dumper"``). ``repeat``: send the request twice and keep the second's difference from
    the first as the capture's ``noise`` (do it for the base: the comparison's threshold uses it).
    ``control_url``: the SGLang server whose dumper is switched (default ``url``; a stack's role behind a router).
    ``agent_folder``: with the dumper, the same server's agent folder, whose agents say each rank's layouts.
    """
    ids = [int(t) for t in ids]
    if len(ids) < 2 or decode < 0 or channels < 1:
        raise UsageError(
            f"a live capture needs 2+ prompt tokens, decode >= 0, channels >= 1 (got {len(ids)}, {decode}, {channels})",
            "pass a longer prompt or fix the numbers",
        )
    layouts = _layouts(agent_folder, role, timeout) if mechanism == "sglang-dumper" else None
    args = (url, folder, ids, api, decode, role, stack, label, mechanism, channels, model, timeout, control_url, layouts)  # fmt: skip  # noqa: E501
    first = _once(*args)
    if repeat:
        second = _once(*args)
        both = {"seconds": first.seconds + second.seconds, "raw_bytes": first.raw_bytes + second.raw_bytes}
        first = _with(first, noise=noise_of(first, second), **both)
    compact = save_capture(first, out)
    first.extra["bytes"] = compact
    return first


def _layouts(folder: Path | None, role: str, timeout: float) -> dict[int, dict[str, Any]] | None:
    """Per rank, each module's declared layout, from the agents of the same server (None: no agent there)."""
    if folder is None or not (Path(folder) / "agents").is_dir():
        return None
    agents = AgentLink(Path(folder), role, timeout).agents()
    return {int(a.get("rank", 0)): dict(a.get("layouts") or {}) for a in agents}


def _with(capture: Capture, **changes: object) -> Capture:
    from dataclasses import replace

    return replace(capture, **changes)  # type: ignore[arg-type]


def _once(
    url: str,
    folder: Path,
    ids: list[int],
    api: Api,
    decode: int,
    role: str,
    stack: str,
    label: Sequence[str],
    mechanism: Mechanism,
    channels: int,
    model: str | None,
    timeout: float,
    control_url: str | None,
    layouts: dict[int, dict[str, Any]] | None,
) -> Capture:
    started = time.monotonic()
    flush_cache(control_url or url, "sglang" if mechanism == "sglang-dumper" else api, timeout)  # a repeat: all again
    if mechanism == "sglang-dumper":
        from speedtrap.localize._dumper import capture_dumper

        capture = capture_dumper(
            url, Path(folder), ids, decode, role, stack, tuple(label), channels, timeout, control_url, layouts
        )
        return _with(capture, seconds=time.monotonic() - started)
    link = AgentLink(Path(folder), role, timeout)

    def request() -> None:
        send_request(url, api, ids, decode + 1, model=model, timeout=timeout)

    capture = agent_capture(link, ids, decode, request, stack=stack, label=label, channels=channels)
    return _with(capture, seconds=time.monotonic() - started)


def agent_capture(
    link: AgentLink,
    ids: list[int],
    decode: int,
    request: Callable[[], None],
    *,
    stack: str = "",
    label: Sequence[str] = (),
    channels: int = DEFAULT_CHANNELS,
) -> Capture:
    """One capture through ``link``'s agents, every rank of the server: ``request`` sends the request.

    Under tensor or expert parallelism each rank's rows are read and put back together
    (:func:`merge_ranks`); the capture keeps every rank's own beside the unsharded view.
    """
    agents = link.agents()
    pids = [int(a["pid"]) for a in agents]
    ident = link.send("capture", pids=pids, channels=channels)
    request()
    link.send("finish", pids=pids, of=ident)
    started = time.monotonic()

    def read(agent: dict[str, Any]) -> Capture:  # every rank's result read at once (each writes its own)
        result = link.result(ident, int(agent["pid"]))
        waited = time.monotonic() - started
        return _rank_capture(link, result, agent, ids, decode, stack, label, channels, waited)

    if len(agents) == 1:
        ranks = [read(agents[0])]
    else:
        with ThreadPoolExecutor(max_workers=len(agents)) as pool:
            ranks = list(pool.map(read, agents))
    shutil.rmtree(link.folder / "results" / ident, ignore_errors=True)
    return merge_ranks(ranks)


def _rank_capture(
    link: AgentLink,
    result: Path,
    agent: dict[str, Any],
    ids: list[int],
    decode: int,
    stack: str,
    label: Sequence[str],
    channels: int,
    waited: float,
) -> Capture:
    """One rank's result folder -> its capture (its layouts checked by the one parser's rules)."""
    meta = link.read_json(result / "capture.json")
    tensors, raw = _agent_tensors(link, result)
    rank, world = int(meta.get("rank", 0)), int(meta.get("world", 1))
    try:
        modules = []
        for m in meta["modules"]:
            features = int(m["features"])
            layout = parse_layout(m.get("layout") if world > 1 else None, features)
            rows = {k: tensors[f"{m['key']}.{k}"] for k in _FIELDS}
            if rows["x"].shape[1] != sampled(layout, features, channels, rank, world):
                raise ValueError(f"module {m['name']}: {rows['x'].shape[1]} channels for its layout")
            modules.append(keep_prompt_rows(m["name"], int(m["tensor"]), features, rows, ids, layout))
    except (KeyError, TypeError, ValueError) as exc:
        raise link.bad(result, f"holds an incomplete capture ({type(exc).__name__}: {exc})"[:200]) from None
    source = AgentSource("agent", int(agent["pid"]), str(agent["engine"]), str(agent["model_class"]))
    return Capture(
        source, link.role, stack or str(agent["engine"]), tuple(label), tuple(ids), decode, channels,
        tuple(m for m in modules if m.count), len(meta.get("forwards", [])), tuple(meta.get("skipped", [])),
        waited, raw, rank=rank, world=world,
    )  # fmt: skip


_FIELDS = ("x", "sq", "max", "pos", "ids", "occ", "fwd")


def _agent_tensors(link: AgentLink, result: Path, stem: str = "capture") -> tuple[dict[str, torch.Tensor], int]:
    st, pt = result / f"{stem}.safetensors", result / f"{stem}.pt"
    path = st if st.exists() else pt
    if not path.exists():
        raise link.bad(st, "is missing")
    try:
        if path is st:
            from safetensors.torch import load_file

            tensors = load_file(str(path))
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise link.bad(path, f"is unreadable ({type(exc).__name__})") from None
    return tensors, path.stat().st_size


def scale_live(
    url: str,
    folder: Path,
    ids: Sequence[int],
    *,
    api: Api,
    param: str = DEFAULT_PARAM,
    values: Sequence[float] | None = None,
    role: str = "trial",
    label: Sequence[str] = (),
    target: str = "",
    model: str | None = None,
    timeout: float = 300.0,
) -> ScaleCheckResult:
    """How many times ``param`` is applied per MoE unit, measured by the agent in the server's worker.

    The agent captures each unit's inputs on the prefill of one request, then replays the unit on the
    same thread with every copy of ``param`` set to each value (weights untouched) and returns the
    Gram matrix of its routed outputs; the verdicts are the in-process ones (``unit_from_gram``).
    """
    ids = [int(t) for t in ids]
    if not ids:
        raise UsageError("scale check needs at least 1 token", "pass a longer prompt")
    if values is not None:
        _values(values, 1.0)  # the same validation as in-process
    link = AgentLink(Path(folder), role, timeout)

    def request() -> None:
        send_request(url, api, ids, 1, model=model, timeout=timeout)

    return agent_scale(link, ids, request, param=param, values=values, label=label, target=target)


def agent_scale(
    link: AgentLink,
    ids: list[int],
    request: Callable[[], None],
    *,
    param: str = DEFAULT_PARAM,
    values: Sequence[float] | None = None,
    label: Sequence[str] = (),
    target: str = "",
) -> ScaleCheckResult:
    """The scale check through ``link``'s agents, every rank (a unit combined over its ranks: ``combine_scale``)."""
    agents = link.agents()
    pids = [int(a["pid"]) for a in agents]
    fields: dict[str, object] = {"param": param}
    fields |= {"values": [float(v) for v in values]} if values else {"multipliers": list(DEFAULT_MULTIPLIERS)}
    ident = link.send("scale", pids=pids, **fields)
    request()
    per_rank = []
    for agent in agents:
        result = link.result(ident, int(agent["pid"]))
        data = link.read_json(result / "scale.json")
        vectors: dict[str, torch.Tensor] = {}
        if len(agents) > 1 and not data.get("absent"):
            vectors = _agent_tensors(link, result, "scale")[0]
        per_rank.append((int(agent.get("rank", 0)), data, vectors))
    shutil.rmtree(link.folder / "results" / ident, ignore_errors=True)
    engine = str(agents[0]["engine"])
    try:
        return _scale_result(combine_scale(per_rank), tuple(label), len(ids), target or engine)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise link.bad(link.folder / "results" / ident, f"is incomplete ({type(exc).__name__}: {exc})"[:200]) from None


def _scale_result(data: dict[str, object], label: tuple[str, ...], tokens: int, target: str) -> ScaleCheckResult:
    if data.get("absent"):  # the model holds no such factor (a dense model): nothing to measure, said in one line
        raise UsageError(f"{data['absent']} in the live server", "check the factor's name (--param / --symbol)")
    values = [float(v) for v in data["values"]]  # type: ignore[attr-defined]
    nominal = float(data["nominal"])  # type: ignore[arg-type]
    units: list[ScaleUnit] = []
    for entry in data["units"]:  # type: ignore[attr-defined]
        gram = _gram(entry["gram"], len(values))
        fits = []
        for consumer in entry["consumers"]:
            if consumer["gram"] is None:
                exponent, residual = _fit(values, norms_of(gram))
            else:
                exponent, residual = _fit(values, norms_of(_gram(consumer["gram"], len(values))))
            fits.append(ConsumerFit(str(consumer["module"]), exponent, residual))
        shared = [str(s) for s in entry["shared"]]
        measured = "output - " + "/".join(shared) if shared else "output"
        measured += str(entry.get("over_ranks", ""))  # several ranks: how their contributions were combined
        raw_sites = entry.get("sites")
        sites = None if raw_sites is None else tuple(FactorSite.from_json(x) for x in raw_sites)
        units.append(unit_from_gram(str(entry["module"]), measured, tuple(fits), values, gram, nominal, sites))
    pinned = tuple(PinnedSite(str(p["module"]), float(p["value"])) for p in data.get("pinned", []))  # type: ignore[attr-defined]
    cost = None
    if data.get("provenance_seconds") is not None:
        cost = provenance_cost(float(data["provenance_seconds"]), units)  # type: ignore[arg-type]
    return ScaleCheckResult(
        target, str(data["param"]), nominal, tuple(values), label, tokens, tuple(units), pinned, cost
    )


def _gram(raw: object, n: int) -> list[list[float]]:
    if not isinstance(raw, list) or len(raw) != n or any(not isinstance(r, list) or len(r) != n for r in raw):
        raise ValueError(f"a Gram matrix must be {n}x{n}")
    gram = [[float(v) for v in row] for row in raw]
    if any(not math.isfinite(v) for row in gram for v in row):
        raise ValueError("a Gram matrix holds a non-finite value")
    return gram
