"""One trial's stack: every role of one configuration launched, waited for, checked and stopped.

The roles and their manifest fields are specified in ``_roles.py``; this module runs them. For one
configuration, :func:`stack_launches` picks free ports, fills the placeholders and adds each role's patch
switches; :func:`launch_stack` checks that the model roles agree on the settings they must share, starts
the roles in waves (by ``after``), waits for each wave's health URLs, sends one real request through the
entry (health alone does not show a working stack), and on any failure stops what it started and raises
a ServerError naming the role and its log. A running :class:`Stack` writes a launch record per launch
(``_records.py``) that ``inspect`` reads while the launcher lives, and stops its
roles in the reverse of their start order, removing its scratch folders and its record.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from speedtrap._errors import ManifestError, ServerError
from speedtrap._redact import redact_env
from speedtrap.stack._alive import Slot
from speedtrap.stack._diagnose import diagnose, error_line, exited, log_sizes, unhealthy
from speedtrap.stack._launch import LaunchSpec, Server, check_command, free_port, render, start
from speedtrap.stack._records import write_record
from speedtrap.stack._roles import LOCAL_HOST, RoleSpec, StackSpec, flag_key

_POLL_S = 0.2


class Placement(Protocol):
    """Where a stack's roles run when they are not all on this machine (roles on Ray nodes: ``isolate._ray_roles``):
    each role's address, a port free on its node, and a role started there under the guard (a :class:`Server`'s
    face: ``proc.poll()``, ``pid``, ``alive()``, ``stop()``, ``log_path``, ``node``)."""

    def host(self, role: str) -> str: ...

    def free_port(self, role: str) -> int: ...

    def start(self, role: str, spec: LaunchSpec, log: Path, port: int) -> Server: ...


@dataclass(frozen=True)
class RoleLaunch:
    """One role of one configuration: its launch spec (placeholders filled) and its ports."""

    role: RoleSpec
    spec: LaunchSpec
    port: int
    ports: Mapping[str, int]
    recorded_env: Mapping[str, str]  # the switches of this role's environment (patch and role variables)


def setting(key: str, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The value of an agree key in one role's launch: a flag's last value (any spelling), or an env var's."""
    if not key.startswith("-"):
        return env.get(key)
    want = flag_key(key)
    value = None
    for i, a in enumerate(argv):
        if flag_key(a) != want:
            continue
        if "=" in a:
            value = a.split("=", 1)[1]
        else:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            value = "" if nxt.startswith("--") else nxt  # a bare switch (--enforce-eager) is set, valueless
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


def preflight(stack: StackSpec, launches: Sequence[RoleLaunch], placed: bool = False) -> None:
    """What refuses a launch before anything of it exists: a disagreement, a role on another host, a missing
    program (named by its role's key: ``target.roles.decode.launch[0]``). ``placed``: the roles are started on
    their nodes by a placement (Ray), which checks the programs there."""
    check_agreement(stack, launches)
    if placed:
        return
    for rl in launches:
        if rl.role.host is not None:
            raise ManifestError(
                f"target.roles.{rl.role.name}.host = {rl.role.host!r}: launching a role on another host is not "
                "supported (inspect reads it there over ssh)",
                'run speedtrap on that host, or use executor = "ray" to place the whole stack on one worker',
            )
    for rl in launches:
        check_command(rl.spec)


def put_first(env: dict[str, str], worktree: Path | None, folders: Sequence[str]) -> None:
    """The worktree's folders first on ``PYTHONPATH`` (after the target's own env, which may set it too)."""
    if worktree is None:
        return
    first = [str(worktree / d) for d in folders]
    env["PYTHONPATH"] = os.pathsep.join([*first, *filter(None, [env.get("PYTHONPATH", "")])])


