"""The stack: what a manifest launches, how each patch is switched on, and the live processes it runs.

Below the stages that launch stacks (isolate's trials, the CI gate's recording, live localize)::

    from speedtrap.manifest import load_manifest
    from speedtrap.stack import Launcher
    manifest = load_manifest(Path("speedtrap.toml"))
    target, patches = manifest.target, manifest.patches
    launcher = Launcher(target, patches)
    server, seconds = launcher.start(("glm4_fused_topk_scale",), Path("runs/x/trial.log"))
    with server:
        ...  # probe it at http://127.0.0.1:{server.port}

- the manifest's ``[target]`` and ``[[patches]]`` (:func:`parse_target`, :func:`parse_patches`);
- one stack alive: every launch takes a slot of the run's :class:`StackGuard` first, and a second stack while one
  is alive raises :class:`SecondStack` (a bug of the stage that launched it);
- one server or a stack of roles launched under a guard that takes it down when the launcher dies
  (:class:`Server`, :class:`Stack`), health, the first real request, scratch folders;
- commit patches applied in a git worktree per subset (:class:`Worktrees`);
- inspection of live processes: which gates a running server or stack runs with (:func:`inspect_process`,
  :func:`inspect_stack`).
"""

from __future__ import annotations

from speedtrap.stack._alive import SecondStack, Slot, StackGuard
from speedtrap.stack._commits import CommitConflict, CommitTrees, GitFailed, git
from speedtrap.stack._from_pids import FromPids, init_from_pids
from speedtrap.stack._inspect import GateState, InspectReport, Switched, gate_state, inspect_process, read_process
from speedtrap.stack._inspect_stack import RoleReport, StackReport, inspect_stack
from speedtrap.stack._launch import (
    CommandNotFound,
    LaunchSpec,
    Server,
    free_port,
    launch,
    render,
    start,
    stop_all,
    wait_healthy,
)
from speedtrap.stack._launcher import SINGLE_ROLE, Launcher
from speedtrap.stack._manifest import (
    PATCH_KEYS,
    TARGET_KEYS,
    check_relations,
    manifest_stack,
    parse_patches,
    parse_target,
)
from speedtrap.stack._plugins import PluginEntry
from speedtrap.stack._records import read_records, records_dir
from speedtrap.stack._roles import DEFAULT_HEALTH, STACK_KEYS, RoleSpec, StackSpec
from speedtrap.stack._running import RoleLaunch, Stack, launch_stack, stack_launches
from speedtrap.stack._spec import PatchSpec, TargetSpec
from speedtrap.stack._worktree import (
    Worktrees,
    commit_order,
    commit_target_fields,
    resolve_commit_patches,
    resolve_commits_in,
)

__all__ = [
    "DEFAULT_HEALTH",
    "PATCH_KEYS",
    "SINGLE_ROLE",
    "STACK_KEYS",
    "TARGET_KEYS",
    "CommandNotFound",
    "CommitConflict",
    "CommitTrees",
    "FromPids",
    "GateState",
    "GitFailed",
    "InspectReport",
    "LaunchSpec",
    "Launcher",
    "PatchSpec",
    "PluginEntry",
    "RoleLaunch",
    "RoleReport",
    "RoleSpec",
    "SecondStack",
    "Server",
    "Slot",
    "Stack",
    "StackGuard",
    "StackReport",
    "StackSpec",
    "Switched",
    "TargetSpec",
    "Worktrees",
    "check_relations",
    "commit_order",
    "commit_target_fields",
    "free_port",
    "gate_state",
    "git",
    "init_from_pids",
    "inspect_process",
    "inspect_stack",
    "launch",
    "launch_stack",
    "manifest_stack",
    "parse_patches",
    "parse_target",
    "read_process",
    "read_records",
    "records_dir",
    "render",
    "resolve_commit_patches",
    "resolve_commits_in",
    "stack_launches",
    "start",
    "stop_all",
    "wait_healthy",
]
