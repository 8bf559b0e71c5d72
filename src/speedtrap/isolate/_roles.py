"""Multi-process stacks: roles (prefill, decode, router, replicas, ...) launched together for one trial.

A stack is one or more roles, each a process launched by argv (no shell) in its own process group under
the launch guard (``_guard.py``), with its own environment, health URL and extra free ports. Roles start
after the roles named in their ``after`` (the others in parallel); one role is the entry the probes talk
to. Before a trial is probed, one real request goes through the entry: two roles may both answer
``/health`` 200 while the first request fails (a prefill/decode model mismatch), so health alone does not
make a stack ready. Any role exiting ends the trial as an error naming the role and its log; the stack is
stopped in the reverse of its start order. Scratch folders (``{scratch.kv}``) are made fresh for every
launch: a KV folder left over from another configuration makes a decode read that configuration's KV.

In the manifest::

    [target]                                  # shared by every role: model, served_model, cwd, env, timeouts
    scratch = ["kv"]                          # {scratch.kv}: a fresh empty folder per launch
    agree = ["--block-size", "--kv-cache-dtype"]   # settings every model role must share
    first_request = true                      # one real request through the entry before probing

    [target.roles.prefill]
    launch = ["vllm", "serve", "{model}", "--port", "{port}"]
    ports = ["side"]                          # {port.side}: another free port; other roles: {prefill.port.side}
    env = { VLLM_NIXL_SIDE_CHANNEL_PORT = "{port.side}" }
    health = "http://127.0.0.1:{port}/health"

    [target.roles.router]
    launch = ["python", "proxy.py", "--port", "{port}", "--prefill", "{prefill.port}", "--decode", "{decode.port}"]
    after = ["prefill", "decode"]
    entry = true
    runs_model = false                        # patches without roles go to every role that runs the model
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from speedtrap._errors import ManifestError, ServerError
from speedtrap._redact import redact_argv, redact_env
from speedtrap.isolate._fields import no_unknown, str_list, str_table
from speedtrap.isolate._launch import LaunchSpec, Server, free_port, render, start

ROLE_KEYS = {"launch", "env", "health", "ports", "after", "host", "entry", "runs_model"}
STACK_KEYS = {"roles", "scratch", "agree", "first_request"}
DEFAULT_HEALTH = "http://127.0.0.1:{port}/health"
_POLL_S = 0.2
_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")


@dataclass(frozen=True)
class RoleSpec:
    """One process of a stack, as the manifest declares it (placeholders still in)."""

    name: str
    launch: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    health: str = DEFAULT_HEALTH
    ports: tuple[str, ...] = ()  # extra free ports: {port.NAME}
    after: tuple[str, ...] = ()
    host: str | None = None  # None: this machine
    entry: bool = False
    runs_model: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "launch": redact_argv(self.launch),
            "env": redact_env(dict(self.env))[0],
            "health": self.health,
            "ports": list(self.ports),
            "after": list(self.after),
            "host": self.host,
            "entry": self.entry,
            "runs_model": self.runs_model,
        }


@dataclass(frozen=True)
class StackSpec:
    """The roles of a multi-process target, in the manifest's order, and what they share."""

    roles: tuple[RoleSpec, ...]
    scratch: tuple[str, ...] = ()
    agree: tuple[str, ...] = ()  # launch flags (``--x``) or env vars that every model role must set alike
    first_request: bool = True
    manifest: str = ""  # the manifest's path: where inspect finds this stack's launch records

    @property
    def entry(self) -> RoleSpec:
        return next(r for r in self.roles if r.entry)

    @property
    def model_roles(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles if r.runs_model)

    def role(self, name: str) -> RoleSpec:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    def start_order(self) -> list[list[str]]:
        """Waves of roles: each wave starts once every role of the earlier waves it comes after is healthy."""
        done: set[str] = set()
        waves: list[list[str]] = []
        left = [r for r in self.roles]
        while left:
            wave = [r.name for r in left if set(r.after) <= done]
            waves.append(wave)
            done.update(wave)
            left = [r for r in left if r.name not in done]
        return waves

    def to_json(self) -> dict[str, Any]:
        return {
            "roles": [r.to_json() for r in self.roles],
            "scratch": list(self.scratch),
            "agree": list(self.agree),
            "first_request": self.first_request,
        }


