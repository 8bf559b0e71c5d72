"""Uninitialised memory: ``torch.empty``/``empty_like``/``new_empty`` where the same function used
``zeros``/``zeros_like``/``full`` (or a ``zero_()``/``fill_()`` removed)::

    self.out_cache_loc = torch.zeros(...)   ->   self.out_cache_loc = torch.empty(...)
"""

from __future__ import annotations

import ast

from speedtrap.triage.evidence import Signal, line_evidence
from speedtrap.triage.source import ChangedFile, Module, callee

MEMORY = "memory"


ZEROED = {"zeros", "zeros_like", "new_zeros", "full", "full_like", "new_full", "ones", "ones_like", "zero_", "fill_"}


EMPTY = {"empty", "empty_like", "new_empty", "empty_strided"}


def _calls(mod: Module, lines: frozenset[int], names: set[str]) -> dict[str, list[ast.Call]]:
    """Calls of ``names`` on ``lines``, by the qualified name of the function holding them."""
    out: dict[str, list[ast.Call]] = {}
    for node in mod.nodes_on_lines(lines):
        if isinstance(node, ast.Call) and callee(node) in names:
            out.setdefault(mod.qualname(node), []).append(node)
    return out


def uninitialised(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    zeroed = _calls(old, cf.removed, ZEROED)
    empty = _calls(new, cf.added, EMPTY)
    out: list[Signal] = []
    for func, calls in sorted(empty.items()):
        before = zeroed.get(func, [])
        if not before:
            continue
        ev = [line_evidence(cf, c.lineno, "-") for c in before[:3]] + [
            line_evidence(cf, c.lineno, "+") for c in calls[:3]
        ]
        was = sorted({callee(c) or "" for c in before})
        now = sorted({callee(c) or "" for c in calls})
        out.append(
            Signal(
                MEMORY,
                f"allocates with {'/'.join(now)} where it used {'/'.join(was)} in "
                f"{func.replace('<module>', 'module')}: "
                "the buffer's memory is no longer initialised; a kernel that reads before it writes gets garbage",
                tuple(ev),
                data={"was": was, "now": now},
            )
        )
    return out
