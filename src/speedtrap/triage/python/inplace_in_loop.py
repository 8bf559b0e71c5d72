"""An in-place update of what a ``for`` loop's items reach, added inside the loop: a scale change applied
once per iteration, compounding on a shared object::

    for layer in self.layers:
        layer.self_attn.rotary_emb.rotary_dim //= 2
"""

from __future__ import annotations

import ast

from speedtrap.triage.evidence import SCALE, Signal, line_evidence
from speedtrap.triage.source import ChangedFile, Module, short

_INPLACE_OPS = {ast.Mult: "*=", ast.Div: "/=", ast.FloorDiv: "//=", ast.Add: "+=", ast.Sub: "-=", ast.Pow: "**="}


def _loop_root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (``layer`` of ``layer.self_attn.rotary_emb.rotary_dim``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def inplace_in_loop(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """An in-place arithmetic update of an attribute reached through a ``for`` loop's variable, added inside that
    loop (``for layer in self.model.layers: layer.self_attn.rotary_emb.rotary_dim //= 2``): applied once per
    iteration to what each item reaches; when the items reach one shared object (a cached module), it is applied
    once per item, compounding. A scale change: it must be applied exactly once."""
    before = {(old.qualname(n), ast.dump(n)) for n in old.nodes if isinstance(n, ast.AugAssign)}
    out: list[Signal] = []
    for node in new.nodes_on_lines(cf.added):
        if not isinstance(node, ast.AugAssign) or type(node.op) not in _INPLACE_OPS:
            continue
        if not isinstance(node.target, ast.Attribute) or (new.qualname(node), ast.dump(node)) in before:
            continue
        root = _loop_root(node.target)
        loop = next(
            (
                a
                for a in new.ancestors(node)
                if isinstance(a, (ast.For, ast.AsyncFor))
                and root in {n.id for n in ast.walk(a.target) if isinstance(n, ast.Name)}
            ),
            None,
        )
        if loop is None:
            continue
        stmt = f"{short(node.target, 80)} {_INPLACE_OPS[type(node.op)]} {short(node.value, 40)}"
        where = new.qualname(node).replace("<module>", "module level")
        out.append(
            Signal(
                SCALE,
                f"updates `{stmt}` in place inside `for {short(loop.target, 30)} in {short(loop.iter, 60)}` ({where}): "
                "applied once per iteration, and once per item to an object the items share (a cached module)",
                (line_evidence(cf, node.lineno, "+"),),
                data={"change": "in place in a loop", "target": short(node.target, 80)},
            )
        )
    return out
