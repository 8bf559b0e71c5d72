"""Launching a manifest's stack for one configuration of its patches: one server, or every role of a stack.

A :class:`Launcher` knows the target (launch line, model, health, roles, repository) and the patches'
switches. For a configuration (the names of the patches switched on) it builds each process's argv and
environment: the base environment without any patch's variables, the target's env, then the switches of
the patches switched on (per role on a stack), commits applied in a worktree put first on ``PYTHONPATH``.
``extra_env`` adds variables to every process of the launch (live localize's agent, say); ``{role}`` in a
value is the role's name (``server`` for a single launch).

Isolate's trials, the CI gate's recording and live localize all launch through here, so the three launch
a configuration the same way, and every launch takes a slot of the run's launch guard first (``_alive``): a
second stack while one is alive raises :class:`SecondStack` unless the run asked for more at once (``slots``).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from speedtrap.stack._alive import Slot, StackGuard
from speedtrap.stack._launch import LaunchSpec, Server, free_port, render, start, wait_healthy
from speedtrap.stack._roles import StackSpec, role_switches
from speedtrap.stack._running import Placement, RoleLaunch, Stack, launch_stack, preflight, put_first, stack_launches
from speedtrap.stack._spec import PatchSpec, TargetSpec
from speedtrap.stack._worktree import Worktrees

SINGLE_ROLE = "server"  # the role name of a target launched as one process
FIRST_PROMPT = "The first request of a speedtrap trial:"


class Launcher:
    """Starts the target for a configuration; the caller stops what it gets (a Server, or a Stack of roles)."""

    def __init__(
        self, target: TargetSpec, patches: Sequence[PatchSpec], model: str | None = None, slots: int = 1
    ) -> None:
        """``slots``: how many stacks of this run may be alive at once on this node (parallel trials on threads,
        a live reference beside them); every launcher of the run shares them (``StackGuard``)."""
        self.target = target
        self.guard = StackGuard(slots)
        self.placement: Placement | None = None  # roles on Ray nodes (``isolate._ray_roles``); None: this machine
        self.patches = {p.name: p for p in patches}
        self.order = [p.name for p in patches]
        self.model = model or target.served_model or "default"  # what the first request names
        self._worktrees: Worktrees | None = None
        self._worktrees_lock = threading.Lock()

    def _base_env(self) -> dict[str, str]:
        switches = {key for p in self.patches.values() for key, _ in p.env}
        return {k: v for k, v in os.environ.items() if k not in switches}

    def launch_spec(self, config: Sequence[str], port: int, extra_env: Mapping[str, str] | None = None) -> LaunchSpec:
        """argv and env for one configuration of a single-process target."""
        values = {"port": str(port), "model": self.target.model or "", "role": SINGLE_ROLE}
        worktree = self.worktree(config)
        if worktree is not None:
            values["worktree"] = str(worktree)
        argv = render(self.target.launch, values)
        env = self._base_env()
        env.update({k: render([v], values)[0] for k, v in self.target.env})
        on = set(config)
        for name in self.order:
            if name not in on:
                continue
            patch = self.patches[name]
            env.update(dict(patch.env))
            argv += list(patch.args)
            for key, value in patch.config:
                argv += render(self.target.config_args, {"key": key, "value": value})
        _add_extra(env, extra_env, values)
        put_first(env, worktree, self.target.pythonpath)
        health = render([self.target.health], values)[0]
        cwd = self.target.cwd or worktree  # never the user's checkout: `python -m` imports from the cwd first
        return LaunchSpec(tuple(argv), env, health, self.target.start_timeout, self.target.stop_timeout, cwd)

    def role_config(self, config: Sequence[str], role: str) -> tuple[str, ...]:
        """The patches of ``config`` switched on in ``role`` (a split patch's half names its role)."""
        stack = self.target.stack
        assert stack is not None
        return tuple(n for n in config if role in (self.patches[n].roles or stack.model_roles))

    def roles_of(self, config: Sequence[str]) -> tuple[str, ...]:
        """The roles ``config``'s patches are switched on in, in the stack's order: where a culprit shows (live
        localize captures these roles; ``glm4_fused_topk_scale@prefill`` -> ``("prefill",)``)."""
        stack = self.target.stack
        if stack is None:
            return (SINGLE_ROLE,)
        return tuple(r.name for r in stack.roles if self.role_config(config, r.name))

    def stack_launches(
        self, config: Sequence[str], scratch: Mapping[str, Path], extra_env: Mapping[str, str] | None = None
    ) -> list[RoleLaunch]:
        """Every role's launch for ``config``: each role runs the worktree of its own commits (a split commit
        patch's half is applied in its role only), first on its ``PYTHONPATH`` and its working directory."""
        stack = self.target.stack
        assert stack is not None
        values = {"model": self.target.model or ""}
        values.update({f"scratch.{name}": str(path) for name, path in scratch.items()})
        worktrees = {r.name: self.worktree(self.role_config(config, r.name)) for r in stack.roles}
        patches = [self.patches[n] for n in self.order]
        common = [(k, render([v], values)[0]) for k, v in self.target.env]
        common += [(k, v) for k, v in (extra_env or {}).items()]  # {role} filled per role by stack_launches
        return stack_launches(
            stack,
            self._base_env(),
            common,
            role_switches(stack, patches, config, self.target.config_args),
            values,
            self.target.start_timeout,
            self.target.stop_timeout,
            self.target.cwd,
            worktrees,
            self.target.pythonpath,
            self.placement,
        )

    def start_stack(
        self, config: Sequence[str], log: Path, extra_env: Mapping[str, str] | None = None
    ) -> tuple[Stack, float]:
        """Every role of ``config``'s stack, healthy and answering one real request through the entry.

        Each role logs to ``<log stem>.<role>.log``; scratch folders are made fresh under ``<log stem>.scratch``,
        only once the launch passed its checks (a refused launch leaves nothing behind).
        """
        stack = self.target.stack
        assert stack is not None
        slot = self._take(config, log)
        try:
            running, seconds = self._start_stack(stack, config, log, extra_env)
        except BaseException:
            slot.release()
            raise
        running.slot = slot
        return running, seconds

    def _take(self, config: Sequence[str], log: Path) -> Slot:
        what = "the base configuration" if not config else "configuration " + " + ".join(config)
        return self.guard.take(f"{what} (log {log})")

    def _start_stack(
        self, stack: StackSpec, config: Sequence[str], log: Path, extra_env: Mapping[str, str] | None
    ) -> tuple[Stack, float]:
        stem = log.with_suffix("")
        scratch_root = stem.parent / f"{stem.name}.scratch" if stack.scratch else None
        scratch = {name: scratch_root / name for name in stack.scratch} if scratch_root is not None else {}
        launches = self.stack_launches(config, scratch, extra_env)
        preflight(stack, launches, self.placement is not None)
        if scratch_root is not None:
            if scratch_root.exists():
                shutil.rmtree(scratch_root)  # never a folder of an earlier launch: a stale KV hides patches
            for path in scratch.values():
                path.mkdir(parents=True)
        logs = {r.name: stem.parent / f"{stem.name}.{r.name}.log" for r in stack.roles}
        request = {"model": self.model, "prompt": FIRST_PROMPT, "max_tokens": 2, "temperature": 0}
        return launch_stack(
            stack,
            launches,
            logs,
            scratch_root,
            self.target.start_timeout,
            request if stack.first_request else None,
            self.target.request_timeout,
            self.placement,
        )

    def start(
        self, config: Sequence[str], log: Path, extra_env: Mapping[str, str] | None = None
    ) -> tuple[Server, float]:
        """``config``'s server (or stack of roles), healthy; the caller stops it. Returns it and the seconds."""
        if self.target.stack is not None:
            stack, seconds = self.start_stack(config, log, extra_env)
            return stack, seconds  # type: ignore[return-value]  # a Stack quacks like a Server
        slot = self._take(config, log)
        try:
            port = free_port()
            server = start(self.launch_spec(config, port, extra_env), log, port)
        except BaseException:
            slot.release()
            raise
        server.slot = slot  # wait_healthy stops a server that fails, which gives the slot back
        return server, wait_healthy(server)

    def worktree(self, config: Sequence[str]) -> Path | None:
        """The worktree of ``config``'s commits (base + them, cherry-picked), for targets with a repo."""
        if self.target.repo is None:
            return None
        with self._worktrees_lock:
            if self._worktrees is None:
                self._worktrees = Worktrees(self.target, [self.patches[n] for n in self.order])
        return self._worktrees.path(config)

    def close(self) -> None:
        if self._worktrees is not None:
            self._worktrees.close()
            self._worktrees = None


def _add_extra(env: dict[str, str], extra: Mapping[str, str] | None, values: Mapping[str, Any]) -> None:
    for key, value in (extra or {}).items():
        env[key] = render([value], {k: str(v) for k, v in values.items()})[0]