# ----------------------------------------------------------------------------------------------
# Reading the manifest.


def parse_stack(raw: Mapping[str, Any], manifest: Path | None) -> StackSpec | None:
    """``target.roles`` and its companions, or None for a single-launch target (a stack of one role)."""
    roles_raw = raw.get("roles")
    if roles_raw is None:
        for key in ("scratch", "agree", "first_request"):
            if key in raw:
                raise ManifestError(f"target.{key} is for a stack of roles (target.roles)", f"drop target.{key}")
        return None
    if "launch" in raw:
        raise ManifestError(
            "target has both launch and roles", "move the launch into a role: [target.roles.server] launch = [...]"
        )
    if not isinstance(roles_raw, dict) or not roles_raw:
        raise ManifestError("target.roles must be tables, one per role", "write [target.roles.prefill] launch = [...]")
    roles = [_role(str(name), value) for name, value in roles_raw.items()]
    names = [r.name for r in roles]
    entries = [r.name for r in roles if r.entry]
    if len(roles) == 1 and not entries:
        roles = [RoleSpec(**{**_fields(roles[0]), "entry": True})]
        entries = [roles[0].name]
    if len(entries) != 1:
        raise ManifestError(
            f"target.roles needs exactly one entry role (the probes talk to it); found {entries or 'none'}",
            "write entry = true in the role the requests go to (the router)",
        )
    for r in roles:
        for j, other in enumerate(r.after):
            if other not in names or other == r.name:
                raise ManifestError(
                    f"target.roles.{r.name}.after[{j}] names no other role: {other!r}",
                    f"choose from: {', '.join(names)}",
                )
    _check_acyclic(roles)
    scratch = tuple(str_list(raw.get("scratch", []), "target.scratch"))
    for s in scratch:
        if not s or not set(s) <= _NAME_OK:
            raise ManifestError(f"target.scratch name {s!r} is not a plain name", 'write scratch = ["kv"]')
    agree = tuple(str_list(raw.get("agree", []), "target.agree"))
    first = raw.get("first_request", True)
    if not isinstance(first, bool):
        raise ManifestError("target.first_request must be true or false", "write first_request = true")
    stack = StackSpec(tuple(roles), scratch, agree, first, str(manifest.resolve()) if manifest else "")
    known = {"model", "port", *(f"port.{p}" for r in roles for p in r.ports), *(f"scratch.{s}" for s in scratch)}
    for r in roles:
        own = {f"port.{p}" for p in r.ports}
        others = {f"{o.name}.port" for o in roles} | {f"{o.name}.port.{p}" for o in roles for p in o.ports}
        texts = [*(("launch", a) for a in r.launch), *((f"env.{k}", v) for k, v in r.env), ("health", r.health)]
        for where, text in texts:
            for key in _placeholders(text):
                if key in {"model", "port", "worktree"} | own | others or key in known:
                    continue
                raise ManifestError(
                    f"target.roles.{r.name}.{where} uses {{{key}}}, which is not a placeholder of this stack",
                    "use {port}, {port.NAME} (ports = [...]), {ROLE.port}, {ROLE.port.NAME}, {scratch.NAME} "
                    "(target.scratch) or {model}",
                )
    return stack


def _fields(role: RoleSpec) -> dict[str, Any]:
    return {k: getattr(role, k) for k in RoleSpec.__dataclass_fields__}


