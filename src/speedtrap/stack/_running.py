"""One trial's stack: every role of one configuration launched, waited for, checked and stopped.

The roles and their manifest fields are specified in ``_roles.py``; this module runs them. For one
configuration, :func:`stack_launches` picks free ports, fills the placeholders and adds each role's patch
switches; :func:`launch_stack` checks that the model roles agree on the settings they must share, starts
the roles in waves (by ``after``), waits for each wave's health URLs, sends one real request through the
entry (health alone does not show a working stack), and on any failure stops what it started and raises
a ServerError naming the role and its log. A running :class:`Stack` writes a launch record per launch
(``records_dir``) that ``inspect`` reads while the launcher lives (:func:`read_records`), and stops its
roles in the reverse of their start order, removing its scratch folders and its record.
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
from speedtrap.stack._launch import LaunchSpec, Server, free_port, render, start
from speedtrap.stack._roles import RoleSpec, StackSpec

_POLL_S = 0.2


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
        own = {**shared, "port": str(ports[r.name]), "role": r.name}
        own |= {f"port.{p}": str(n) for p, n in extra[r.name].items()}
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


__all__ = [
    "RoleLaunch",
    "Stack",
    "check_agreement",
    "launch_stack",
    "read_records",
    "records_dir",
    "stack_launches",
]
