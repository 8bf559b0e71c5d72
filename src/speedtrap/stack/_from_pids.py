"""``speedtrap init --pid``: a manifest written from running processes, that ``speedtrap run`` runs unedited.

Each pid is read once (:mod:`speedtrap.stack._procs`); its launch becomes a role's (or the target's) launch with
``{port}`` / ``{model}`` placeholders (:mod:`speedtrap.stack._rewrite`), the engine's speed switches and gate
variables it runs with become switch patches (off in the base: the engine's default), and the commits of a range
of the git checkout the engine imports become commit patches (split per model role on a stack). What cannot be
inferred is written as a ``# TODO key: what`` line, and every manifest reader refuses a manifest with one.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import UsageError
from speedtrap._redact import is_secret
from speedtrap.stack._procs import ROUTER, Process, Source, find_source, flag_value, read_engine_process
from speedtrap.stack._rewrite import (
    Switch,
    drop_secrets,
    is_number,
    is_switch_env,
    port_flags,
    rewrite,
    rewrite_argv,
    split_switches,
)
from speedtrap.stack._ssh import ssh_hostname

_MODEL_FLAGS = {"sglang": ("--model-path", "--model"), "vllm": ("--model",), "llama.cpp": ("--model", "-m")}
_AGREE = {
    "sglang": ["--disaggregation-transfer-backend", "--page-size", "--dtype", "--kv-cache-dtype"],
    "vllm": ["--block-size", "--kv-cache-dtype", "--dtype"],
}
_API = {"sglang": "sglang", "vllm": "vllm", "llama.cpp": "openai", "speedtrap": "vllm"}
# The process's environment that says nothing about the launch (a shell's, a terminal's, a login's).
_NOISE = frozenset(
    {"PWD", "OLDPWD", "SHLVL", "_", "TERM", "COLUMNS", "LINES", "PS1", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY",
     "MAIL", "LOGNAME", "USER", "HOME", "SHELL", "HOSTNAME", "LS_COLORS", "TMUX", "TMUX_PANE", "DISPLAY",
     "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"}
)  # fmt: skip
_ORDER = {"prefill": 0, "decode": 1, "server": 2, ROUTER: 9}


@dataclass
class _Role:
    name: str
    proc: Process
    argv: list[str]
    switches: list[Switch] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    port: int | None = None
    extra: list[tuple[str, int]] = field(default_factory=list)
    model: str | None = None  # the model argument as the process got it
    note: str = ""


@dataclass(frozen=True)
class FromPids:
    """The manifest's text and what was read, for ``--json``."""

    text: str
    roles: tuple[dict[str, Any], ...]
    source: dict[str, Any] | None
    patches: tuple[str, ...]
    todos: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "roles": list(self.roles),
            "source": self.source,
            "patches": list(self.patches),
            "todos": list(self.todos),
            "manifest": self.text,
        }


def _q(value: str) -> str:
    return json.dumps(value)


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return _q(str(value))


def _name_roles(procs: Sequence[Process]) -> list[tuple[str, Process]]:
    """Role names from the engines' flags; a vLLM ``kv_both`` server is named by the router's URL that names
    its port (``--prefill URL``, ``--decode URL``)."""
    routers = [p for p in procs if p.engine.kind == ROUTER]
    servers = [p for p in procs if p.engine.kind != ROUTER]
    if not servers:
        raise UsageError(
            f"pid {routers[0].pid} is a router, and no model server was given",
            "pass the prefill's and the decode's pids too (--pid P --pid D --pid ROUTER)",
        )
    if len(procs) > 1 and not routers:
        raise UsageError(
            f"pids {', '.join(str(p.pid) for p in procs)} are {len(procs)} servers and none is a router",
            "pass the router's pid too (the process the requests go to), or one server's pid alone",
        )
    if len(routers) > 1:
        raise UsageError(
            f"pids {', '.join(str(p.pid) for p in routers)} are all routers", "pass the one the requests go to"
        )
    by_port: dict[int, str] = {}
    for r in routers:
        for key in ("prefill", "decode"):
            url = flag_value(r.argv[r.engine.program :], f"--{key}")
            port = rewrite_port(url)
            if port is not None:
                by_port[port] = key
    named: list[tuple[str, Process]] = []
    for p in servers:
        role = p.engine.role
        if role in ("kv_both", "server") and len(servers) > 1:
            own = flag_value(p.argv[p.engine.program :], "--port")
            role = by_port.get(int(own), "server") if own and is_number(own) else "server"
        named.append((role, p))
    named += [(ROUTER, r) for r in routers]
    named.sort(key=lambda x: _ORDER.get(x[0], 5))
    seen: dict[str, int] = {}
    out = []
    for role, p in named:
        seen[role] = seen.get(role, 0) + 1
        out.append((role if seen[role] == 1 else f"{role}-{seen[role]}", p))
    return out


