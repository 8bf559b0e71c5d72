"""Which patch gates are on in a live server: its command line and environment, read from /proc
(locally, or through the system ssh client with an argument list), with secrets redacted."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from speedtrap._errors import UsageError
from speedtrap._redact import REDACTED, is_secret, redact_argv, redact_env
from speedtrap.spec import Gate, GateKind
from speedtrap.stack._commits import Applied
from speedtrap.stack._plugins import PluginEntry, process_plugins
from speedtrap.stack._ssh import ssh_proc

ENV, FLAG, CONFIG = GateKind.ENV, GateKind.FLAG, GateKind.CONFIG


class Switched(Protocol):
    """A patch as inspect needs it: its name and how it is switched on (None: nobody said)."""

    @property
    def name(self) -> str: ...

    @property
    def gate(self) -> Gate | None: ...


SWITCH_PREFIXES = (
    "SGLANG_",
    "VLLM_",
    "SPEEDTRAP_",
    "LLAMA_",
    "GGML_",
    "TORCH_",
    "NCCL_",
    "CUDA_",
    "TRTLLM_",
    "FLASHINFER_",
    "TRITON_",
)
_TRUTHY = {"1", "true", "yes", "on"}
_HOST_RE = re.compile(r"^[A-Za-z0-9_.@\[\]:%-]+$")


@dataclass(frozen=True)
class GateState:
    patch: str
    gate: Gate
    state: str  # "on", "off", "unknown", "ungated"
    evidence: str

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.patch, "gate": self.gate.to_json(), "state": self.state, "evidence": self.evidence}


@dataclass
class InspectReport:
    pid: int
    host: str | None
    argv: list[str]
    env: dict[str, str]  # redacted
    gates: list[GateState]
    redacted: list[str] = field(default_factory=list)
    other_switches: dict[str, str] = field(default_factory=dict)
    plugins: list[PluginEntry] = field(default_factory=list)  # vLLM plugins installed where it runs

    @property
    def patches_on(self) -> list[str]:
        return [g.patch for g in self.gates if g.state == "on"]

    @property
    def plugins_loaded(self) -> list[str]:
        return [p.name for p in self.plugins if p.loaded]

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "host": self.host or "local",
            "patches_on": self.patches_on,
            "plugins_loaded": self.plugins_loaded,
            "plugins": [p.to_json() for p in self.plugins],
            "gates": [g.to_json() for g in self.gates],
            "argv": self.argv,
            "other_switches": self.other_switches,
            "redacted": self.redacted,
            "env": self.env,
        }


def _split_nul(data: bytes) -> list[str]:
    return [part.decode("utf-8", "replace") for part in data.split(b"\x00") if part]


def _read_local(pid: int, what: str) -> bytes:
    path = Path(f"/proc/{pid}/{what}")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"no process with pid {pid}", "check the pid with `ps aux | grep serve`") from None
    except PermissionError:
        raise UsageError(
            f"cannot read {path}: permission denied (the process belongs to another user)",
            "run inspect as that user or as root",
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", "check that the process is still running") from None


def _read_ssh(host: str, pid: int, what: str) -> bytes:
    return ssh_proc(host, pid, what)


def read_process(pid: int, ssh_host: str | None = None) -> tuple[list[str], dict[str, str]]:
    """A process's argv and environment, from /proc (locally or over ssh)."""
    if not isinstance(pid, int) or pid <= 0:
        raise UsageError(f"pid {pid!r} is not a positive integer", "pass the server's process id")
    if ssh_host is not None and (ssh_host.startswith("-") or not _HOST_RE.match(ssh_host)):
        raise UsageError(f"--ssh {ssh_host!r} is not a host name", "pass a host such as gpu-node-3 or user@10.0.0.5")
    read = (lambda what: _read_ssh(ssh_host, pid, what)) if ssh_host else (lambda what: _read_local(pid, what))
    argv = _split_nul(read("cmdline"))
    if not argv:
        raise UsageError(f"pid {pid} has no command line (a kernel thread, or a zombie)", "pass the server's pid")
    env: dict[str, str] = {}
    for item in _split_nul(read("environ")):
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    return argv, env


def _args_present(args: tuple[str, ...], argv: list[str]) -> bool:
    for want in args:
        if want in argv:
            continue
        if "=" in want:
            name, value = want.split("=", 1)
            if any(a == name and i + 1 < len(argv) and argv[i + 1] == value for i, a in enumerate(argv)):
                continue
        elif any(a.startswith(want + "=") for a in argv):
            continue
        return False
    return bool(args)


