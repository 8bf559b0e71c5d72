"""Precision lowered: a low-precision dtype assigned, passed (``dtype=``), returned or ``.to()``-cast,
``.half()``/``.bfloat16()``, a tf32 switch::

    kv_cache_dtype = server_args.dtype   ->   kv_cache_dtype = "fp8_e4m3"

Not a dtype compared (``x.dtype == torch.bfloat16``) or given to an allocation."""

from __future__ import annotations

import ast

from speedtrap.triage.evidence import (
    PRECISION,
    Signal,
    line_evidence,
)
from speedtrap.triage.source import ChangedFile, Module, last_name

_LOW_DTYPES = {
    "bfloat16",
    "float16",
    "half",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "int8",
    "uint8",
    "qint8",
    "quint8",
    "int4",
}


_LOW_STRINGS = {
    "bf16",
    "bfloat16",
    "fp16",
    "float16",
    "half",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "e4m3",
    "e5m2",
    "int8",
    "int4",
    "fp4",
    "nvfp4",
    "mxfp4",
    "q8_0",
    "q4_0",
    "tf32",
}


_TF32_FLAGS = {"allow_tf32", "allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction"}


_DTYPE_WORDS = {
    "bfloat16": "bf16",
    ".bfloat16()": "bf16",
    "float16": "fp16",
    "half": "fp16",
    ".half()": "fp16",
    "float8_e4m3fn": "fp8 (e4m3)",
    "float8_e4m3fnuz": "fp8 (e4m3)",
    "float8_e5m2": "fp8 (e5m2)",
    "float8_e5m2fnuz": "fp8 (e5m2)",
    "fp8_e4m3": "fp8 (e4m3)",
    "fp8_e5m2": "fp8 (e5m2)",
    "e4m3": "fp8 (e4m3)",
    "e5m2": "fp8 (e5m2)",
    "float4_e2m1fn_x2": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
}


def precision(cf: ChangedFile, new: Module, old: Module | None) -> list[Signal]:
    hits: dict[int, set[str]] = {}
    for node in new.nodes_on_lines(cf.added):
        found: str | None = None
        if isinstance(node, ast.Attribute) and node.attr in _LOW_DTYPES and isinstance(node.ctx, ast.Load):
            parent = new.parent(node)
            if not (isinstance(parent, ast.Call) and parent.func is node) and not _compared_or_allocated(new, node):
                found = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"half", "bfloat16"}
            and not node.args
        ):
            found = f".{node.func.attr}()"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.lower() in _LOW_STRINGS
            and _assigned(new, node)
        ):
            found = node.value
        elif (
            isinstance(node, ast.Assign)
            and any(last_name(t) in _TF32_FLAGS for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and node.value.value is True
        ):
            found = "tf32 enabled"
        elif (
            isinstance(node, ast.Call)
            and last_name(node.func) == "set_float32_matmul_precision"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in ("high", "medium")
        ):
            found = f"float32 matmul precision {node.args[0].value!r}"
        if found:
            hits.setdefault(getattr(node, "lineno", 0), set()).add(found)
    if not hits:
        return []
    was_fp32 = old is not None and any(
        (isinstance(n, ast.Attribute) and n.attr in {"float32", "float64", "float"})
        or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "float")
        for n in old.nodes_on_lines(cf.removed)
    )
    kinds = sorted({_DTYPE_WORDS.get(k.lower(), k) for v in hits.values() for k in v})
    funcs = sorted({new.qualname(n) + "." + n.name for n in new.functions_touching(frozenset(hits))})
    where = f" in {', '.join(f.replace('<module>.', '') for f in funcs)}" if funcs else ""
    summary = f"precision lowered to {', '.join(kinds)}{where}" + (" (was float32)" if was_fp32 else "")
    return [
        Signal(PRECISION, summary, tuple(line_evidence(cf, ln, "+") for ln in sorted(hits)), data={"dtypes": kinds})
    ]


def _assigned(mod: Module, node: ast.AST) -> bool:
    """Whether a value is assigned, passed or returned (not compared, not a dict key, not a message)."""
    cur, parent = node, mod.parent(node)
    while isinstance(parent, (ast.IfExp, ast.BoolOp)) and getattr(parent, "test", None) is not cur:
        cur, parent = parent, mod.parent(parent)
    if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.Return, ast.NamedExpr)):
        return parent.value is cur
    if isinstance(parent, ast.keyword):
        return True
    return isinstance(parent, ast.Call) and cur in parent.args and last_name(parent.func) in {"to", "set_dtype"}


_ALLOC_CALLS = {
    "empty",
    "zeros",
    "ones",
    "full",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "arange",
    "new_empty",
    "new_zeros",
    "new_ones",
    "new_full",
    "randn",
    "rand",
    "tensor",
}


def _compared_or_allocated(mod: Module, node: ast.AST) -> bool:
    """A dtype compared (``x.dtype == torch.bfloat16``) or given to an allocation: no value is rounded."""
    parent = mod.parent(node)
    if isinstance(parent, (ast.Tuple, ast.List, ast.Set)):
        parent = mod.parent(parent)
    if isinstance(parent, ast.Compare):
        return True
    if isinstance(parent, ast.keyword) and parent.arg == "dtype":
        call = mod.parent(parent)
        return isinstance(call, ast.Call) and last_name(call.func) in _ALLOC_CALLS
    return False
