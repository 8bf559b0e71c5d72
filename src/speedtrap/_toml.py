"""Reading a speedtrap.toml: the one place a manifest file becomes a dict."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError

_TODO = re.compile(r"^\s*#\s*TODO\b[\s:]*([A-Za-z0-9_.\[\]-]*)[\s:]*(.*)$")


def todo_lines(text: str) -> list[tuple[int, str, str]]:
    """The ``# TODO KEY: what`` lines of a manifest (``speedtrap init`` writes one for what it cannot infer):
    (line number, key, what)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        m = _TODO.match(line)
        if m:
            out.append((n, m.group(1) or "?", m.group(2).strip()))
    return out


def read_manifest_toml(path: Path) -> dict[str, Any]:
    """The parsed TOML of a manifest; a missing, unreadable or malformed file, or one with a ``# TODO`` line
    left to fill in, is a ManifestError."""
    try:
        text = path.read_text(encoding="utf-8")
        todos = todo_lines(text)
        if todos:
            n, key, what = todos[0]
            raise ManifestError(
                f"manifest {str(path)!r} line {n}: TODO {key} is not filled in" + (f" ({what})" if what else ""),
                f"fill in {key} and delete the TODO line",
            )
        return tomllib.loads(text)
    except FileNotFoundError:
        raise ManifestError(f"manifest {str(path)!r} does not exist", "pass the path of a speedtrap.toml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"cannot read manifest {str(path)!r}: {exc}", "check the path and permissions") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"manifest {str(path)!r} is not valid TOML: {exc}", "fix the TOML syntax") from None
