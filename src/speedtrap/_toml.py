"""Reading a speedtrap.toml: the one place a manifest file becomes a dict."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError


def read_manifest_toml(path: Path) -> dict[str, Any]:
    """The parsed TOML of a manifest; a missing, unreadable or malformed file is a ManifestError."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"manifest {str(path)!r} does not exist", "pass the path of a speedtrap.toml") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"cannot read manifest {str(path)!r}: {exc}", "check the path and permissions") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"manifest {str(path)!r} is not valid TOML: {exc}", "fix the TOML syntax") from None
