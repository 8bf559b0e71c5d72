"""``speedtrap serve``: an OpenAI-compatible HTTP server for in-process targets."""

from __future__ import annotations

from speedtrap.serve._app import create_app
from speedtrap.serve._launch import load_for_serving, parse_overrides, serve

__all__ = ["create_app", "load_for_serving", "parse_overrides", "serve"]