def _placeholders(text: str) -> list[str]:
    out: list[str] = []
    i = 0
    while True:
        a = text.find("{", i)
        if a < 0:
            return out
        b = text.find("}", a)
        if b < 0:
            return out
        inner = text[a + 1 : b]
        if inner and all(c.isalnum() or c in "._-" for c in inner):
            out.append(inner)
        i = b + 1


def _role(name: str, raw: Any) -> RoleSpec:
    where = f"target.roles.{name}"
    if not name or not set(name) <= _NAME_OK:
        raise ManifestError(f"{where}: the role name {name!r} is not plain (a-z, 0-9, _ and -)", "rename the role")
    if not isinstance(raw, dict):
        raise ManifestError(f"{where} must be a table", f"write [{where}] launch = [...]")
    no_unknown(raw, ROLE_KEYS, f"{where}.", where)
    argv = str_list(raw.get("launch"), f"{where}.launch") if "launch" in raw else []
    if not argv:
        raise ManifestError(f"{where}.launch is missing or empty", 'write launch = ["program", "--port", "{port}"]')
    if not any("{port}" in a for a in argv):
        raise ManifestError(f"{where}.launch has no {{port}} placeholder", 'add the port argument: "--port", "{port}"')
    health = raw.get("health", DEFAULT_HEALTH)
    if not isinstance(health, str) or not health.startswith(("http://", "https://")):
        raise ManifestError(f"{where}.health must be an http:// URL", 'write health = "http://127.0.0.1:{port}/health"')
    ports = tuple(str_list(raw.get("ports", []), f"{where}.ports"))
    for p in ports:
        if not p or not set(p) <= _NAME_OK:
            raise ManifestError(f"{where}.ports: {p!r} is not a plain name", 'write ports = ["side"]')
    host = raw.get("host")
    if host is not None and (not isinstance(host, str) or not host.strip() or host.startswith("-")):
        raise ManifestError(f"{where}.host must be a host name", 'write host = "gpu-node-2", or drop it (this machine)')
    for key in ("entry", "runs_model"):
        if key in raw and not isinstance(raw[key], bool):
            raise ManifestError(f"{where}.{key} must be true or false", f"write {key} = true")
    return RoleSpec(
        name,
        tuple(argv),
        str_table(raw.get("env", {}), f"{where}.env"),
        health,
        ports,
        tuple(str_list(raw.get("after", []), f"{where}.after")),
        None if host in (None, "local", "localhost") else str(host),
        bool(raw.get("entry", False)),
        bool(raw.get("runs_model", True)),
    )


def _check_acyclic(roles: Sequence[RoleSpec]) -> None:
    by_name = {r.name: r for r in roles}
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join([*trail[trail.index(name) :], name])
            raise ManifestError(f"target.roles: the after lists form a cycle: {cycle}", "break the cycle")
        state[name] = 1
        for other in by_name[name].after:
            visit(other, [*trail, name])
        state[name] = 2

    for r in roles:
        visit(r.name, [])


def patch_roles(stack: StackSpec | None, name: str, roles: Sequence[str], where: str) -> tuple[str, ...]:
    """The roles a patch applies to (checked against the stack); () on a single-launch target."""
    if stack is None:
        if roles:
            raise ManifestError(
                f"{where}.roles names roles, but the target has none", "drop roles, or add target.roles"
            )
        return ()
    known = [r.name for r in stack.roles]
    for j, role in enumerate(roles):
        if role not in known:
            raise ManifestError(f"{where}.roles[{j}] names no role: {role!r}", f"choose from: {', '.join(known)}")
    return tuple(roles) if roles else stack.model_roles


def agree_conflict(
    stack: StackSpec, patch: str, roles: Sequence[str], env: Mapping[str, str], args: Sequence[str]
) -> str | None:
    """Why switching ``patch`` on alone makes the model roles disagree on a setting they must share, or None."""
    model = set(stack.model_roles)
    on = set(roles) & model
    if not on or on == model:
        return None
    for key in stack.agree:
        touched = key in env if not key.startswith("-") else any(a == key or a.startswith(key + "=") for a in args)
        if touched:
            rest = ", ".join(sorted(model - on))
            return (
                f"patch {patch!r} sets {key} on {', '.join(sorted(on))} only, but target.agree says every model role "
                f"must share it (not set on: {rest}): a one-sided configuration is a conflict, not a trial"
            )
    return None


