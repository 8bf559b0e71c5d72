"""A value applied as a Python float where it was a registered buffer: ``self.register_buffer("n",
torch.tensor(x))`` and ``h *= self.n`` replaced by ``h *= x``. The buffer is a tensor that follows the
module's dtype (rounded to bf16 in a bf16 model, as the reference computes it); the float is not. A
precision signal, with the buffer's line and the new multiply's.

Catches::

    self.register_buffer("n", torch.tensor(x)); h *= self.n   ->   h *= x

"""

from __future__ import annotations

import ast

from speedtrap.triage.evidence import PRECISION, Evidence, Signal
from speedtrap.triage.source import ChangedFile, Module, last_name, short


def _source(mod: Module, call: ast.Call, arg: ast.expr) -> ast.expr:
    """What a buffer is made from: ``torch.tensor(x)`` -> ``x``, a local resolved to its assignment."""
    if isinstance(arg, ast.Call) and last_name(arg.func) in ("tensor", "as_tensor") and arg.args:
        arg = arg.args[0]
    if not isinstance(arg, ast.Name):
        return arg
    local = arg.id
    func = next((a for a in mod.ancestors(call) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    for stmt in ast.walk(func) if func is not None else []:
        if (
            isinstance(stmt, ast.Assign)
            and stmt.lineno < call.lineno
            and any(isinstance(t, ast.Name) and t.id == local for t in stmt.targets)
        ):
            arg = stmt.value
    return arg


def _buffers(mod: Module, lines: frozenset[int]) -> dict[str, tuple[ast.Call, ast.expr]]:
    out: dict[str, tuple[ast.Call, ast.expr]] = {}
    for stmt in mod.statements_touching(lines):
        for call in ast.walk(stmt):
            if not (isinstance(call, ast.Call) and last_name(call.func) == "register_buffer" and len(call.args) >= 2):
                continue
            name = call.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                out[name.value] = (call, _source(mod, call, call.args[1]))
    return out


def _multiplied(mod: Module, lines: frozenset[int]) -> list[tuple[ast.AST, ast.expr]]:
    out: list[tuple[ast.AST, ast.expr]] = []
    for node in mod.nodes_on_lines(lines):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult):
            out.append((node, node.value))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            out.extend([(node, node.left), (node, node.right)])
    return out


def buffer_to_float(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """A removed buffer whose source value is now multiplied in directly."""
    gone = _buffers(old, cf.removed)
    if not gone:
        return []
    out: list[Signal] = []
    multiplies = _multiplied(new, cf.added)
    for name, (call, source) in gone.items():
        hit = next((node for node, operand in multiplies if ast.dump(operand) == ast.dump(source)), None)
        if hit is None:
            continue
        line = getattr(hit, "lineno", 0)
        out.append(
            Signal(
                PRECISION,
                f"applies `{short(source, 60)}` as a Python float ({cf.path}:{line}) where it was the buffer "
                f"`{name}` ({cf.path}:{call.lineno}), a tensor that follows the module's dtype: the multiply now "
                "uses the unrounded value, not the one rounded to the model dtype",
                (
                    Evidence(cf.path, call.lineno, "-", cf.removed_text(call.lineno)),
                    Evidence(cf.path, line, "+", cf.added_text(line)),
                ),
                data={"kind": "buffer to float", "buffer": name},
            )
        )
    return out
