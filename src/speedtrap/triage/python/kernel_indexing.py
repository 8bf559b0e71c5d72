"""How a Triton kernel walks memory: a changed statement in a ``@triton.jit`` function that defines a
pointer, or a value its pointer arithmetic reads (``scale_step_k = BLOCK_SIZE_K // group_k`` feeding
``As_ptrs += scale_step_k * stride_As_k``). A wrong step or offset makes the kernel read or write
other addresses, silently: a kernel-indexing signal, with the statement and the pointer update it feeds.

Catches::

    step = tl.where(...)   ->   step = BLOCK_K // group_k   (feeding As_ptrs += step * stride)

"""

from __future__ import annotations

import ast
import re

from speedtrap.triage.evidence import Evidence, Signal
from speedtrap.triage.source import ChangedFile, Module, short

KERNEL = "kernel_indexing"

_JIT = re.compile(r"\btriton\.jit\b|^jit$")
_PTR = re.compile(r"ptr", re.I)
_MEMORY_OPS = {"load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "atomic_xchg"}


def _is_kernel(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(_JIT.search(ast.unparse(d.func if isinstance(d, ast.Call) else d)) for d in func.decorator_list)


def _target(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if len(targets) == 1 and isinstance(targets[0], ast.Name):
            return targets[0].id
    return None


def _names(node: ast.AST | None) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node is not None else set()


def _addresses(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.stmt]:
    """Every name the kernel's addresses are computed from, with one pointer update that reads it."""
    defs: dict[str, list[ast.stmt]] = {}
    for stmt in ast.walk(func):
        if isinstance(stmt, ast.stmt) and (name := _target(stmt)) is not None:
            defs.setdefault(name, []).append(stmt)
    roots: set[str] = {n for n in defs if _PTR.search(n)}
    for call in ast.walk(func):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in _MEMORY_OPS:
            roots |= {n for n in _names(call.args[0] if call.args else None) if n in defs}
    feeds: dict[str, ast.stmt] = {}  # name -> the pointer update (or address) that reads it
    todo: list[tuple[str, ast.stmt | None]] = [(r, None) for r in sorted(roots)]
    while todo:
        name, via = todo.pop(0)
        if name in feeds and via is not None:
            continue
        for stmt in defs.get(name, []):
            feeds.setdefault(name, via or stmt)
            reads = _names(getattr(stmt, "value", None)) & set(defs)
            todo.extend((n, via or stmt) for n in sorted(reads) if n not in feeds and n != name)
    return feeds


def _hits(mod: Module, lines: frozenset[int]) -> dict[str, list[tuple[ast.stmt, ast.stmt]]]:
    out: dict[str, list[tuple[ast.stmt, ast.stmt]]] = {}
    for func in mod.functions_touching(lines):
        if not _is_kernel(func):
            continue
        feeds = _addresses(func)
        for stmt in mod.statements_touching(lines):
            name = _target(stmt)
            if name in feeds and func.lineno <= stmt.lineno <= (func.end_lineno or func.lineno):
                out.setdefault(func.name, []).append((stmt, feeds[name]))
    return out


def kernel_indexing(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """A changed statement of a Triton kernel's address arithmetic, added or removed, with what it feeds."""
    out: list[Signal] = []
    added, removed = _hits(new, cf.added), _hits(old, cf.removed)
    for kernel in sorted(set(added) | set(removed)):
        pairs = [(s, via, "+") for s, via in added.get(kernel, [])] + [
            (s, via, "-") for s, via in removed.get(kernel, [])
        ]
        stmt, via, side = pairs[0]
        what = f"`{short(stmt, 70)}` feeds `{short(via, 70)}`" if stmt is not via else f"`{short(stmt, 70)}`"
        evidence = tuple(
            Evidence(cf.path, s.lineno, sd, cf.added_text(s.lineno) if sd == "+" else cf.removed_text(s.lineno))
            for s, _, sd in pairs[:4]
        )
        out.append(
            Signal(
                KERNEL,
                f"changes the address arithmetic of the Triton kernel {kernel} ({cf.path}:{stmt.lineno}, "
                f"{'added' if side == '+' else 'removed'}: {what}): the kernel reads or writes other addresses, "
                "a wrong step or offset silently",
                evidence,
                data={"kernel": kernel},
            )
        )
    return out
