"""CUDA-graph state: buffers allocated or re-sliced in capture/replay code, a branch on
``is_in_piecewise_cuda_graph()``/``is_capturing`` removed, a constant a graph hook returns changed::

    def get_cuda_graph_seq_len_fill_value(self): return 1   ->   return 0
"""

from __future__ import annotations

import ast
import re

from speedtrap.triage.evidence import Signal, line_evidence
from speedtrap.triage.python.uninitialised_memory import EMPTY, ZEROED
from speedtrap.triage.source import ChangedFile, Module, callee, short

GRAPH = "cuda_graph"
_ALLOC = ZEROED | EMPTY | {"ones", "arange", "tensor", "randn", "rand"}


_GRAPH_WORDS = re.compile(r"cuda_?graph|capture|replay|graph_runner|piecewise|is_capturing", re.I)


_GRAPH_TEST = re.compile(r"cuda_?graph|capturing|piecewise|graph_mode|in_graph|is_capturing", re.I)


def _graph_scope(mod: Module, node: ast.AST) -> str | None:
    for anc in mod.ancestors(node):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _GRAPH_WORDS.search(anc.name):
            return anc.name
    return None


def cuda_graph(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    out: list[Signal] = []
    hits: list[tuple[int, str]] = []
    for node in new.nodes_on_lines(cf.added):
        scope = _graph_scope(new, node)
        if scope is None:
            continue
        if isinstance(node, ast.Call) and callee(node) in _ALLOC:
            hits.append((node.lineno, f"allocates a buffer ({callee(node)}) in {scope}"))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, (ast.Slice, ast.Tuple)):
            hits.append((node.lineno, f"re-slices `{short(node, 60)}` in {scope}"))
    if hits:
        lines = sorted({ln for ln, _ in hits})
        out.append(
            Signal(
                GRAPH,
                "changes the buffers of CUDA-graph capture/replay: "
                + "; ".join(dict.fromkeys(w for _, w in hits[:3]))
                + ": a replayed graph reads the addresses it captured, not the new ones",
                tuple(line_evidence(cf, ln, "+") for ln in lines[:4]),
            )
        )
    out.extend(_graph_constants(cf, old, new))
    new_tests = {ast.dump(n.test) for n in new.nodes if isinstance(n, (ast.If, ast.IfExp))}
    for node in old.nodes_on_lines(cf.removed):
        if isinstance(node, (ast.If, ast.IfExp)) and _GRAPH_TEST.search(ast.unparse(node.test)):
            if ast.dump(node.test) in new_tests:
                continue
            out.append(
                Signal(
                    GRAPH,
                    f"removes the branch `if {short(node.test, 80)}` ({old.qualname(node)}): code that "
                    "must differ under CUDA-graph capture now runs the same in and out of it",
                    (line_evidence(cf, node.lineno, "-"),),
                )
            )
    return out


def _returned_constants(mod: Module, lines: frozenset[int]) -> dict[str, tuple[ast.Return, int | float]]:
    """Numeric constants returned on ``lines`` by functions named for CUDA-graph capture/replay."""
    out: dict[str, tuple[ast.Return, int | float]] = {}
    for node in mod.nodes_on_lines(lines):
        if not isinstance(node, ast.Return) or not isinstance(node.value, (ast.Constant, ast.UnaryOp)):
            continue
        value = node.value
        try:
            number = ast.literal_eval(value)
        except ValueError:
            continue
        scope = _graph_scope(mod, node)
        if scope is not None and isinstance(number, (int, float)) and not isinstance(number, bool):
            out[mod.qualname(node)] = (node, number)
    return out


def _graph_constants(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """A constant that a CUDA-graph hook returns (a pad or fill value for captured buffers) changed."""
    before = _returned_constants(old, cf.removed)
    out: list[Signal] = []
    for func, (node, value) in _returned_constants(new, cf.added).items():
        if func not in before or before[func][1] == value:  # 1 -> 1.0 is the same value
            continue
        old_node, old_value = before[func]
        out.append(
            Signal(
                GRAPH,
                f"changes the constant {func} hands to CUDA-graph capture/replay ({cf.path}:{node.lineno}: "
                f"`return {old_value!r}` -> `return {value!r}`): every captured or padded entry that takes it now "
                "gets the new value",
                (line_evidence(cf, old_node.lineno, "-"), line_evidence(cf, node.lineno, "+")),
                data={"kind": "graph constant", "function": func},
            )
        )
    return out