def rewrite_port(url: str | None) -> int | None:
    """The port of ``http://host:PORT/...``, or None."""
    if not url or "://" not in url:
        return None
    hostport = url.split("://", 1)[1].split("/", 1)[0]
    tail = hostport.rsplit(":", 1)[-1] if ":" in hostport else ""
    return int(tail) if is_number(tail) else None


def _model_arg(proc: Process) -> str | None:
    rest = proc.argv[proc.engine.program :]
    flags = _MODEL_FLAGS.get(proc.engine.engine)
    if flags is None:
        return None
    found = flag_value(rest, *flags)
    if found is None and proc.engine.engine == "vllm" and rest[:1] == ("serve",) and len(rest) > 1:
        found = rest[1] if not rest[1].startswith("-") else None
    return found


def _defaults(role: _Role) -> None:
    """Ports an engine opens by default at a fixed number (the next stack would find them in use): named."""
    e = role.proc.engine
    if (
        e.engine == "sglang"
        and e.role == "prefill"
        and flag_value(role.argv, "--disaggregation-bootstrap-port") is None
    ):
        role.argv += ["--disaggregation-bootstrap-port", "8998"]  # SGLang's default
    if e.engine == "sglang" and e.kind == ROUTER and flag_value(role.argv, "--prometheus-port") is None:
        role.argv += ["--prometheus-port", "29000"]  # sglang_router's default, on every interface