def stack_launches(
    stack: StackSpec,
    base_argv_env: Mapping[str, str],
    common_env: Sequence[tuple[str, str]],
    role_switches: Mapping[str, tuple[dict[str, str], list[str]]],
    values: Mapping[str, str],
    start_timeout: float,
    stop_timeout: float,
    cwd: Path | None,
    worktrees: Mapping[str, Path | None] | None = None,
    pythonpath: Sequence[str] = (".",),
    placement: Placement | None = None,
) -> list[RoleLaunch]:
    """Every role's launch for one configuration: free ports picked, placeholders filled, switches added.

    ``worktrees``: each role's worktree (its commits), put first on its ``PYTHONPATH`` and its working
    directory unless ``cwd`` is given; ``{worktree}`` in its launch is that path.
    """
    port_on = placement.free_port if placement is not None else (lambda _role: free_port())
    hosts = {r.name: placement.host(r.name) if placement is not None else LOCAL_HOST for r in stack.roles}
    ports = {r.name: port_on(r.name) for r in stack.roles}
    extra = {r.name: {p: port_on(r.name) for p in r.ports} for r in stack.roles}
    shared = dict(values)
    for r in stack.roles:
        shared[f"{r.name}.port"] = str(ports[r.name])
        shared[f"{r.name}.host"] = hosts[r.name]
        for p, n in extra[r.name].items():
            shared[f"{r.name}.port.{p}"] = str(n)
    out = []
    for r in stack.roles:
        worktree = (worktrees or {}).get(r.name)
        own = {**shared, "port": str(ports[r.name]), "role": r.name, "host": hosts[r.name]}
        own |= {f"port.{p}": str(n) for p, n in extra[r.name].items()}
        if worktree is not None:
            own["worktree"] = str(worktree)
        env = dict(base_argv_env)
        recorded: dict[str, str] = {}
        for k, v in [*common_env, *r.env]:
            env[k] = render([v], own)[0]
            recorded[k] = env[k]
        patch_env, patch_args = role_switches.get(r.name, ({}, []))
        env.update(patch_env)
        recorded.update(patch_env)
        put_first(env, worktree, pythonpath)
        argv = render(r.launch, own) + list(patch_args)
        health = render([r.health], own)[0]
        where = f"target.roles.{r.name}.launch"
        spec = LaunchSpec(tuple(argv), env, health, start_timeout, stop_timeout, cwd or worktree, where)
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
        self.slot: Slot | None = None  # the launch guard's slot (``_alive``), given back once every role stopped
        self.hosts = {name: LOCAL_HOST for name in self.launches}  # each role's address (its node's, on Ray)

    @property
    def host(self) -> str:
        """The entry role's address: where the probes send their requests."""
        return self.hosts[self.spec.entry.name]

    def url(self, role: str | None = None) -> str:
        name = role or self.spec.entry.name
        return f"http://{self.hosts[name]}:{self.launches[name].port}"

    @property
    def pid(self) -> int:
        return self.servers[self.spec.entry.name].pid

    def pids(self) -> dict[str, int]:
        """Each role's guard pid (the leader of its process group)."""
        return {name: s.pid for name, s in self.servers.items()}

    def alive(self) -> bool:
        return bool(self.servers) and all(s.alive() for s in self.servers.values())

    def died(self) -> ServerError | None:
        """The first role that exited, named with its exit code and its log's error line; None while all run."""
        return exited(self)

    def diagnose(self, problem: str, since: Mapping[str, int] | None = None) -> ServerError:
        """The error for a request through the entry that failed with ``problem``: the role that exited or
        stalled, with its log line (``since``: each role's log size when the request began)."""
        return diagnose(self, problem, since)

    def broken(self, since: Mapping[str, int] | None = None) -> ServerError | None:
        """The role that exited, else one that fails its health URL, with its log line; None if all look fine."""
        return exited(self, since) or unhealthy(self, since)

    def log_sizes(self) -> dict[str, int]:
        return log_sizes(self.logs)

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
        if self.slot is not None:
            self.slot.release()
        return None

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_stack(
    spec: StackSpec,
    launches: Sequence[RoleLaunch],
    logs: Mapping[str, Path],
    scratch: Path | None,
    start_timeout: float,
    first_request: Mapping[str, Any] | None,
    request_timeout: float | None = None,
    placement: Placement | None = None,
) -> tuple[Stack, float]:
    """Start every role (in waves, by ``after``), wait until all are healthy, then one real request.

    Any failure stops what was started and raises a ServerError naming the role and its log.
    """
    preflight(spec, launches, placement is not None)
    stack = Stack(spec, launches, logs, scratch)
    if placement is not None:
        stack.hosts = {name: placement.host(name) for name in stack.launches}
    deadline = time.monotonic() + start_timeout
    try:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            for wave in spec.start_order():
                for name in wave:
                    rl = stack.launches[name]
                    if placement is not None:
                        stack.servers[name] = placement.start(name, rl.spec, logs[name], rl.port)
                    else:
                        stack.servers[name] = start(rl.spec, logs[name], rl.port)
                    stack.order.append(name)
                write_record(stack)
                _wait_wave(stack, wave, client, deadline, start_timeout)
        if first_request is not None:
            _first_request(stack, first_request, request_timeout or start_timeout)
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
            line = error_line(stack.logs[name])
            on = f" on node {stack.servers[name].node}" if stack.servers[name].node else ""
            code = stack.servers[name].proc.returncode or 0
            how = f"signal {-code}" if code < 0 else f"code {code}"
            raise ServerError(
                f"role {name!r} exited ({how}){on} before the stack became healthy"
                f"{': ' + line if line else ''}; read its log: {stack.logs[name]}",
                "fix that role's launch or the patch's switches on it; its log says why it stopped",
                log=stack.logs[name],
            )
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
    """One real completion through the entry, watched: a role that exits meanwhile ends it at once, and one
    that takes longer than ``timeout`` is an error naming the role that exited or stalled, with its log line."""
    url = f"{stack.url()}/v1/completions"
    before = stack.log_sizes()
    answer: list[httpx.Response | BaseException] = []

    def send() -> None:
        try:
            with httpx.Client(timeout=timeout, trust_env=False) as client:
                answer.append(client.post(url, json=dict(payload)))
        except BaseException as exc:  # handed to the waiting thread
            answer.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline and stack.died() is None:
        thread.join(_POLL_S)
    entry = stack.spec.entry.name
    what = f"the first request through the entry role {entry!r}"
    if not answer:
        time.sleep(0.5)  # let the roles' logs catch up
        if stack.died() is not None:
            raise stack.diagnose(f"{what} was pending when it exited", before)
        raise stack.diagnose(f"{what} got no answer within {timeout:g} s (target.request_timeout)", before)
    got = answer[0]
    problem = ""
    if isinstance(got, BaseException):
        problem = f"{type(got).__name__}: {got}"
    elif got.status_code != 200:
        problem = f"HTTP {got.status_code}: {got.text.strip()[:160]}"
    else:
        try:
            data = got.json()
        except ValueError:
            data = None
        if not isinstance(data, dict) or not data.get("choices"):
            problem = "the answer has no choices"
    if not problem:
        return
    time.sleep(0.5)  # let the roles' logs catch up
    broke = exited(stack, before) or unhealthy(stack, before)
    if broke is not None:
        raise ServerError(
            f"every role of the stack answered its health check, but {what} failed ({problem}): {broke.problem}",
            broke.fix,
            log=broke.log,
        )
    now = stack.log_sizes()
    grew = [n for n in stack.order if now[n] > before[n] and n != entry]
    where = (
        "; roles that wrote to their log meanwhile: "
        + "; ".join(f"{n} ({stack.logs[n]}{': ' + line if (line := error_line(stack.logs[n], before[n])) else ''})"
                    for n in grew)
        if grew
        else ""
    )  # fmt: skip
    logs = ", ".join(f"{n}: {stack.logs[n]}" for n in stack.order)
    raise ServerError(
        f"every role of the stack answered its health check, but {what} failed ({problem}){where}. Logs: {logs}",
        "health alone does not show a working stack: read those logs (a mismatch between roles shows there)",
        log=stack.logs[(grew or [entry])[0]],
    )


__all__ = [
    "RoleLaunch",
    "Stack",
    "check_agreement",
    "launch_stack",
    "stack_launches",
]
