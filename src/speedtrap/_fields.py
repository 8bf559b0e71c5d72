"""Small checkers for manifest fields; each error names the field and says how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError


def table(data: Mapping[str, Any], key: str, required: bool = False) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        if required:
            raise ManifestError(f"manifest has no [{key}] table", f"add a [{key}] table")
        return {}
    if not isinstance(value, dict):
        raise ManifestError(f"{key} must be a table", f"write [{key}]")
    return value


def nearest(word: str, known: Iterable[str]) -> str | None:
    """The known name closest to a misspelt ``word`` (difflib's ratio at least 0.6), or None."""
    close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.6)
    return close[0] if close else None


def no_unknown(table: Mapping[str, Any], known: Iterable[str], prefix: str, where: str) -> None:
    """Every key of ``table`` is known; an unknown one is an error that names it and the nearest known key."""
    names = set(known)
    for key in table:
        if key not in names:
            guess = nearest(str(key), names)
            hint = f" (did you mean {prefix}{guess}?)" if guess else ""
            raise ManifestError(
                f"{prefix}{key} is not a known field of {where}{hint}", f"use: {', '.join(sorted(names))}"
            )


def str_table(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ManifestError(f'{where} must be a table of NAME = "value"', 'write e.g. { VAR = "1" }')
    out = []
    for k, v in value.items():
        if isinstance(v, bool):
            out.append((k, str(v).lower()))
        elif isinstance(v, (str, int, float)):
            out.append((k, str(v)))
        else:
            raise ManifestError(f"{where}.{k} must be a string", "quote the value")
    return tuple(out)


def str_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise ManifestError(f"{where} must be a list of strings", f'write {where.rsplit(".", 1)[-1]} = ["..."]')
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ManifestError(f"{where}[{i}] must be a string, not {type(item).__name__}", "quote it")
    return list(value)


def number(value: Any, where: str, allow_zero: bool = False, allow_negative: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ManifestError(f"{where} must be a number, not {value!r}", f"write {where.rsplit('.', 1)[-1]} = 1.0")
    if value < 0 and not allow_negative:
        raise ManifestError(f"{where} must not be negative ({value})", "give a positive number")
    if value == 0 and not allow_zero:
        raise ManifestError(f"{where} must be above zero", "give a positive number")
    return float(value)


def integer(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ManifestError(f"{where} must be an integer >= {minimum}, not {value!r}", f"write {where} = {minimum}")
    return value


def resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def first_cycle(follows: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle of ``follows`` (name -> the names it follows), as ``[a, b, ..., a]``, or None (depth first, in order)."""
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> list[str] | None:
        if state.get(name) == 2:
            return None
        if state.get(name) == 1:
            return [*trail[trail.index(name) :], name]
        state[name] = 1
        for other in follows.get(name, ()):
            found = visit(other, [*trail, name])
            if found is not None:
                return found
        state[name] = 2
        return None

    for name in follows:
        found = visit(name, [])
        if found is not None:
            return found
    return None
