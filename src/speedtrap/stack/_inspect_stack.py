"""``speedtrap inspect --manifest F`` without a pid: every role of a live stack, every process of each role.

The roles are found by the launch records speedtrap writes when it starts a stack (the guard's pid per
role, its port, the switch variables it set); each role's processes are its leader (the guard's child) and
the leader's descendants, read from /proc. Gates are read from the leader's environment, else from the
environment recorded at launch: vLLM's and SGLang's workers retitle themselves (``setproctitle``) and their
``/proc/PID/environ`` then shows none of the launch variables, so a gate read there would be wrong. Each
process whose environment lacks the role's launch variables (or cannot be read) is named as unreadable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import SpeedtrapError, UsageError
from speedtrap._redact import redact_argv, redact_env
from speedtrap.stack._commits import worktree_applied
from speedtrap.stack._inspect import GateState, gate_state, switch_like
from speedtrap.stack._records import read_records
from speedtrap.stack._spec import PatchSpec, TargetSpec
from speedtrap.stack._worktree import resolve_commit_patches


@dataclass(frozen=True)
class ProcessState:
    pid: int
    name: str
    env_readable: bool
    evidence: str  # how many launch variables its environ shows, or why it cannot be read

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "name": self.name, "env_readable": self.env_readable, "evidence": self.evidence}


@dataclass
class RoleReport:
    role: str
    guard_pid: int
    port: int
    log: str
    leader: ProcessState | None
    processes: list[ProcessState] = field(default_factory=list)  # the leader first, then its descendants
    gates: list[GateState] = field(default_factory=list)
    gates_from: str = ""
    argv: list[str] = field(default_factory=list)  # the leader's command line (redacted), else the recorded one
    switches: dict[str, str] = field(default_factory=dict)  # engine switches (SGLANG_*, VLLM_*, ...) it runs with
    node: str = "this machine"  # where it runs: a Ray node (id and address) for a role placed on one
    ranks: int = 1  # the tensor-parallel ranks its launch asks for

    @property
    def patches_on(self) -> list[str]:
        return [g.patch for g in self.gates if g.state == "on"]

    @property
    def unreadable(self) -> list[ProcessState]:
        return [p for p in self.processes if not p.env_readable]

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "guard_pid": self.guard_pid,
            "port": self.port,
            "log": self.log,
            "leader": self.leader.to_json() if self.leader else None,
            "processes": [p.to_json() for p in self.processes],
            "unreadable": [p.pid for p in self.unreadable],
            "patches_on": self.patches_on,
            "gates_from": self.gates_from,
            "gates": [g.to_json() for g in self.gates],
            "argv": self.argv,
            "switches": self.switches,
            "node": self.node,
            "ranks": self.ranks,
        }


@dataclass
class StackReport:
    manifest: str
    launcher: int
    roles: list[RoleReport]

    def to_json(self) -> dict[str, Any]:
        return {"manifest": self.manifest, "launcher": self.launcher, "roles": [r.to_json() for r in self.roles]}


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return sorted(set(out))


def _descendants(pid: int) -> list[int]:
    out, todo = [], _children(pid)
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo.extend(_children(child))
    return out


def _cmdline(pid: int | None) -> list[str]:
    try:
        data = Path(f"/proc/{pid}/cmdline").read_bytes() if pid is not None else b""
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in data.split(b"\0") if part]


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _environ(pid: int) -> dict[str, str] | None:
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in data.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep:
            out[key] = value
    return out


def _state(pid: int, launch_keys: set[str]) -> tuple[ProcessState, dict[str, str] | None]:
    env = _environ(pid)
    if env is None:
        return ProcessState(pid, _name(pid), False, "its /proc/PID/environ cannot be read"), None
    shown = launch_keys & set(env)
    readable = shown == launch_keys
    evidence = f"{len(env)} variables; {len(shown)} of the role's {len(launch_keys)} launch variables"
    if not readable:
        evidence += " (the process rewrote its environment block, e.g. setproctitle: gates not read here)"
    return ProcessState(pid, _name(pid), readable, evidence), env


def inspect_stack(manifest_path: Path, target: TargetSpec, patches: Sequence[PatchSpec]) -> StackReport:
    """The live stack of ``manifest_path`` (the one speedtrap launched from it), role by role: ``target`` and
    ``patches`` are the manifest's, read once with their commits as written (``load_manifest(path,
    resolve_commits=False)``)."""
    # commit patches: their full shas, read back from each role's worktree (a repository moved since the launch:
    # those gates stay unknown, the rest is read)
    with contextlib.suppress(SpeedtrapError):
        target, patches = resolve_commit_patches(target, patches)
    stack = target.stack
    if stack is None:
        raise UsageError(
            f"{manifest_path} has no target.roles: a single server", "pass its pid: speedtrap inspect --pid PID"
        )
    records = read_records(stack.manifest)
    if not records:
        raise UsageError(
            f"no live stack of {manifest_path} (no launch record of a running speedtrap)",
            "start one (speedtrap bisect / check --manifest), or inspect a process: speedtrap inspect --pid PID",
        )
    record = records[-1]
    roles = []
    for row in record.get("roles", []):
        name = str(row["role"])
        guard = int(row["guard_pid"])
        recorded: dict[str, str] = {str(k): str(v) for k, v in dict(row.get("env", {})).items()}
        launch_keys = set(recorded) | {"PATH"}
        children = _children(guard)
        leader_pid = children[0] if children else None
        report = RoleReport(name, guard, int(row.get("port", 0)), str(row.get("log", "")), None)
        report.node, report.ranks = str(row.get("node", "this machine")), int(row.get("ranks", 1))
        leader_env: dict[str, str] | None = None
        if leader_pid is not None:
            leader, leader_env = _state(leader_pid, launch_keys)
            report.leader = leader
            report.processes.append(leader)
            for pid in _descendants(leader_pid):
                report.processes.append(_state(pid, launch_keys)[0])
        argv = list(row.get("argv", []))
        applies = [p for p in patches if name in (p.roles or stack.model_roles)]
        if report.leader is not None and report.leader.env_readable and leader_env is not None:
            env, report.gates_from = leader_env, f"the leader's environment (pid {report.leader.pid})"
        else:
            env, report.gates_from = recorded, "the environment recorded at launch (the leader's was not readable)"
        shown = redact_env(env)[0]
        worktree = worktree_applied(shown.get("PYTHONPATH", "")) if any(p.commit for p in applies) else None
        report.gates = [gate_state(p.name, p.gate, argv, shown, True, p.commits, worktree) for p in applies]
        readable = report.leader is not None and report.leader.env_readable
        report.argv = redact_argv((_cmdline(leader_pid) if readable else []) or argv)  # a retitled leader: as launched
        report.switches = dict(sorted(switch_like(shown).items()))  # engine switches and PYTHONPATH
        roles.append(report)
    return StackReport(str(record.get("manifest", "")), int(record.get("launcher", 0)), roles)
