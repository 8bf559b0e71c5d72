"""A slice moved: ``x = x[..., :n]`` removed in one function and ``y = y[..., :n]`` (the same subscript)
added in another. Between the two places the values are now views of part of a tensor, not the whole,
contiguous one: every call in between (a kernel that merges, reduces or writes in place) receives the
view instead, or the reverse. A view signal, naming both places.

Catches::

    out = out[..., :v_head_dim]   (moved from after merge_attn_states to before it)

"""

from __future__ import annotations

import ast

from speedtrap.triage.evidence import Evidence, Signal
from speedtrap.triage.source import ChangedFile, Module

VIEW = "view_moved"


def _reslices(mod: Module, lines: frozenset[int]) -> list[tuple[ast.Assign, str, str]]:
    """``x = x[S]`` statements on ``lines``: (statement, the subscript's dump, the function holding it)."""
    out: list[tuple[ast.Assign, str, str]] = []
    for stmt in mod.statements_touching(lines):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Subscript)):
            continue
        target, value = stmt.targets[0], stmt.value
        sliced = any(isinstance(n, ast.Slice) for n in ast.walk(value.slice))
        if (
            sliced
            and isinstance(target, ast.Name)
            and isinstance(value.value, ast.Name)
            and target.id == value.value.id
        ):
            out.append((stmt, ast.dump(value.slice), mod.qualname(stmt)))
    return out


def moved_slices(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """Each slice removed from one function and added, the same, in another."""
    out: list[Signal] = []
    added = _reslices(new, cf.added)
    for gone, key, was_in in _reslices(old, cf.removed):
        for put, key2, now_in in added:
            if key2 != key or now_in == was_in:
                continue
            sub = gone.value.slice if isinstance(gone.value, ast.Subscript) else gone.value
            parts = sub.elts if isinstance(sub, ast.Tuple) else [sub]
            slice_text = f"[{', '.join(ast.unparse(p) for p in parts)}]"
            out.append(
                Signal(
                    VIEW,
                    f"moves the slice `{slice_text}` from {was_in} ({cf.path}:{gone.lineno}) to {now_in} "
                    f"({cf.path}:{put.lineno}): the calls between the two places now receive a view of part of "
                    "the tensor (strided, not contiguous) where they received the whole one, or the reverse",
                    (
                        Evidence(cf.path, gone.lineno, "-", cf.removed_text(gone.lineno)),
                        Evidence(cf.path, put.lineno, "+", cf.added_text(put.lineno)),
                    ),
                    data={"from": was_in, "to": now_in},
                )
            )
            break
    return out
