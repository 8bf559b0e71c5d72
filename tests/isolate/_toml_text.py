"""TOML text for the test manifests (tables and [[patches]]), shared by conftest and test modules by a unique
module name: several test folders have a conftest.py, so ``from conftest import`` would pick the wrong one."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def toml_text(tables: dict[str, dict[str, Any]], patches: Sequence[dict[str, Any]]) -> str:
    lines: list[str] = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items())
        lines.append("")
    for p in patches:
        lines.append("[[patches]]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in p.items())
        lines.append("")
    return "\n".join(lines)