# ----------------------------------------------------------------------------------------------
# One trial's stack.


@dataclass(frozen=True)
class RoleLaunch:
    """One role of one configuration: its launch spec (placeholders filled) and its ports."""

    role: RoleSpec
    spec: LaunchSpec
    port: int
    ports: Mapping[str, int]
    recorded_env: Mapping[str, str]  # the switches of this role's environment (patch and role variables)


def setting(key: str, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The value of an agree key in one role's launch: a flag's last value, or an env var's."""
    if not key.startswith("-"):
        return env.get(key)
    value = None
    for i, a in enumerate(argv):
        if a == key:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        elif a.startswith(key + "="):
            value = a.split("=", 1)[1]
    return value


def check_agreement(stack: StackSpec, launches: Sequence[RoleLaunch]) -> None:
    """A ManifestError when the model roles of one configuration disagree on a setting they must share."""
    model = [rl for rl in launches if rl.role.runs_model]
    for key in stack.agree:
        values = {rl.role.name: setting(key, rl.spec.argv, rl.spec.env) for rl in model}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"{k}: {'<unset>' if v is None else v}" for k, v in values.items())
            raise ManifestError(
                f"conflict: the roles disagree on {key} ({shown}), which target.agree says they must share",
                "switch the patch on every model role (drop its roles, or do not split it)",
            )


def stack_launches(
    stack: StackSpec,
    base_argv_env: Mapping[str, str],
    common_env: Sequence[tuple[str, str]],
    role_switches: Mapping[str, tuple[dict[str, str], list[str]]],
    values: Mapping[str, str],
    start_timeout: float,
    stop_timeout: float,
    cwd: Path | None,
) -> list[RoleLaunch]:
    """Every role's launch for one configuration: free ports picked, placeholders filled, switches added."""
    ports = {r.name: free_port() for r in stack.roles}
    extra = {r.name: {p: free_port() for p in r.ports} for r in stack.roles}
    shared = dict(values)
    for r in stack.roles:
        shared[f"{r.name}.port"] = str(ports[r.name])
        for p, n in extra[r.name].items():
            shared[f"{r.name}.port.{p}"] = str(n)
    out = []
    for r in stack.roles:
        own = {**shared, "port": str(ports[r.name]), **{f"port.{p}": str(n) for p, n in extra[r.name].items()}}
        env = dict(base_argv_env)
        recorded: dict[str, str] = {}
        for k, v in [*common_env, *r.env]:
            env[k] = render([v], own)[0]
            recorded[k] = env[k]
        patch_env, patch_args = role_switches.get(r.name, ({}, []))
        env.update(patch_env)
        recorded.update(patch_env)
        argv = render(r.launch, own) + list(patch_args)
        health = render([r.health], own)[0]
        spec = LaunchSpec(tuple(argv), env, health, start_timeout, stop_timeout, cwd)
        out.append(RoleLaunch(r, spec, ports[r.name], extra[r.name], redact_env(recorded)[0]))
    return out


