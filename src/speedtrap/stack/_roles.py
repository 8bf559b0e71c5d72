"""Multi-process stacks: roles (prefill, decode, router, replicas, ...), their manifest fields and checks.

A stack is one or more roles, each a process launched by argv (no shell) in its own process group under
the launch guard (``_guard.py``), with its own environment, health URL and extra free ports. Roles start
after the roles named in their ``after`` (the others in parallel); one role is the entry the probes talk
to. Before a trial is probed, one real request goes through the entry: two roles may both answer
``/health`` 200 while the first request fails (a prefill/decode model mismatch), so health alone does not
make a stack ready. Any role exiting ends the trial as an error naming the role and its log; the stack is
stopped in the reverse of its start order. Scratch folders (``{scratch.kv}``) are made fresh for every
launch: a KV folder left over from another configuration makes a decode read that configuration's KV.
Launching, waiting and stopping one trial's stack is ``_running.py`` (why a request failed: ``_diagnose.py``);
this module holds the spec.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError
from speedtrap._fields import first_cycle, no_unknown, str_list, str_table
from speedtrap._redact import redact_argv, redact_env
from speedtrap.stack._launch import render

ROLE_KEYS = {
    "launch", "env", "health", "ports", "after", "host", "entry", "runs_model", "prompt_logprobs", "node", "resources",
}  # fmt: skip
RANK_FLAGS = ("--tp", "--tp-size", "--tensor-parallel-size")  # a role's tensor-parallel ranks
LOCAL_HOST = "127.0.0.1"  # {host} and {ROLE.host} of a role launched on this machine
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
    prompt_logprobs: bool = False  # the probe asks the prompt's logprobs of this role directly (a PD prefill)
    node: str | None = None  # executor = "ray": the Ray node label this role runs on (``key=value`` or a value)
    resources: tuple[tuple[str, float], ...] = ()  # executor = "ray": what this role's bundle reserves (CPU, GPU, ...)

    @property
    def ranks(self) -> int:
        """The ranks (processes holding a share of the model) its launch asks for: its ``--tp`` value, else 1."""
        argv = list(self.launch)
        for i, arg in enumerate(argv):
            for flag in RANK_FLAGS:
                value = arg.split("=", 1)[1] if arg.startswith(flag + "=") else None
                if arg == flag and i + 1 < len(argv):
                    value = argv[i + 1]
                if value is not None and value.isdigit():
                    return max(1, int(value))
        return 1

    def where(self) -> str:
        """Where the manifest places it, in words: ``node speedtrap=a`` / ``any Ray node`` / ``this machine``."""
        if self.node is not None:
            return f"node {self.node}"
        return "any Ray node" if self.resources else "this machine"

    @property
    def placed(self) -> bool:
        """The role says where it runs on a Ray cluster (its own bundle, on its own node)."""
        return self.node is not None or bool(self.resources)

    def to_json(self) -> dict[str, Any]:
        return {
            **({"prompt_logprobs": True} if self.prompt_logprobs else {}),  # left out when false: identities hold
            **({"node": self.node} if self.node is not None else {}),
            **({"resources": dict(self.resources)} if self.resources else {}),
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
    prompt = [r.name for r in roles if r.prompt_logprobs]
    if len(prompt) > 1:
        raise ManifestError(
            f"target.roles: prompt_logprobs is set on {', '.join(prompt)}; the prompt's logprobs come from one role",
            "keep prompt_logprobs = true on the prefill only",
        )
    scratch = tuple(str_list(raw.get("scratch", []), "target.scratch"))
    for s in scratch:
        if not s or not set(s) <= _NAME_OK:
            raise ManifestError(f"target.scratch name {s!r} is not a plain name", 'write scratch = ["kv"]')
    agree = tuple(str_list(raw.get("agree", []), "target.agree"))
    first = raw.get("first_request", True)
    if not isinstance(first, bool):
        raise ManifestError("target.first_request must be true or false", "write first_request = true")
    stack = StackSpec(tuple(roles), scratch, agree, first, str(manifest.resolve()) if manifest else "")
    known = {
        "model",
        "port",
        "host",
        *(f"port.{p}" for r in roles for p in r.ports),
        *(f"scratch.{s}" for s in scratch),
    }
    known |= {f"{r.name}.host" for r in roles}
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
                    "use {port}, {port.NAME} (ports = [...]), {ROLE.port}, {ROLE.port.NAME}, {host}, {ROLE.host}, "
                    "{scratch.NAME} (target.scratch) or {model}",
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
    for key in ("entry", "runs_model", "prompt_logprobs"):
        if key in raw and not isinstance(raw[key], bool):
            raise ManifestError(f"{where}.{key} must be true or false", f"write {key} = true")
    node = raw.get("node")
    if node is not None and (not isinstance(node, str) or not node.strip() or node.count("=") > 1):
        raise ManifestError(
            f"{where}.node must be a Ray node label (value, or key=value)", 'write node = "prefill-node" or drop it'
        )
    resources = _resources(raw.get("resources", {}), f"{where}.resources")
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
        bool(raw.get("prompt_logprobs", False)),
        None if node is None else node.strip(),
        resources,
    )


def _resources(raw: Any, where: str) -> tuple[tuple[str, float], ...]:
    if not isinstance(raw, dict):
        raise ManifestError(f"{where} must be a table of amounts", "write resources = { CPU = 2, GPU = 1 }")
    out = []
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ManifestError(f"{where}.{key} = {value!r} is not a non-negative number", f"write {key} = 1")
        out.append((str(key), float(value)))
    return tuple(out)


def _check_acyclic(roles: Sequence[RoleSpec]) -> None:
    cycle = first_cycle({r.name: r.after for r in roles})
    if cycle is not None:
        raise ManifestError(f"target.roles: the after lists form a cycle: {' -> '.join(cycle)}", "break the cycle")


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


def flag_key(arg: str) -> str | None:
    """A launch flag's name spelled one way (``--a_b``, ``--a-b`` and ``--a-b=v`` are all ``--a-b``), or None."""
    if not arg.startswith("--") or len(arg) < 3:
        return None
    return "--" + arg[2:].split("=", 1)[0].replace("_", "-")


def agree_conflict(
    stack: StackSpec, patch: str, roles: Sequence[str], env: Mapping[str, str], args: Sequence[str]
) -> str | None:
    """Why switching ``patch`` on alone makes the model roles disagree on a setting they must share, or None."""
    model = set(stack.model_roles)
    on = set(roles) & model
    if not on or on == model:
        return None
    for key in stack.agree:
        touched = key in env if not key.startswith("-") else any(flag_key(a) == flag_key(key) for a in args)
        if touched:
            rest = ", ".join(sorted(model - on))
            return (
                f"patch {patch!r} sets {key} on {', '.join(sorted(on))} only, but target.agree says every model role "
                f"must share it (not set on: {rest}): a one-sided configuration is a conflict, not a trial"
            )
    return None


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
    "RoleSpec",
    "StackSpec",
    "agree_conflict",
    "flag_key",
    "parse_stack",
    "patch_roles",
    "role_switches",
]
