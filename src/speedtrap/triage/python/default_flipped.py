"""A default flipped: the fallback of a config or option read changed, the key unchanged::

    getattr(config, "indexer_rope_interleave", False)   ->   getattr(config, "indexer_rope_interleave", True)
    kwargs.get("use_fp32", True)                          ->   kwargs.get("use_fp32", False)

Every config without the key (most released checkpoints, for a key added later) now takes the other value: a
selection changed for them, not a switch a user sets. Read on calls that stay (same function, same callee, same
object and key), so a key renamed or a read moved is not counted here; literal to literal only (a computed
default forced to a constant is ``selection_collapsed``'s).
"""

from __future__ import annotations

import ast
from typing import Any

from speedtrap.triage.evidence import GUARD, Signal, line_evidence, spans
from speedtrap.triage.python.argument_dropped import calls_that_stay
from speedtrap.triage.source import ChangedFile, Module, short


def _read(call: ast.Call) -> tuple[str, str, ast.expr] | None:
    """``(object, key, default)`` of ``getattr(obj, "key", default)`` or ``obj.get("key", default)``."""
    if isinstance(call.func, ast.Name) and call.func.id == "getattr" and len(call.args) == 3:
        obj, key, default = call.args
    elif isinstance(call.func, ast.Attribute) and call.func.attr == "get" and len(call.args) == 2:
        obj, (key, default) = call.func.value, call.args
    else:
        return None
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return None
    return short(obj, 60), key.value, default


def defaults_flipped(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """A read of a config key whose fallback value changed, the object and the key the same."""
    out: list[Signal] = []
    for key, o, n in calls_that_stay(cf, old, new):
        before, after = _read(o), _read(n)
        if before is None or after is None or before[:2] != after[:2]:
            continue
        if ast.dump(before[2]) == ast.dump(after[2]) or not spans(before[2], cf.removed):
            continue
        if not (isinstance(before[2], ast.Constant) and isinstance(after[2], ast.Constant)):
            continue  # a computed default replaced: the condition-forced rule reads that (selection_collapsed)
        obj, name = before[:2]
        where = key[0].replace("<module>", "module level")
        data: dict[str, Any] = {
            "kind": "default flipped",
            "flipped": True,
            "key": name,
            "before": short(before[2], 40),
            "after": short(after[2], 40),
        }
        out.append(
            Signal(
                GUARD,
                f"changes the fallback of `{name}` read from `{obj}` from `{short(before[2], 40)}` to "
                f"`{short(after[2], 40)}` in {where}: every config without the key now takes the other value",
                (line_evidence(cf, o.lineno, "-"), line_evidence(cf, n.lineno, "+")),
                data=data,
            )
        )
    return out