def _model_config(argv: list[str]) -> dict[str, Any] | None:
    for flag in ("--model-path", "--model", "-m"):
        for i, a in enumerate(argv):
            path = (
                argv[i + 1]
                if a == flag and i + 1 < len(argv)
                else a.split("=", 1)[1]
                if a.startswith(flag + "=")
                else None
            )
            if path:
                try:
                    data = json.loads((Path(path) / "config.json").read_text())
                except (OSError, ValueError):
                    return None
                return data if isinstance(data, dict) else None
    return None


def gate_state(
    name: str,
    gate: Gate,
    argv: list[str],
    env: dict[str, str],
    local: bool,
    commits: Sequence[str] = (),
    worktree: Applied | None = None,
) -> GateState:
    """Whether a patch is on in a process, from its argv and env. A commit patch (``commits``: its resolved shas)
    is read against ``worktree``, the speedtrap worktree first on the process's PYTHONPATH (read once per
    process by the caller: :func:`worktree_applied`)."""
    if gate.kind == ENV:
        states = []
        for key, value in gate.env:
            got = env.get(key)
            on = got is not None and (
                got.strip().lower() == value.lower() or (got.strip().lower() in _TRUTHY and value.lower() in _TRUTHY)
            )
            states.append((key, got, on))
        on = all(s[2] for s in states)
        shown = ", ".join(
            f"{k}={'<unset>' if g is None else (REDACTED if is_secret(k, g) else g)}" for k, g, _ in states
        )
        return GateState(name, gate, "on" if on else "off", shown)
    if gate.kind == FLAG:
        on = _args_present(gate.args, argv)
        return GateState(
            name, gate, "on" if on else "off", f"{' '.join(gate.args)} {'in' if on else 'not in'} the command line"
        )
    if gate.kind == CONFIG:
        config = _model_config(argv) if local else None
        key, value = gate.config[0]
        if config is None or key not in config:
            return GateState(
                name,
                gate,
                "unknown",
                f"config-conditional on {key}: not visible in argv/env; check the model's config.json",
            )
        got = str(config[key]).lower()
        on = got == value.lower() or (got in _TRUTHY and value.lower() in _TRUTHY)
        return GateState(name, gate, "on" if on else "off", f"config.json: {key}={config[key]}")
    if gate.kind == GateKind.COMMIT:
        return _commit_state(name, gate, commits, worktree)
    return GateState(name, gate, "ungated", "compiled in: on whenever the build contains it")


def _commit_state(name: str, gate: Gate, commits: Sequence[str], worktree: Applied | None) -> GateState:
    """A commit patch: on when the speedtrap worktree first on the process's PYTHONPATH holds its commits."""
    if not commits:
        return GateState(name, gate, "unknown", "a commit patch whose commits are not resolved here")
    if worktree is None:
        return GateState(name, gate, "unknown", "no speedtrap worktree on PYTHONPATH: the build's commits not read")
    folder, applied = worktree
    short = ", ".join(c[:12] for c in commits)
    on = set(commits) <= applied
    return GateState(name, gate, "on" if on else "off", f"{short} {'in' if on else 'not in'} the worktree {folder}")


def switch_like(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that look like an engine's switches (``SGLANG_*``, ``VLLM_*``, ...), and
    ``PYTHONPATH`` (a worktree put first on it runs other code than the installed package)."""
    return {k: v for k, v in env.items() if k.startswith(SWITCH_PREFIXES) or k == "PYTHONPATH"}


def inspect_process(pid: int, patches: Sequence[Switched], ssh_host: str | None = None) -> InspectReport:
    argv, env = read_process(pid, ssh_host)
    maps = None if ssh_host else _read_local(pid, "maps").decode("utf-8", "replace")
    gates = [gate_state(p.name, p.gate, argv, env, ssh_host is None) for p in patches if p.gate is not None]
    known = {k for p in patches if p.gate is not None for k, _ in p.gate.env}
    env_shown, hidden = redact_env(env)
    others = {k: v for k, v in switch_like(env_shown).items() if k not in known}
    plugins = process_plugins(maps, env, argv)
    return InspectReport(pid, ssh_host, redact_argv(argv), env_shown, gates, hidden, others, plugins)
