"""Launch records of live stacks: one file per launch, which ``inspect --manifest`` reads while the launcher lives."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._redact import redact_argv

if TYPE_CHECKING:
    from speedtrap.stack._running import Stack


def records_dir(manifest: str) -> Path:
    """Where the launch records of ``manifest``'s live stacks are kept (one file per launch)."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"speedtrap-{os.getuid()}" / "stacks"
    return base / hashlib.sha256(manifest.encode()).hexdigest()[:16]


def write_record(stack: Stack) -> None:
    if not stack.spec.manifest:
        return
    folder = records_dir(stack.spec.manifest)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "manifest": stack.spec.manifest,
        "launcher": os.getpid(),
        "roles": [
            {
                "role": name,
                "guard_pid": stack.servers[name].pid,
                "port": stack.launches[name].port,
                "ports": dict(stack.launches[name].ports),
                "log": str(stack.logs[name]),
                "host": stack.launches[name].role.host,
                "node": stack.servers[name].node or "this machine",  # a role placed on a Ray node: that node
                "ranks": stack.launches[name].role.ranks,
                "env": dict(stack.launches[name].recorded_env),
                "argv": redact_argv(stack.launches[name].spec.argv),
            }
            for name in stack.order
        ],
    }
    path = folder / f"{os.getpid()}-{stack.servers[stack.order[0]].pid}.json"
    path.write_text(json.dumps(doc, indent=1))
    stack.record = path


def read_records(manifest: str) -> list[dict[str, Any]]:
    """The launch records of ``manifest``'s stacks whose launcher is still running (stale ones removed)."""
    folder = records_dir(manifest)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or not _alive(int(doc.get("launcher", 0))):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        out.append(doc)
    return out


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["read_records", "records_dir", "write_record"]
