"""Atomic file writes: a killed process leaves the old file or the new one, never half of one."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from speedtrap._errors import StoreError


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "xb") as fh:  # the usual permissions (0666 less the umask)
                fh.write(payload)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise StoreError(
            f"cannot write {str(path)!r}: {exc.strerror or exc}", "pass a writable output folder"
        ) from None
    return path
