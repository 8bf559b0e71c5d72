"""Why a running stack failed a request: the role that exited or stalled, named with the line of its log that says why.

A request through the entry that fails (an HTTP 500, a timeout, a connection cut) says nothing about which
role broke: a router answers 500 or waits forever when a worker behind it died. :func:`diagnose` looks at
every role: one that exited (its exit code and the last error line of its log), else one that no longer
answers its health URL within a few seconds (stalled or broken, with its log's last error line), else it
says that every role is alive and healthy and which roles wrote to their log since the request began.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from speedtrap._errors import ServerError

if TYPE_CHECKING:
    from speedtrap.stack._running import Stack

HEALTH_S = 5.0  # how long a role gets to answer its health URL while a failure is diagnosed
_ERROR = re.compile(r"(Error|Exception|Traceback|FATAL|Fatal|fatal|died|dead|Killed)\b")
_TAIL_BYTES = 256 << 10


def log_sizes(logs: Mapping[str, Path]) -> dict[str, int]:
    out = {}
    for name, path in logs.items():
        try:
            out[name] = path.stat().st_size
        except OSError:
            out[name] = 0
    return out


def error_line(path: Path, since: int = 0) -> str:
    """The last line of ``path`` (after byte ``since``) that names an error, else its last line; "" if none."""
    try:
        with path.open("rb") as f:
            f.seek(max(since, f.seek(0, 2) - _TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
    lines = [ln for ln in lines if '"GET /' not in ln]  # health polls are not what went wrong
    for line in reversed(lines):
        if _ERROR.search(line) and not line.startswith(("File ", "^")):
            return line[:300]
    return lines[-1][:300] if lines else ""


def _said(line: str) -> str:
    return f": {line}" if line else ""


def exited(stack: Stack, since: Mapping[str, int] | None = None) -> ServerError | None:
    """A ServerError naming the first role that exited, its exit code and its log's error line; else None."""
    for name in stack.order:
        server = stack.servers[name]
        code = server.proc.poll()
        if code is None:
            continue
        how = f"signal {-code}" if code < 0 else f"code {code}"
        line = error_line(server.log_path, (since or {}).get(name, 0))
        on = f" on node {server.node}" if server.node else ""
        return ServerError(
            f"role {name!r} of the stack exited ({how}){on}{_said(line)}; read its log: {server.log_path}",
            "check that role's log; any role exiting ends the trial as an error, never a pass",
            log=server.log_path,
        )
    return None


def unhealthy(stack: Stack, since: Mapping[str, int] | None = None) -> ServerError | None:
    """A ServerError naming the first role that does not answer its health URL with 200 in ``HEALTH_S``."""
    with httpx.Client(timeout=HEALTH_S, trust_env=False) as client:
        for name in stack.order:
            url = stack.launches[name].spec.health_url
            try:
                status = client.get(url).status_code
                if status == 200:
                    continue
                what = f"answers {url} with HTTP {status}"
            except httpx.TimeoutException:
                what = f"stalled: {url} gave no answer within {HEALTH_S:g} s"
            except httpx.HTTPError as exc:
                what = f"does not answer {url} ({type(exc).__name__})"
            log = stack.logs[name]
            line = error_line(log, (since or {}).get(name, 0))
            return ServerError(
                f"role {name!r} of the stack is alive but {what}{_said(line)}; read its log: {log}",
                "check that role's log: a role whose engine died or hangs behind a healthy router fails every "
                "request through it",
                log=log,
            )
    return None


def diagnose(stack: Stack, problem: str, since: Mapping[str, int] | None = None) -> ServerError:
    """The error for a request through ``stack``'s entry that failed with ``problem``: the role that broke."""
    found = exited(stack, since) or unhealthy(stack, since)
    if found is not None:
        return ServerError(f"{found.problem} ({problem})", found.fix, log=found.log)
    now = log_sizes(stack.logs)
    entry = stack.spec.entry.name
    grew = [n for n in stack.order if since is not None and now[n] > since.get(n, 0) and n != entry]
    where = "; ".join(f"{n}{_said(error_line(stack.logs[n], (since or {}).get(n, 0)))}" for n in grew)
    logs = ", ".join(f"{n}: {stack.logs[n]}" for n in stack.order)
    return ServerError(
        f"{problem}; every role of the stack is alive and answers its health URL"
        + (f"; roles that wrote to their log meanwhile: {where}" if where else "")
        + f". Logs: {logs}",
        "read those logs; a role that waits for another (a prefill waiting for a decode that never connects) "
        "shows there",
        log=stack.logs[(grew or [entry])[0]],
    )


__all__ = ["diagnose", "error_line", "exited", "log_sizes", "unhealthy"]
