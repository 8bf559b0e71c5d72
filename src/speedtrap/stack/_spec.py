"""A stack as the manifest declares it: the target (launch, model, health, roles, repo) and its patches' switches."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._redact import redact_argv, redact_env
from speedtrap.spec import Gate, GateKind, Platform
from speedtrap.stack._roles import DEFAULT_HEALTH, StackSpec


@dataclass(frozen=True)
class PatchSpec:
    """One patch: how to switch it on (env vars, launch args, config keys) and how it relates to others."""

    name: str
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    config: tuple[tuple[str, str], ...] = ()
    ungated: bool = False
    diff: Path | None = None
    summary: str = ""
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    commit: str | None = None  # as written: a sha or A..B of target.repo
    commits: tuple[str, ...] = ()  # resolved: full shas, in history order
    commit_rank: tuple[int, ...] = field(default=(), compare=False)  # each commit's place in base..HEAD
    roles: tuple[str, ...] = ()  # a stack's roles it is switched on in (); () : every role that runs the model

    @property
    def gate(self) -> Gate:
        """How it is switched on (one of the patching module's gates)."""
        if self.ungated:
            kind = GateKind.UNGATED
        elif self.commit is not None and not (self.env or self.args or self.config):
            kind = GateKind.COMMIT
        else:
            kind = (
                GateKind.ENV
                if self.env
                else GateKind.FLAG
                if self.args
                else GateKind.CONFIG
                if self.config
                else GateKind.IN_PROCESS
            )
        return Gate(kind, self.env, self.args, self.config)

    def switch(self) -> dict[str, Any]:
        """What turns it on: part of a trial's identity (changing a switch changes the trial)."""
        out = {"env": dict(self.env), "args": list(self.args), "config": dict(self.config), "ungated": self.ungated}
        if self.commit is not None:
            out["commits"] = list(self.commits or (self.commit,))
        if self.roles:  # left out when empty: earlier runs' trial keys hold
            out["roles"] = list(self.roles)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gate": self.gate.kind.value,
            **self.switch(),
            "diff": str(self.diff) if self.diff else None,
            "summary": self.summary,
            "requires": list(self.requires),
            "conflicts": list(self.conflicts),
            **({"commit": self.commit, "commits": list(self.commits)} if self.commit is not None else {}),
        }


@dataclass(frozen=True)
class TargetSpec:
    """An in-process target (``name``) or a server launched per configuration (``launch``)."""

    name: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    launch: tuple[str, ...] = ()
    model: str | None = None
    health: str = DEFAULT_HEALTH
    served_model: str | None = None
    start_timeout: float = 120.0
    stop_timeout: float = 10.0
    env: tuple[tuple[str, str], ...] = ()
    config_args: tuple[str, ...] = ("--set", "{key}={value}")
    retries: int = 1
    cwd: Path | None = None
    repo: Path | None = None  # commit patches: the stack's git checkout (only read)
    base: str | None = None  # commit patches: the commit they apply to (resolved: a full sha)
    pythonpath: tuple[str, ...] = (".",)  # commit patches: worktree folders put first on PYTHONPATH
    stack: StackSpec | None = None  # target.roles: a multi-process stack (launch/health are its entry's)
    platform: Platform | None = None  # target.platform: the hardware served on (triage reads it; isolate checks it)

    @property
    def in_process(self) -> bool:
        return not self.launch

    def identity(self) -> dict[str, Any]:
        if self.in_process:
            return {"in_process": self.name, "overrides": dict(self.overrides)}
        return {  # secrets in the launch line or env are hidden: identities are stored in run directories
            "launch": redact_argv(self.launch),
            "model": _file_identity(self.model),
            "served_model": self.served_model,
            "env": redact_env(dict(self.env))[0],
            "config_args": list(self.config_args),
            **({"base": self.base, "pythonpath": list(self.pythonpath)} if self.repo is not None else {}),
            **({"stack": self.stack.to_json()} if self.stack is not None else {}),
        }

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name} if self.in_process else {}
        if self.in_process:
            out["overrides"] = dict(self.overrides)
            return out
        out.update(  # written into run directories and reports: secrets hidden
            launch=redact_argv(self.launch),
            model=self.model,
            health=self.health,
            served_model=self.served_model,
            start_timeout=self.start_timeout,
            stop_timeout=self.stop_timeout,
            env=redact_env(dict(self.env))[0],
            config_args=list(self.config_args),
            retries=self.retries,
            cwd=str(self.cwd) if self.cwd else None,
        )
        if self.repo is not None:
            out.update(repo=str(self.repo), base=self.base, pythonpath=list(self.pythonpath))
        if self.stack is not None:
            out["stack"] = self.stack.to_json()
        return out


def _file_identity(path: str | None) -> Any:
    """A model file's identity without hashing gigabytes: path, size and modification time."""
    if not path:
        return None
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return {"path": path}
    return {"path": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
