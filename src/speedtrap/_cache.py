"""Where speedtrap keeps converted weights and other derived files."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """The cache directory: ``$SPEEDTRAP_CACHE_DIR`` if set, else the user's cache dir."""
    override = os.environ.get("SPEEDTRAP_CACHE_DIR")
    root = Path(override) if override else Path(platformdirs.user_cache_dir("speedtrap"))
    root.mkdir(parents=True, exist_ok=True)
    return root