class Stack:
    """A running stack of one trial; quacks like a :class:`Server` (port, died, alive, stop, log_path)."""

    def __init__(self, spec: StackSpec, launches: Sequence[RoleLaunch], logs: Mapping[str, Path], scratch: Path | None):
        self.spec = spec
        self.launches = {rl.role.name: rl for rl in launches}
        self.logs = dict(logs)
        self.servers: dict[str, Server] = {}
        self.order: list[str] = []  # roles in the order they started
        self.scratch = scratch
        self.record: Path | None = None
        entry = spec.entry.name
        self.port = self.launches[entry].port
        self.log_path = self.logs[entry]
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.servers[self.spec.entry.name].pid

    def pids(self) -> dict[str, int]:
        """Each role's guard pid (the leader of its process group)."""
        return {name: s.pid for name, s in self.servers.items()}

    def alive(self) -> bool:
        return bool(self.servers) and all(s.alive() for s in self.servers.values())

    def died(self) -> ServerError | None:
        for name in self.order:
            server = self.servers[name]
            code = server.proc.poll()
            if code is not None:
                how = f"signal {-code}" if code < 0 else f"code {code}"
                return ServerError(
                    f"role {name!r} of the stack exited ({how}); read its log: {server.log_path}",
                    "check that role's log; any role exiting ends the trial as an error, never a pass",
                ).with_log(server.log_path)  # type: ignore[return-value]
        return None

    def stop(self) -> int | None:
        """Stop the roles in the reverse of their start order (each: SIGTERM to its group, then SIGKILL)."""
        for name in reversed(self.order):
            self.servers[name].stop()
        if self.record is not None:
            with contextlib.suppress(OSError):
                self.record.unlink()
            self.record = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return None

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def records_dir(manifest: str) -> Path:
    """Where the launch records of ``manifest``'s live stacks are kept (one file per launch)."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"speedtrap-{os.getuid()}" / "stacks"
    return base / hashlib.sha256(manifest.encode()).hexdigest()[:16]


def _write_record(stack: Stack) -> None:
    if not stack.spec.manifest:
        return
    folder = records_dir(stack.spec.manifest)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "manifest": stack.spec.manifest,
        "launcher": os.getpid(),
        "roles": [
            {
                "role": name,
                "guard_pid": stack.servers[name].pid,
                "port": stack.launches[name].port,
                "ports": dict(stack.launches[name].ports),
                "log": str(stack.logs[name]),
                "host": stack.launches[name].role.host,
                "env": dict(stack.launches[name].recorded_env),
                "argv": redact_argv(stack.launches[name].spec.argv),
            }
            for name in stack.order
        ],
    }
    path = folder / f"{os.getpid()}-{stack.servers[stack.order[0]].pid}.json"
    path.write_text(json.dumps(doc, indent=1))
    stack.record = path


def _log_sizes(stack: Stack) -> dict[str, int]:
    out = {}
    for name, path in stack.logs.items():
        try:
            out[name] = path.stat().st_size
        except OSError:
            out[name] = 0
    return out


def launch_stack(
    spec: StackSpec,
    launches: Sequence[RoleLaunch],
    logs: Mapping[str, Path],
    scratch: Path | None,
    start_timeout: float,
    first_request: Mapping[str, Any] | None,
) -> tuple[Stack, float]:
    """Start every role (in waves, by ``after``), wait until all are healthy, then one real request.

    Any failure stops what was started and raises a ServerError naming the role and its log.
    """
    check_agreement(spec, launches)
    for rl in launches:
        if rl.role.host is not None:
            raise ManifestError(
                f"target.roles.{rl.role.name}.host = {rl.role.host!r}: launching a role on another host is not "
                "supported (inspect reads it there over ssh)",
                'run speedtrap on that host, or use executor = "ray" to place the whole stack on one worker',
            )
    stack = Stack(spec, launches, logs, scratch)
    deadline = time.monotonic() + start_timeout
    try:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            for wave in spec.start_order():
                for name in wave:
                    stack.servers[name] = start(stack.launches[name].spec, logs[name], stack.launches[name].port)
                    stack.order.append(name)
                _write_record(stack)
                _wait_wave(stack, wave, client, deadline, start_timeout)
        if first_request is not None:
            _first_request(stack, first_request, start_timeout)
    except BaseException:
        stack.stop()
        raise
    return stack, time.monotonic() - stack.started


def _wait_wave(stack: Stack, wave: Sequence[str], client: httpx.Client, deadline: float, timeout: float) -> None:
    pending = list(wave)
    last: dict[str, str] = {n: "no answer yet" for n in wave}
    while pending:
        died = stack.died()
        if died is not None:
            name = next(n for n in stack.order if stack.servers[n].proc.poll() is not None)
            raise ServerError(
                f"role {name!r} exited (code {stack.servers[name].proc.returncode}) before the stack became healthy; "
                f"read its log: {stack.logs[name]}",
                "fix that role's launch or the patch's switches on it; its log says why it stopped",
            ).with_log(stack.logs[name])
        for name in list(pending):
            try:
                response = client.get(stack.launches[name].spec.health_url)
                if response.status_code == 200:
                    pending.remove(name)
                    continue
                last[name] = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last[name] = type(exc).__name__
        if pending and time.monotonic() >= deadline:
            name = pending[0]
            raise ServerError(
                f"role {name!r} did not become healthy at {stack.launches[name].spec.health_url} within "
                f"{timeout:g} s (last: {last[name]}); read its log: {stack.logs[name]}",
                "check that role's health URL and target.start_timeout, and its log",
            ).with_log(stack.logs[name])
        if pending:
            time.sleep(_POLL_S)


def _first_request(stack: Stack, payload: Mapping[str, Any], timeout: float) -> None:
    """One real completion through the entry; on failure, the error names the entry and the roles that logged."""
    entry = stack.spec.entry.name
    url = f"http://127.0.0.1:{stack.port}/v1/completions"
    before = _log_sizes(stack)
    problem = ""
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            response = client.post(url, json=dict(payload))
        if response.status_code != 200:
            problem = f"HTTP {response.status_code}: {response.text.strip()[:160]}"
        else:
            data = response.json()
            if not isinstance(data, dict) or not data.get("choices"):
                problem = "the answer has no choices"
    except (httpx.HTTPError, ValueError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if not problem:
        return
    time.sleep(0.5)  # let the roles' logs catch up
    after = _log_sizes(stack)
    died = stack.died()
    grew = [n for n in stack.order if after[n] > before[n] and n != entry]
    where = (
        f"; roles that wrote to their log meanwhile: {', '.join(f'{n} ({stack.logs[n]})' for n in grew)}"
        if grew
        else ""
    )
    logs = ", ".join(f"{n}: {stack.logs[n]}" for n in stack.order)
    raise ServerError(
        f"every role of the stack answered its health check, but the first request through the entry role "
        f"{entry!r} failed ({problem}){where}" + (f"; {died.problem}" if died is not None else "") + f". Logs: {logs}",
        "health alone does not show a working stack: read those logs (a mismatch between roles shows there)",
    ).with_log(stack.logs[(grew or [entry])[0]])


def read_records(manifest: str) -> list[dict[str, Any]]:
    """The launch records of ``manifest``'s stacks whose launcher is still running (stale ones removed)."""
    folder = records_dir(manifest)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or not _alive(int(doc.get("launcher", 0))):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        out.append(doc)
    return out


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def role_switches(
    stack: StackSpec, patches: Sequence[Any], config: Sequence[str], config_args: Sequence[str]
) -> dict[str, tuple[dict[str, str], list[str]]]:
    """Per role, the env and launch args of the patches of ``config`` that apply to it."""
    on = set(config)
    out: dict[str, tuple[dict[str, str], list[str]]] = {r.name: ({}, []) for r in stack.roles}
    for patch in patches:
        if patch.name not in on:
            continue
        for role in patch.roles or stack.model_roles:
            env, args = out[role]
            env.update(dict(patch.env))
            args.extend(patch.args)
            for key, value in patch.config:
                args.extend(render(config_args, {"key": key, "value": value}))
    return out


__all__ = [
    "RoleLaunch",
    "RoleSpec",
    "Stack",
    "StackSpec",
    "agree_conflict",
    "check_agreement",
    "launch_stack",
    "parse_stack",
    "patch_roles",
    "read_records",
    "records_dir",
    "role_switches",
    "stack_launches",
]
