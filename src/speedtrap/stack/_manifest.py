"""The manifest's ``[target]`` and ``[[patches]]``: what is launched and how each patch is switched on.

isolate, the CI gate, triage and live localize read a stack through here; every problem is a
:class:`ManifestError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError
from speedtrap._fields import first_cycle, integer, no_unknown, number, resolve, str_list, str_table
from speedtrap.spec import Platform
from speedtrap.stack._roles import DEFAULT_HEALTH, STACK_KEYS, StackSpec, agree_conflict, parse_stack, patch_roles
from speedtrap.stack._spec import PatchSpec, TargetSpec
from speedtrap.stack._worktree import commit_target_fields

TARGET_KEYS = {
    "name",
    "overrides",
    "launch",
    "model",
    "health",
    "served_model",
    "start_timeout",
    "stop_timeout",
    "request_timeout",
    "env",
    "config_args",
    "retries",
    "cwd",
    "repo",
    "base",
    "pythonpath",
    "platform",
    *STACK_KEYS,
}
# kind / scope / phases are facts a patch's author may declare for triage; isolate ignores them.
PATCH_KEYS = {
    "name",
    "env",
    "args",
    "config",
    "diff",
    "gate",
    "summary",
    "requires",
    "conflicts",
    "kind",
    "scope",
    "phases",
    "commit",
    "roles",
    "split",
}


def manifest_stack(data: Mapping[str, Any], path: Path | None) -> StackSpec | None:
    """The stack of roles a parsed manifest declares (``target.roles``), or None: triage reads patches with it."""
    target = data.get("target")
    return parse_stack(target, path) if isinstance(target, dict) and "roles" in target else None


def parse_target(raw: Mapping[str, Any], base: Path, path: Path | None = None) -> TargetSpec:
    no_unknown(raw, TARGET_KEYS, "target.", "target")
    platform = Platform.parse(raw["platform"], "target.platform", ManifestError) if "platform" in raw else None
    stack = parse_stack(raw, path)
    if stack is not None:  # the entry role's launch and health stand for the target's
        if "name" in raw:
            raise ManifestError("target has both name and roles", "drop target.name: a stack of roles is launched")
        if "health" in raw:
            raise ManifestError("target.health is per role in a stack", "write health in each [target.roles.NAME]")
        raw = {**raw, "launch": list(stack.entry.launch), "health": stack.entry.health}
        if any("{model}" in a for r in stack.roles for a in r.launch) and raw.get("model") is None:
            raise ManifestError(
                "a role's launch uses {model} but target.model is not set", 'add model = "path/to/model"'
            )
    name, launch = raw.get("name"), raw.get("launch")
    if (name is None) == (launch is None):
        raise ManifestError(
            "target needs exactly one of target.name (an in-process target) or target.launch (a server command)",
            'write name = "smol-moe", or launch = ["python", "-m", "...", "--port", "{port}"]',
        )
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise ManifestError("target.name must be a non-empty string", 'write name = "smol-moe"')
        for key in ("model", "health", "served_model", "config_args", "env", "start_timeout", "repo"):
            if key in raw:
                raise ManifestError(f"target.{key} is for servers, not in-process targets", f"drop target.{key}")
        return TargetSpec(
            name=name, overrides=str_table(raw.get("overrides", {}), "target.overrides"), platform=platform
        )
    argv = str_list(launch, "target.launch")
    if not argv:
        raise ManifestError("target.launch is empty", 'write launch = ["program", "arg", ..., "{port}"]')
    if not any("{port}" in a for a in argv):
        raise ManifestError("target.launch has no {port} placeholder", 'add the port argument, e.g. "--port", "{port}"')
    model = raw.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ManifestError("target.model must be a path string", 'write model = "models/x.gguf"')
    if any("{model}" in a for a in argv) and model is None:
        raise ManifestError("target.launch uses {model} but target.model is not set", 'add model = "path/to/model"')
    if model is not None:
        model = str(resolve(base, model))
    health = raw.get("health", DEFAULT_HEALTH)
    if not isinstance(health, str) or not health.startswith(("http://", "https://")):
        raise ManifestError("target.health must be an http:// URL", 'write health = "http://127.0.0.1:{port}/health"')
    served = raw.get("served_model")
    if served is not None and not isinstance(served, str):
        raise ManifestError("target.served_model must be a string", 'write served_model = "my-model"')
    config_args = str_list(raw.get("config_args", ["--set", "{key}={value}"]), "target.config_args")
    cwd = raw.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ManifestError("target.cwd must be a path string", 'write cwd = "."')
    return TargetSpec(
        launch=tuple(argv),
        model=model,
        health=health,
        served_model=served,
        start_timeout=number(raw.get("start_timeout", 120.0), "target.start_timeout"),
        stop_timeout=number(raw.get("stop_timeout", 10.0), "target.stop_timeout"),
        env=str_table(raw.get("env", {}), "target.env"),
        config_args=tuple(config_args),
        retries=integer(raw.get("retries", 1), "target.retries", minimum=0),
        cwd=resolve(base, cwd) if cwd else None,
        request_timeout=number(raw["request_timeout"], "target.request_timeout") if "request_timeout" in raw else None,
        stack=stack,
        platform=platform,
        **commit_target_fields(raw, base),
    )


def parse_patches(raw: Any, base: Path, required: bool, stack: StackSpec | None = None) -> tuple[PatchSpec, ...]:
    """The ``[[patches]]`` tables (triage reads them through here too); diff paths relative to ``base``.

    On a stack of roles, ``roles`` names the roles a patch is switched on in (default: every role that runs
    the model), and ``split = true`` makes one switch per role, ``name@role``, for the search.
    """
    if raw is None:
        if required:
            raise ManifestError("manifest has no [[patches]] tables", "add one [[patches]] table per patch")
        return ()
    if not isinstance(raw, list) or not raw:
        raise ManifestError("patches must be [[patches]] tables", "add one [[patches]] table per patch")
    out: list[PatchSpec] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(raw):
        where = f"patches[{i}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where} must be a table", "write [[patches]] tables")
        no_unknown(entry, PATCH_KEYS, f"{where}.", where)
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ManifestError(f"{where}.name is missing or not a string", "give every patch a name")
        if name in seen:
            raise ManifestError(f"{where}.name {name!r} is used twice (also patches[{seen[name]}])", "rename one")
        seen[name] = i
        env = str_table(entry.get("env", {}), f"{where}.env")
        for key, _ in env:
            if not key or "=" in key or "\0" in key:
                raise ManifestError(f"{where}.env: {key!r} is not a valid environment variable name", "rename it")
        args = tuple(str_list(entry.get("args", []), f"{where}.args"))
        config = str_table(entry.get("config", {}), f"{where}.config")
        gate = entry.get("gate")
        if gate not in (None, "ungated"):
            raise ManifestError(f'{where}.gate must be "ungated" when given', 'drop it, or write gate = "ungated"')
        if gate == "ungated" and (env or args or config):
            raise ManifestError(f"{where} is marked ungated but has env/args/config", "drop gate or the switches")
        diff = entry.get("diff")
        if diff is not None and not isinstance(diff, str):
            raise ManifestError(f"{where}.diff must be a path string", 'write diff = "patches/x.diff"')
        summary = entry.get("summary", "")
        if not isinstance(summary, str):
            raise ManifestError(f"{where}.summary must be a string", "quote it")
        commit = entry.get("commit")
        if commit is not None and (not isinstance(commit, str) or not commit.strip()):
            raise ManifestError(f"{where}.commit must be a sha or A..B (a string)", 'write commit = "3f2a9c1"')
        if commit is not None and gate == "ungated":
            raise ManifestError(f"{where} is a commit: it can be switched, so it is not ungated", "drop gate")
        requires = tuple(str_list(entry.get("requires", []), f"{where}.requires"))
        conflicts = tuple(str_list(entry.get("conflicts", []), f"{where}.conflicts"))
        spec = PatchSpec(
            name,
            env,
            args,
            config,
            gate == "ungated",
            resolve(base, diff) if diff else None,
            summary,
            requires,
            conflicts,
            commit.strip() if commit is not None else None,
        )
        out.extend(_role_patches(entry, spec, stack, where))
    check_relations(out)
    return tuple(out)


def _role_patches(entry: Mapping[str, Any], spec: PatchSpec, stack: StackSpec | None, where: str) -> list[PatchSpec]:
    """The patch with its roles checked, or its ``name@role`` halves (``split = true``)."""
    import dataclasses

    written = str_list(entry.get("roles", []), f"{where}.roles")
    split = entry.get("split", False)
    if not isinstance(split, bool):
        raise ManifestError(f"{where}.split must be true or false", "write split = true")
    if "@" in spec.name:
        raise ManifestError(f"{where}.name {spec.name!r} has an @ (kept for split roles: name@role)", "rename it")
    if stack is None:  # triage reading patches alone, or a single-launch target
        if split or written:
            if written and not split:
                return [dataclasses.replace(spec, roles=tuple(written))]
            if split and written:
                return [dataclasses.replace(spec, name=f"{spec.name}@{r}", roles=(r,)) for r in written]
        return [spec]
    roles = patch_roles(stack, spec.name, written, where)
    if spec.ungated and (split or written):
        raise ManifestError(f"{where} is ungated: it cannot be switched per role", "drop roles and split")
    if split and len(roles) < 2:
        raise ManifestError(f"{where}.split needs two roles or more (it has {list(roles)})", "drop split")
    parts = [(f"{spec.name}@{r}", (r,)) for r in roles] if split else [(spec.name, roles if written else ())]
    out = []
    for name, on in parts:
        why = agree_conflict(stack, name, on or stack.model_roles, dict(spec.env), spec.args)
        if why is not None:
            raise ManifestError(f"{where}: {why}", "switch it on every model role: drop roles / split")
        out.append(dataclasses.replace(spec, name=name, roles=on))
    return out


def check_relations(patches: Sequence[PatchSpec]) -> None:
    """``requires`` / ``conflicts`` name known patches, are not self-referential, and requires has no cycle."""
    index = {p.name: i for i, p in enumerate(patches)}
    for i, p in enumerate(patches):
        for field_name in ("requires", "conflicts"):
            for j, other in enumerate(getattr(p, field_name)):
                where = f"patches[{i}].{field_name}[{j}]"
                if other not in index:
                    raise ManifestError(f"{where} names no patch: {other!r}", f"choose from: {', '.join(index)}")
                if other == p.name:
                    raise ManifestError(f"{where}: patch {p.name!r} names itself", "drop it")
        clash = set(p.requires) & set(p.conflicts)
        if clash:
            raise ManifestError(f"patches[{i}] both requires and conflicts with {sorted(clash)}", "keep one")
        if p.ungated and p.conflicts:
            raise ManifestError(
                f"patches[{i}] is ungated (always on) but conflicts with {list(p.conflicts)}",
                "drop the conflict, or give the patch a switch",
            )
    cycle = first_cycle({p.name: p.requires for p in patches})
    if cycle is not None:
        raise ManifestError(
            f"patches[{index[cycle[0]]}].requires forms a cycle: {' -> '.join(cycle)}", "break the cycle"
        )