def _launch_env(proc: Process, here: Mapping[str, str], drop_path: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """What the launch set: the process's variables that speedtrap's own environment lacks or has otherwise
    (the launcher passes speedtrap's own on), without a shell's noise, secrets, or the checkout on PYTHONPATH."""
    env: dict[str, str] = {}
    secrets: list[str] = []
    for k, v in proc.env.items():
        if k in _NOISE or here.get(k) == v:
            continue
        if k == "PYTHONPATH":
            parts = [x for x in v.split(os.pathsep) if x and not any(_inside(x, proc.cwd, d) for d in drop_path)]
            if os.pathsep.join(parts) == here.get("PYTHONPATH", ""):
                continue
            v = os.pathsep.join(parts)
            if not v:
                continue
        if is_secret(k, v):
            secrets.append(k)
            continue
        env[k] = v
    return env, secrets


def _inside(entry: str, cwd: str, folder: str) -> bool:
    path = os.path.realpath(os.path.join(cwd, entry))
    top = os.path.realpath(folder)
    return path == top or path.startswith(top + os.sep)


def _absolute_program(argv: list[str], proc: Process) -> None:
    first = argv[0]
    if "/" in first and not first.startswith("/"):
        argv[0] = os.path.normpath(os.path.join(proc.cwd, first))


def _health(role: _Role) -> str:
    e = role.proc.engine
    host = flag_value(role.argv, "--host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "[::]", "") or role.proc.host is not None:
        host = "127.0.0.1" if role.proc.host is None else ssh_hostname(role.proc.host)
    path = "/readiness" if e.engine == "sglang" and e.kind == ROUTER else "/health"
    return f"http://{host}:{{port}}{path}"


def _source(roles: Sequence[_Role]) -> Source | None:
    found: list[Source] = []
    for r in roles:
        if r.proc.engine.kind == ROUTER:
            continue
        s = find_source(r.proc, r.proc.engine.engine)
        if s is not None:
            found.append(s)
    trees = {s.repo for s in found if s.repo}
    if len(trees) > 1:
        raise UsageError(
            f"the model roles import their engine from different git checkouts ({', '.join(sorted(trees))})",
            "start every model role from one checkout, or run init on one role's pid",
        )
    return next((s for s in found if s.repo), found[0] if found else None)


def _check_ref(repo: str, ref: str, flag: str) -> str:
    from speedtrap.stack._procs import _git

    if not ref or ref.startswith("-") or any(c.isspace() for c in ref):
        raise UsageError(f"{flag} {ref!r} is not a revision", "pass a tag, branch or sha, e.g. --since v0.5.0")
    sha = _git(Path(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if sha is None:
        raise UsageError(
            f"{flag}: {ref!r} is not a commit of {repo} (the checkout the engine imports)",
            f"pass a ref of that repository (`git -C {repo} log --oneline`)",
        )
    return sha


def _commit_rows(source: Source | None, since: str | None, rng: str | None) -> tuple[list[dict[str, Any]], str, str]:
    if since is None and rng is None:
        return [], "", ""
    flag = "--since" if since is not None else "--range"
    if source is None or source.repo is None:
        where = f"{source.package} {source.version or '?'} installed at {source.path}" if source else "its engine"
        raise UsageError(
            f"{flag}: the engine runs {where}, not a git checkout: there are no commits to switch",
            "drop --since/--range, or start the engine from a git checkout of its source"
            + (f" (`pip download --no-deps {source.package}=={source.version}` gives it)" if source else ""),
        )
    if since is not None:
        a, b = _check_ref(source.repo, since, "--since"), source.head or "HEAD"
    else:
        assert rng is not None
        if "..." in rng or ".." not in rng:
            raise UsageError(f"--range {rng!r} is not of the form A..B", "write e.g. --range v0.5.0..HEAD")
        left, right = rng.split("..", 1)
        a, b = _check_ref(source.repo, left, "--range"), _check_ref(source.repo, right, "--range")
    from speedtrap.triage import init_manifest

    result = init_manifest(Path(source.repo), f"{a}..{b}")
    return list(result.patches), result.base, f"{a[:12]}..{b[:12]}"


def init_from_pids(
    pids: Sequence[int],
    ssh: str | None = None,
    since: str | None = None,
    rng: str | None = None,
    here: Mapping[str, str] | None = None,
) -> FromPids:
    """Read every pid, then write the manifest text (nothing is written to disk here)."""
    if not pids:
        raise UsageError("no --pid given", "pass the pid of each process of the stack: --pid P [--pid P ...]")
    if since is not None and rng is not None:
        raise UsageError("both --since and --range given", "pass one: --since BASE or --range BASE..HEAD")
    here = dict(os.environ if here is None else here)
    procs = [read_engine_process(p, ssh) for p in dict.fromkeys(pids)]
    roles = [_Role(n, p, list(p.argv)) for n, p in _name_roles(procs)]
    stack = len(roles) > 1
    source = _source(roles)
    rows, base, shown_range = _commit_rows(source, since, rng)
    drop = [source.repo] if source is not None and source.repo and rows else []
    todos: list[tuple[str, str]] = []
    for r in roles:
        if r.proc.renamed:
            _rebuild_router(r, roles)
            continue
        _defaults(r)
        e = r.proc.engine
        r.model = _model_arg(r.proc)
        r.argv, r.switches = split_switches(e.engine, r.argv, e.program)
        env, r.secrets = _launch_env(r.proc, here, drop)
        r.argv, hidden = drop_secrets(r.argv)
        r.secrets += hidden
        for k in [k for k, v in env.items() if is_switch_env(k, v)]:
            r.switches.append(Switch(env=((k, env.pop(k)),)))
        r.env = env
        _absolute_program(r.argv, r.proc)
        named = port_flags(r.argv[e.program :])
        r.port = next((n for k, n in named if k == "port"), None)
        r.extra = [(k, n) for k, n in named if k != "port"]
        if r.port is None:
            raise UsageError(
                f"pid {r.proc.pid} ({r.name}) has no --port in its command line: its port cannot be made {{port}}",
                "start it with an explicit --port, then run init again",
            )
    ports = _port_names(roles)
    models = {_resolve(r.model, r.proc.cwd) for r in roles if r.model}
    model = next(iter(models)) if len(models) == 1 else None
    if len(models) > 1:
        todos.append(("target.model", f"the roles serve different models ({', '.join(sorted(models))}): pick one"))
    text = _render(roles, ports, model, source, rows, base, shown_range, stack, ssh, todos)
    return FromPids(
        text,
        tuple(
            {"role": r.name, "pid": r.proc.pid, "engine": r.proc.engine.engine, "port": r.port, "host": ssh or "local"}
            for r in roles
        ),
        None if source is None else {"package": source.package, "path": source.path, "version": source.version,
                                     "repo": source.repo, "head": source.head},
        tuple(_patch_names(roles, rows, stack)),
        tuple(f"{k}: {w}" for k, w in todos),
    )  # fmt: skip


def _rebuild_router(r: _Role, roles: Sequence[_Role]) -> None:
    """``sglang::router``: sglang_router renamed itself, and /proc lost its argv and environment. Its launch is
    sglang_router's PD launch rebuilt from the model roles (read before it: the router comes last), its environment
    what they share; its port is one it listens on (any: the manifest names it ``{port}``)."""
    servers = [x for x in roles if x.proc.engine.kind != ROUTER]
    first = servers[0]
    python = first.argv[0] if first.argv[0].startswith("/") else os.path.join(first.proc.cwd, first.argv[0])
    argv = [python, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for x in servers:
        url = f"http://127.0.0.1:{x.port}"
        if x.name.startswith("prefill"):
            argv += ["--prefill", url, flag_value(x.argv, "--disaggregation-bootstrap-port") or "8998"]
        elif x.name.startswith("decode"):
            argv += ["--decode", url]
        else:
            argv += ["--worker-urls", url]
    r.argv = [*argv, "--host", "127.0.0.1", "--port", "{port}", "--prometheus-host", "127.0.0.1"]
    r.argv += ["--prometheus-port", "{port.prometheus}"]
    r.port = r.proc.listening[0] if r.proc.listening else -1  # never a number of another role
    r.extra = [("prometheus", -2)]
    r.env = {k: v for k, v in first.env.items() if all(x.env.get(k) == v for x in servers)}
    r.note = (
        "renamed itself sglang::router, and /proc keeps neither its command line nor its environment: its launch is "
        "sglang_router's PD launch rebuilt from the roles it routes to, its environment theirs (add flags of yours)"
    )


def _resolve(model: str, cwd: str) -> str:
    path = Path(cwd, model)
    return str(path.resolve()) if path.exists() else model


def _port_names(roles: Sequence[_Role]) -> dict[str, dict[int, str]]:
    """Per role, port number -> placeholder: its own as ``port``/``port.NAME``, another role's as
    ``ROLE.port``/``ROLE.port.NAME``; a number two roles name belongs to the first (the prefill's bootstrap)."""
    owner: dict[int, tuple[str, str]] = {}
    for r in roles:
        assert r.port is not None
        owner.setdefault(r.port, (r.name, "port"))
        kept = []
        for name, n in r.extra:
            if n not in owner:
                owner[n] = (r.name, f"port.{name}")
                kept.append((name, n))
        r.extra = kept
    out: dict[str, dict[int, str]] = {}
    for r in roles:
        out[r.name] = {n: (what if role == r.name else f"{role}.{what}") for n, (role, what) in owner.items()}
    return out


def _patch_names(roles: Sequence[_Role], rows: Sequence[dict[str, Any]], stack: bool) -> list[str]:
    model_roles = [r.name for r in roles if r.proc.engine.kind != ROUTER]
    out = []
    for row in rows:
        out += [f"{row['name']}@{m}" for m in model_roles] if stack and len(model_roles) > 1 else [row["name"]]
    out += [name for name, _, _ in _grouped_switches(roles)]
    return out


def _grouped_switches(roles: Sequence[_Role]) -> list[tuple[str, Switch, list[str]]]:
    """Each switch once, with the roles it was found on (names made unique)."""
    groups: dict[Switch, list[str]] = {}
    for r in roles:
        for s in r.switches:
            groups.setdefault(s, []).append(r.name)
    out: list[tuple[str, Switch, list[str]]] = []
    used: set[str] = set()
    for s, on in groups.items():
        name, n = s.name, 2
        while name in used:
            name, n = f"{s.name}_{n}", n + 1
        used.add(name)
        out.append((name, s, on))
    return out


def _launch(r: _Role, ports: Mapping[int, str], model: str | None, ssh: str | None) -> list[str]:
    model_arg = r.model
    argv = rewrite_argv(r.argv, ports, model_arg)
    if model is not None and model_arg is not None:
        argv = ["{model}" if a == model else a for a in argv]
    if r.proc.cpus is not None:
        argv = ["taskset", "-c", r.proc.cpus, *argv]
    if ssh is not None:  # the role runs on the host it was read on: its env travels in the command; -tt: the
        # remote server gets SIGHUP when the launcher stops the ssh client
        env = [f"{k}={rewrite(v, ports, model_arg)}" for k, v in r.env.items()]
        remote = ["cd", r.proc.cwd, "&&", "env", *env, *argv]
        argv = ["ssh", "-tt", "-o", "BatchMode=yes", "--", ssh, " ".join(shlex.quote(a) for a in remote[3:])]
        argv[-1] = f"cd {shlex.quote(r.proc.cwd)} && exec " + argv[-1]
    return argv


def _render(
    roles: Sequence[_Role],
    ports: Mapping[str, Mapping[int, str]],
    model: str | None,
    source: Source | None,
    rows: Sequence[dict[str, Any]],
    base: str,
    shown_range: str,
    stack: bool,
    ssh: str | None,
    todos: list[tuple[str, str]],
) -> str:
    pids = " ".join(f"--pid {r.proc.pid}" for r in roles)
    lines = [
        f"# Written by `speedtrap init {pids}{' --ssh ' + ssh if ssh else ''}` from the running processes:",
        "# the launch lines as they ran (ports and the model as placeholders), the engine's speed switches they",
        "# ran with as patches (off in the base: the engine's default)"
        + (", and the commits of the range as patches." if rows else "."),
    ]
    for r in roles:
        lines.append(f"# {r.name}: pid {r.proc.pid}, {r.proc.engine.engine} {r.proc.engine.kind}, cwd {r.proc.cwd}")
        if r.note:
            lines.append(f"#   it {r.note}")
    if source is not None:
        if source.repo:
            got = f"; commits {shown_range}" if rows else "; no range given: no commit patches"
            lines.append(
                f"# {source.package} imported from the git checkout {source.repo}"
                f" (HEAD {(source.head or '?')[:12]}){got}"
            )
        else:
            lines.append(
                f"# {source.package} {source.version or '(version unknown)'} is an installed release ({source.path}); "
                f"its source: `pip download --no-deps {source.package}=={source.version}`"
            )
    secrets = sorted({k for r in roles for k in r.secrets})
    if secrets:
        lines.append(
            f"# not copied (secrets): {', '.join(secrets)}; a launch runs without those flags, and speedtrap "
            "passes its own environment on"
        )
    lines.append("")
    entry = roles[-1] if stack else roles[0]
    e0 = roles[0].proc.engine.engine
    target: dict[str, Any] = {}
    if model is not None:
        target["model"] = model
    served = _served(roles[0], model)
    if served is not None:
        target["served_model"] = served
    if source is not None and source.repo and rows:
        target |= {"repo": source.repo, "base": base, "pythonpath": [source.folder]}
    # A role run from inside the checkout runs its worktree there instead (``python -m`` puts the working folder
    # first on sys.path: the checkout's HEAD would shadow every configuration).
    in_tree = source is not None and source.repo and rows and any(_inside(r.proc.cwd, "/", source.repo) for r in roles)
    if not in_tree:
        target["cwd"] = roles[0].proc.cwd
    target |= {"start_timeout": 900 if e0 in ("sglang", "vllm") else 300, "stop_timeout": 30, "retries": 0}
    model_roles = [r for r in roles if r.proc.engine.kind != ROUTER]
    if stack:
        common = {k: v for k, v in roles[0].env.items() if all(r.env.get(k) == v for r in roles)}
        for r in roles:
            r.env = {k: v for k, v in r.env.items() if k not in common}
        if common and ssh is None:
            target["env"] = common
        if e0 in _AGREE and len(model_roles) > 1:
            target["agree"] = _AGREE[e0]
        if e0 == "sglang":
            target["request_timeout"] = 300
    else:
        if roles[0].env and ssh is None:
            target["env"] = roles[0].env
        target["launch"] = _launch(roles[0], ports[roles[0].name], model, ssh)
        target["health"] = _health(roles[0])
    lines.append("[target]")
    lines += [f"{k} = {_toml(v)}" for k, v in target.items()]
    lines.append("")
    if stack:
        for r in roles:
            table: dict[str, Any] = {"launch": _launch(r, ports[r.name], model, ssh), "health": _health(r)}
            if r.extra:
                table["ports"] = [k for k, _ in r.extra]
            if r.env and ssh is None:
                table["env"] = {k: rewrite(v, ports[r.name], r.model) for k, v in r.env.items()}
            if r is entry:
                table |= {"after": [m.name for m in model_roles], "entry": True, "runs_model": False}
            if r.name == "prefill" and r.proc.engine.engine == "sglang":
                table["prompt_logprobs"] = True  # the router drops the prompt's top logprobs (docs/sglang.md)
            lines.append(f"[target.roles.{r.name}]")
            lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
            lines.append("")
    split = stack and len(model_roles) > 1
    for row in rows:
        tier = f"tier {row['tier']}" if row["tier"] is not None else "not ranked"
        lines.append(f"# commit {row['commit'][:12]}: triage {tier}; gate read off the diff: {row['gate'] or 'none'}")
        lines += ["[[patches]]", f"name = {_q(row['name'])}", f"commit = {_q(row['commit'])}"]
        lines.append(f"summary = {_q(row['subject'])}")
        if split:
            lines.append("split = true                          # one switch per model role: name@role")
        lines.append("")
    all_model = {m.name for m in model_roles}
    for name, s, on in _grouped_switches(roles):
        lines.append(f"# found on {', '.join(on)}: {' '.join(s.args) or ', '.join(f'{k}={v}' for k, v in s.env)}")
        lines += ["[[patches]]", f"name = {_q(name)}"]
        if s.args:
            lines.append(f"args = {_toml(list(s.args))}")
        if s.env:
            lines.append(f"env = {_toml(dict(s.env))}")
        if stack and set(on) != all_model:
            lines.append(f"roles = {_toml(on)}")
        lines.append("")
    if not rows and not _grouped_switches(roles):
        todos.append(("patches", "no commit range, flag or gate found to switch: add [[patches]] (or pass --since)"))
    tier1 = [r["name"] for r in rows if r["tier"] == 1]
    lines += [
        "[probe]",
        'kind = "divergence"',
        'preset = "quick"',
        f"api = {_q(_api(roles))}",
        "",
        "[verdict]                             # speedtrap's defaults: a patch fails above this divergence",
        'metric = "worst.kl_p99"',
        "bound = 0.05",
        "repeats = 0",
        "",
        "[search]",
        f"prior = {_toml(tier1)}              # triage's tier 1",
        "",
    ]
    head = [f"# TODO {key}: {what}" for key, what in todos]
    return "\n".join([*head, *lines])


def _api(roles: Sequence[_Role]) -> str:
    server = next(r for r in roles if r.proc.engine.kind != ROUTER)
    if server.proc.engine.engine == "speedtrap":
        return "sglang" if flag_value(server.proc.argv, "--dialect") == "sglang" else "vllm"
    return _API.get(server.proc.engine.engine, "openai")


def _served(role: _Role, model: str | None) -> str | None:
    e = role.proc.engine.engine
    rest = role.proc.argv[role.proc.engine.program :]
    name = flag_value(rest, "--served-model-name", "--alias", "-a") if e != "speedtrap" else flag_value(rest, "--name")
    if name is not None:
        return name
    if e in ("sglang", "vllm"):
        return model  # both answer to the model path they were given
    return None


__all__ = ["FromPids", "init_from_pids", "rewrite_port"]
