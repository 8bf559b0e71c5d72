"""Live localize of a manifest's stack: the base captured once, each culprit's launch compared with it.

    from speedtrap.localize import LiveRequest, localize_on_stack
    request = LiveRequest(ids=tuple(ids), decode=4, api="sglang", param="routed_scaling_factor")
    result = localize_on_stack(launcher, ("glm4_fused_topk_scale",), run_dir / "localize", request)
    result.layers.first_divergent, result.scale.times_by_layer(), result.base_scale.times_by_layer()

One stack alive at a time, like isolate's recorded reference: the base configuration is launched, every
model role captured (and its scale check run), the stack stopped; the captures are kept
(``base.<role>.capture``, ``base.<role>.scale.json``) and a later culprit reuses them. Then the culprit's
configuration is launched and measured the same way, stopped, and each role's capture compared with the
base's. Every process of a launch gets the agent (``agent_env``: a folder per role, ``{role}``); a role that
runs SGLang (the agent says which engine it attached to: a fact read from the process, never guessed from
the launch line) also gets SGLang's dumper ready, and its layers are captured by the dumper, its scale
check by the agent. The role whose result is shown is the first role the culprit is switched on in that
diverged (``x@prefill``: the prefill); every model role's comparison is kept beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._errors import UsageError
from speedtrap.localize._agentlink import AgentLink, Api, agent_env
from speedtrap.localize._capture import Capture, load_capture
from speedtrap.localize._dumper import dumper_env
from speedtrap.localize._live import Mechanism, capture_live, scale_live
from speedtrap.localize._livediff import compare_captures
from speedtrap.localize._results import LayerDiffResult, ScaleCheckResult
from speedtrap.stack import SINGLE_ROLE, Launcher

if TYPE_CHECKING:
    from speedtrap.manifest import Manifest

SGLANG = "sglang"  # the engine name the agent reports when it attached inside SGLang's model runner


@dataclass(frozen=True)
class LiveRequest:
    """What one live localize sends and measures (the same for the base and every culprit)."""

    ids: tuple[int, ...]
    decode: int = 4
    api: Api | None = None  # None: SGLang's /generate where the agent attached inside SGLang, else /v1/completions
    model: str | None = None  # the served model's name (None: the server's first)
    param: str | None = "routed_scaling_factor"  # None: no scale check
    values: tuple[float, ...] | None = None
    threshold: float = 1e-8
    timeout: float = 300.0

    def key(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "decode": self.decode, "api": self.api, "param": self.param,
                "values": None if self.values is None else list(self.values)}  # fmt: skip


@dataclass
class RoleResult:
    """One model role of the culprit's stack against the same role of the base."""

    role: str
    mechanism: str  # agent | sglang-dumper
    layers: LayerDiffResult
    scale: ScaleCheckResult | None
    base_scale: ScaleCheckResult | None
    capture_bytes: int
    raw_bytes: int
    ranks: str = ""  # tensor/expert parallelism: how every rank was read and combined, in words ("" at one rank)


@dataclass
class StackLocalization:
    """The culprit's live localize: the role shown, every role's comparison, what it cost."""

    culprit: tuple[str, ...]
    stack: str  # what measured it, in words
    role: str  # the role whose result is shown
    roles: dict[str, RoleResult]
    launches: int  # stacks launched by this call (the base's only when it was not stored yet)
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def shown(self) -> RoleResult:
        return self.roles[self.role]

    def measured_on(self) -> str:
        """Where and by what the shown role was measured; a stage that did not run is not named."""
        shown = self.shown
        if shown.mechanism == "sglang-dumper":
            how = "SGLang's own dumper (layers)"
            how += " and speedtrap's agent (scale)" if shown.scale is not None else ""
        else:
            how = "speedtrap's in-worker agent (layers" + (" and scale)" if shown.scale is not None else ")")
        ranks = f"; {shown.ranks}" if shown.ranks else ""
        return f"live, on {self.stack}, role {self.role}, captured by {how}{ranks}"

    def extra(self) -> dict[str, Any]:
        """What the run directory keeps beside the shown result (every role, the cost)."""
        return {
            "measured_on": self.measured_on(),
            "role": self.role,
            "mechanism": self.shown.mechanism,
            "launches": self.launches,
            "seconds": round(self.seconds, 3),
            "capture_bytes": {r: v.capture_bytes for r, v in self.roles.items()},
            "raw_bytes": {r: v.raw_bytes for r, v in self.roles.items()},
            "roles": {
                r: {
                    "first_divergent": v.layers.first_divergent,
                    "threshold": v.layers.threshold,
                    "modules_compared": sum(m.status == "compared" for m in v.layers.modules),
                    "positions_compared": v.layers.tokens,
                    "decode_compared": v.layers.decode_tokens,
                    "scale": None if v.scale is None else v.scale.times_by_layer(),
                }
                for r, v in self.roles.items()
            },
            "base_scale": None if self.shown.base_scale is None else self.shown.base_scale.to_json(),
            "notes": list(self.notes),
        }


