"""Precision under a changed condition: a low-precision dtype assigned in a block whose condition the
patch changed::

    if <widened condition>:
        kv_cache_dtype = "fp8_e5m2"
"""

from __future__ import annotations

import ast
import re

from speedtrap.triage.evidence import PRECISION, Evidence, Signal, line_evidence
from speedtrap.triage.source import ChangedFile, Module, short

_LOW = re.compile(r"^(bf16|bfloat16|fp16|float16|half|fp8\w*|e4m3|e5m2|int8|int4|fp4|nvfp4|mxfp4)$", re.I)


_LOW_ATTRS = re.compile(r"^(bfloat16|float16|half|float8_\w+|int8|uint8|float4_\w+)$")


def _low_value(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _LOW.match(node.value):
        return node.value
    if isinstance(node, ast.Attribute) and _LOW_ATTRS.match(node.attr):
        return node.attr
    return None


def precision_under_new_condition(cf: ChangedFile, new: Module) -> list[Signal]:
    """Low-precision assignments left unchanged in a block whose condition the patch changed."""
    out: list[Signal] = []
    for stmt in new.statements_touching(cf.added):
        if not isinstance(stmt, ast.If) or stmt.lineno not in cf.added:
            continue
        for sub in stmt.body:
            for node in ast.walk(sub):
                if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                    continue
                if node.lineno in cf.added:
                    continue  # an added assignment is read by the precision detector itself
                low = _low_value(node.value)
                if low is None:
                    continue
                out.append(
                    Signal(
                        PRECISION,
                        f"precision set to {low} under a changed condition `if {short(stmt.test, 90)}` "
                        f"({new.qualname(stmt)}): more cases now run in {low}",
                        (
                            line_evidence(cf, stmt.lineno, "+"),
                            Evidence(cf.path, node.lineno, " ", cf.added_text(node.lineno)),
                        ),
                        data={"dtypes": [low]},
                    )
                )
    return out