def localize_on_stack(
    launcher: Launcher, culprit: Sequence[str], folder: Path, request: LiveRequest, *, base: Sequence[str] = ()
) -> StackLocalization:
    """Launch the base (unless its captures are stored in ``folder``) and ``culprit``, one at a time; compare."""
    if not request.ids or len(request.ids) < 2:
        raise UsageError("a live localize needs at least 2 prompt tokens", "pass a longer prompt (--tokens N)")
    if launcher.target.in_process:
        raise UsageError("live localize needs a server target (target.launch)", "use diff layers --target instead")
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    roles = _model_roles(launcher)
    launches = 0
    stored = _stored_base(folder, roles, request, tuple(base))
    if stored is None:
        stored = _measure(launcher, tuple(base), folder, "base", request, roles, repeat=True)
        (folder / "base.key.json").write_text(json.dumps(_base_key(roles, request, tuple(base))))
        launches += 1
    label = tuple(culprit)
    trial = _measure(launcher, tuple(sorted({*base, *culprit})), folder, "trial", request, roles, label=label)
    launches += 1
    results: dict[str, RoleResult] = {}
    for role in roles:
        b, t = stored[role], trial[role]
        layers = compare_captures(b.capture, t.capture, request.threshold, target=_stack_words(launcher))
        results[role] = RoleResult(
            role, t.mechanism, layers, t.scale, b.scale, t.capture.extra.get("bytes", 0), t.capture.raw_bytes,
            _ranks_words(b.capture, t.capture, t.scale),
        )  # fmt: skip
    shown, notes = _shown_role(launcher, culprit, results)
    notes += [f"{role}: {note}" for role, m in trial.items() for note in m.capture.extra.get("notes", [])]
    for measured in (*stored.values(), *trial.values()):  # ranks that disagree on a replicated output: named
        for d in measured.capture.extra.get("ranks", {}).get("disagree", []):
            notes.append(
                f"{d['role']} rank {d['rank']} disagrees with rank 0 on the replicated output of {d['module']} "
                f"(rel diff {d['rel_diff']:.3g})"
            )
    return StackLocalization(label, _stack_words(launcher), shown, results, launches, time.monotonic() - started, notes)


def _ranks_words(base: Capture, trial: Capture, scale: ScaleCheckResult | None) -> str:
    """How a tensor- or expert-parallel role's ranks were read and combined, in words ("" at one rank)."""
    if base.world <= 1 and trial.world <= 1:
        return ""
    how = "rank by rank" if base.world == trial.world else f"unsharded (base at TP {base.world}, trial {trial.world})"
    words = f"every rank (TP {trial.world}), layers compared {how}"
    combined = next((u.measured for u in scale.units if "over ranks" in u.measured), "") if scale else ""
    words += f"; scale check per unit: {combined}" if combined else ""
    named = [f"{d['role']} rank {d['rank']} on {d['module']}" for c in (base, trial)
             for d in c.extra.get("ranks", {}).get("disagree", [])]  # fmt: skip
    if named:
        more = f" and {len(named) - 3} more" if len(named) > 3 else ""
        words += f"; RANKS DISAGREE on a replicated output: {', '.join(named[:3])}{more}"
    return words


@dataclass
class _Measured:
    capture: Capture
    scale: ScaleCheckResult | None
    mechanism: str


def _model_roles(launcher: Launcher) -> tuple[str, ...]:
    stack = launcher.target.stack
    return (SINGLE_ROLE,) if stack is None else tuple(stack.model_roles)


def _stack_words(launcher: Launcher) -> str:
    stack = launcher.target.stack
    if stack is None:
        return "the manifest's server"
    return "the manifest's stack (" + ", ".join(r.name for r in stack.roles) + ")"


def _base_key(roles: Sequence[str], request: LiveRequest, base: tuple[str, ...]) -> dict[str, Any]:
    """What the stored base depends on: the roles, the request (the scale check's factor and values included:
    a base stored without the factor's scale check is measured again when one is asked for)."""
    return {"roles": list(roles), "request": request.key(), "base": list(base)}


def _same_base(stored: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """The stored base serves ``wanted``: the same capture, and the scale check asked for (if any) stored with it."""
    keep = ("ids", "decode", "api")
    same = stored.get("roles") == wanted["roles"] and stored.get("base") == wanted["base"]
    old, new = stored.get("request", {}), wanted["request"]
    same = same and all(old.get(k) == new[k] for k in keep)
    if new["param"] is not None:
        same = same and old.get("param") == new["param"] and old.get("values") == new["values"]
    return same


def _stored_base(
    folder: Path, roles: Sequence[str], request: LiveRequest, base: tuple[str, ...]
) -> dict[str, _Measured] | None:
    """The base's captures of an earlier call with the same request, or None (then it is measured)."""
    try:
        if not _same_base(json.loads((folder / "base.key.json").read_text()), _base_key(roles, request, base)):
            return None
    except (OSError, ValueError, AttributeError):
        return None
    out = {}
    for role in roles:
        capture = load_capture(folder / f"base.{role}.capture", f"base {role}")  # unreadable: an error, not a pass
        scale_file = folder / f"base.{role}.scale.json"
        scale = None
        if request.param is not None and scale_file.exists():
            scale = ScaleCheckResult.from_json(json.loads(scale_file.read_text()))
        out[role] = _Measured(capture, scale, str(capture.source.kind))
    return out


def _measure(
    launcher: Launcher,
    config: tuple[str, ...],
    folder: Path,
    name: str,
    request: LiveRequest,
    roles: Sequence[str],
    *,
    repeat: bool = False,
    label: tuple[str, ...] = (),
) -> dict[str, _Measured]:
    """Launch ``config`` with the agent (and SGLang's dumper ready), capture every model role, stop it."""
    agents = folder / f".{name}.agents"
    dumps = folder / f".{name}.dumps"
    for scratch in (agents, dumps):
        shutil.rmtree(scratch, ignore_errors=True)
    env = {**os.environ, **dict(launcher.target.env)}
    extra = {**agent_env(agents / "{role}", env), **dumper_env(dumps / "{role}")}
    server, _ = launcher.start(config, folder / f"{name}.log", extra)
    out: dict[str, _Measured] = {}
    try:
        with server:
            entry = f"http://127.0.0.1:{server.port}"
            for role in roles:
                own = _role_url(server, role, entry)
                link = AgentLink(agents / role, f"{name} {role}", request.timeout)
                engine = str(link.agents()[0].get("engine", ""))
                mechanism: Mechanism = "sglang-dumper" if engine == SGLANG else "agent"
                api: Api = request.api or ("sglang" if engine == SGLANG else "openai")
                capture = capture_live(
                    entry, (dumps if mechanism == "sglang-dumper" else agents) / role, list(request.ids),
                    api=api, out=folder / f"{name}.{role}.capture", decode=request.decode,
                    role=f"{name} {role}", stack=_stack_words(launcher), label=label, repeat=repeat,
                    mechanism=mechanism, model=request.model, timeout=request.timeout, control_url=own,
                    agent_folder=agents / role,
                )  # fmt: skip
                scale = None
                if request.param is not None:
                    scale = _scale(entry, agents / role, request, api, f"{name} {role}", label, capture)
                if scale is not None and name == "base":
                    (folder / f"base.{role}.scale.json").write_text(json.dumps(scale.to_json()))
                out[role] = _Measured(capture, scale, mechanism)
    finally:
        shutil.rmtree(agents, ignore_errors=True)
        shutil.rmtree(dumps, ignore_errors=True)
    return out


def _scale(
    url: str, folder: Path, request: LiveRequest, api: Api, role: str, label: tuple[str, ...], capture: Capture
) -> ScaleCheckResult | None:
    """The scale check in a role that runs the prompt's prefill (a decode-only role never sees one)."""
    prefill_rows = any(int(m.rows["pos"].min()) == 0 for m in capture.modules if m.count)
    if not prefill_rows:
        capture.extra.setdefault("notes", []).append(
            f"scale check of {request.param!r}: not run in this role (it runs no prefill of the prompt)"
        )
        return None
    assert request.param is not None
    try:
        result = scale_live(
            url, folder, list(request.ids), api=api, param=request.param, values=request.values,
            role=role, label=label, model=request.model, timeout=request.timeout,
        )  # fmt: skip
    except UsageError as exc:  # no module of this engine holds the factor: said, not raised
        capture.extra.setdefault("notes", []).append(f"scale check: {exc.problem}")
        return None
    if not result.units:
        capture.extra.setdefault("notes", []).append(f"scale check: no MoE unit holds {request.param!r}")
        return None
    return result


def _role_url(server: Any, role: str, entry: str) -> str:
    """A role's own HTTP address (SGLang's dumper is controlled per server, not through a router)."""
    launches = getattr(server, "launches", None)
    if isinstance(launches, Mapping) and role in launches:
        return f"http://127.0.0.1:{launches[role].port}"
    return entry


def _shown_role(launcher: Launcher, culprit: Sequence[str], results: Mapping[str, RoleResult]) -> tuple[str, list[str]]:
    """The first role the culprit is switched on in that diverged; else the first that diverged; else the first."""
    stack = launcher.target.stack
    notes: list[str] = []
    if stack is None:
        return SINGLE_ROLE, notes
    switched = [r for r in stack.model_roles if any(r in (launcher.patches[n].roles or stack.model_roles)
                                                    for n in culprit if n in launcher.patches)]  # fmt: skip
    diverged = [r for r in results if results[r].layers.first_divergent is not None]
    for role in [*switched, *diverged]:
        if role in diverged:
            if role not in switched:
                notes.append(f"{role} diverged although the culprit is not switched on there")
            return role, notes
    if not diverged:
        notes.append("no model role diverged over the threshold")
    return (switched or list(results))[0], notes


def localize_manifest(
    manifest: Manifest,
    culprits: Sequence[Sequence[str]],
    folder: Path,
    *,
    tokens: int = 96,
    decode: int = 4,
    param: str | None = "routed_scaling_factor",
    values: Sequence[float] | None = None,
    threshold: float = 1e-8,
    baseline: Sequence[str] = (),
) -> list[StackLocalization]:
    """Each culprit set of ``manifest``'s patches localized inside its stack (the base launched once)."""
    from speedtrap.localize._inputs import folder_ids

    target, patches = manifest.target, manifest.patches
    if target.in_process:
        raise UsageError(f"{manifest.path} names an in-process target", f"localize it with --target {target.name}")
    known = {p.name for p in patches}
    for culprit in [*culprits, baseline]:
        unknown = [n for n in culprit if n not in known]
        if unknown or (culprit is not baseline and not culprit):
            raise UsageError(
                f"--patches must name patches of {manifest.path}"
                + (f" ({', '.join(unknown)} is not one)" if unknown else ""),
                f"choose from: {', '.join(sorted(known))}",
            )
    request = LiveRequest(
        tuple(folder_ids(target.model, tokens)), decode=decode, model=target.served_model, param=param,
        values=None if values is None else tuple(values), threshold=threshold,
    )  # fmt: skip
    launcher = Launcher(target, patches, target.served_model)
    try:
        return [localize_on_stack(launcher, c, folder, request, base=baseline) for c in culprits]
    finally:
        launcher.close()
