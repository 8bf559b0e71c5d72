"""Detectors for classes of risky change beyond guards, factors and dtypes, each with its lines:

- uninitialised memory: ``torch.empty``/``empty_like``/``new_empty`` where the old code used
  ``zeros``/``zeros_like``/``new_zeros``/``full`` (or a ``zero_()``/``fill_()`` removed);
- a selection widened: a ``_supports_*``/``*_SUPPORTED`` collection or a membership tuple given more
  members, a condition losing a conjunct or gaining a disjunct, in the same function; or narrowed: a
  condition strictly narrower (an alternative dropped, a conjunct added), so the cases it no longer
  covers take the other path;
- CUDA-graph state: buffers allocated or re-sliced in capture/replay code, or a branch on
  ``is_in_piecewise_cuda_graph()`` / ``is_capturing`` ... removed;
- precision under a changed condition: a low-precision dtype assigned in a block whose condition
  the patch changed (``kv_cache_dtype = "fp8_e4m3"`` under a widened ``if``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from speedtrap.triage._bufferfloat import buffer_to_float
from speedtrap.triage._changes import ChangedFile
from speedtrap.triage._detect import GUARD, PRECISION, SCALE, Evidence, Signal
from speedtrap.triage._kernelidx import kernel_indexing
from speedtrap.triage._moved import moved_slices
from speedtrap.triage._pyast import Module, short
from speedtrap.triage._resolve import Resolver

MEMORY, GRAPH = "memory", "cuda_graph"

_ZEROED = {"zeros", "zeros_like", "new_zeros", "full", "full_like", "new_full", "ones", "ones_like", "zero_", "fill_"}
_EMPTY = {"empty", "empty_like", "new_empty", "empty_strided"}
_ALLOC = _ZEROED | _EMPTY | {"ones", "arange", "tensor", "randn", "rand"}
_WIDE_NAME = re.compile(r"support|allow|compatib|capab|enabl|whitelist|valid|known|choices", re.I)
_GRAPH_WORDS = re.compile(r"cuda_?graph|capture|replay|graph_runner|piecewise|is_capturing", re.I)
_GRAPH_TEST = re.compile(r"cuda_?graph|capturing|piecewise|graph_mode|in_graph|is_capturing", re.I)
_LOW = re.compile(r"^(bf16|bfloat16|fp16|float16|half|fp8\w*|e4m3|e5m2|int8|int4|fp4|nvfp4|mxfp4)$", re.I)
_LOW_ATTRS = re.compile(r"^(bfloat16|float16|half|float8_\w+|int8|uint8|float4_\w+)$")


def _callee(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):
            return node.func.attr
        if isinstance(node.func, ast.Name):
            return node.func.id
    return None


def _ev(cf: ChangedFile, line: int, side: str) -> Evidence:
    return Evidence(cf.path, line, side, cf.added_text(line) if side == "+" else cf.removed_text(line))


def _calls(mod: Module, lines: frozenset[int], names: set[str]) -> dict[str, list[ast.Call]]:
    """Calls of ``names`` on ``lines``, by the qualified name of the function holding them."""
    out: dict[str, list[ast.Call]] = {}
    for node in mod.nodes_on_lines(lines):
        if isinstance(node, ast.Call) and _callee(node) in names:
            out.setdefault(mod.qualname(node), []).append(node)
    return out


def uninitialised(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    zeroed = _calls(old, cf.removed, _ZEROED)
    empty = _calls(new, cf.added, _EMPTY)
    out: list[Signal] = []
    for func, calls in sorted(empty.items()):
        before = zeroed.get(func, [])
        if not before:
            continue
        ev = [_ev(cf, c.lineno, "-") for c in before[:3]] + [_ev(cf, c.lineno, "+") for c in calls[:3]]
        was = sorted({_callee(c) or "" for c in before})
        now = sorted({_callee(c) or "" for c in calls})
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


def _members(node: ast.AST) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [ast.dump(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return [ast.dump(k) for k in node.keys if k is not None]
    return None


def _collection_slots(mod: Module, lines: frozenset[int]) -> dict[tuple[str, str], tuple[ast.AST, list[str], int]]:
    """Collections assigned to a name, returned, or tested for membership, on or spanning ``lines``."""
    out: dict[tuple[str, str], tuple[ast.AST, list[str], int]] = {}
    for stmt in mod.statements_touching(lines):
        where = mod.qualname(stmt)
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            members = _members(stmt.value)
            if members is not None:
                for t in targets:
                    out[(where, short(t, 80))] = (stmt.value, members, stmt.lineno)
        for node in ast.walk(stmt):
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
                members = _members(node.comparators[0])
                if members is not None:
                    kind = "in" if isinstance(node.ops[0], ast.In) else "not in"
                    out[(where, f"{short(node.left, 80)} {kind}")] = (node, members, node.lineno)
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            members = _members(stmt.value)
            if members is not None:
                out[(where, "return")] = (stmt.value, members, stmt.lineno)
    return out


def _conjuncts(test: ast.expr, op: type[ast.boolop]) -> list[str]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, op):
        return [ast.dump(v) for v in test.values]
    return [ast.dump(test)]


def implies(a: ast.expr, b: ast.expr) -> bool:
    """Whether ``a`` implies ``b`` for every truth value of their atoms (the operands that are not
    ``and``/``or``, compared as ASTs and treated as independent). Sound, not complete."""
    if ast.dump(a) == ast.dump(b):
        return True
    if isinstance(a, ast.BoolOp) and isinstance(a.op, ast.Or):
        return all(implies(x, b) for x in a.values)
    if isinstance(b, ast.BoolOp) and isinstance(b.op, ast.And):
        return all(implies(a, y) for y in b.values)
    if isinstance(a, ast.BoolOp) and isinstance(a.op, ast.And) and any(implies(x, b) for x in a.values):
        return True
    return isinstance(b, ast.BoolOp) and isinstance(b.op, ast.Or) and any(implies(a, y) for y in b.values)


def _conditions(mod: Module, funcs: set[str]) -> dict[tuple[str, int], list[tuple[ast.expr, int]]]:
    """If/while tests and predicate returns of the functions ``funcs``, by function and kind, in order."""
    out: dict[tuple[str, int], list[tuple[ast.expr, int]]] = {}
    for stmt in sorted((n for n in mod.nodes if isinstance(n, (ast.If, ast.While, ast.Return))), key=_pos):
        where = mod.qualname(stmt)
        if where not in funcs:
            continue
        if isinstance(stmt, (ast.If, ast.While)):
            out.setdefault((where, 0), []).append((stmt.test, stmt.lineno))
        elif isinstance(stmt.value, (ast.BoolOp, ast.Compare, ast.UnaryOp)):
            out.setdefault((where, 1), []).append((stmt.value, stmt.lineno))
    return out


def _pos(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def _spans(node: ast.AST, lines: frozenset[int]) -> bool:
    start = getattr(node, "lineno", 0)
    end = getattr(node, "end_lineno", start) or start
    return any(start <= ln <= end for ln in lines)


def widened(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    out: list[Signal] = []
    before = _collection_slots(old, cf.removed)
    after = _collection_slots(new, cf.added)
    for key, (node, members, line) in sorted(after.items(), key=lambda kv: kv[1][2]):
        if key not in before:
            continue
        _old_node, old_members, old_line = before[key]
        gained = [m for m in members if m not in old_members]
        if not gained or any(m not in members for m in old_members):
            continue
        named = key[1].endswith(" in") or _WIDE_NAME.search(key[1]) or key[1] == "return"
        if not named:
            continue
        shown = ", ".join(short(_node_of(node, m), 40) for m in gained)
        out.append(
            Signal(
                GUARD,
                f"widens `{key[1]}` in {key[0].replace('<module>', 'module level')}: now also {shown}; "
                "a path that was refused for these cases now runs for them",
                (_ev(cf, old_line, "-"), _ev(cf, line, "+")),
                data={"kind": "widened", "widened": True, "names": [key[1]]},
            )
        )
    kept = {(new.qualname(n), ast.dump(n.test)) for n in new.nodes if isinstance(n, ast.If)}
    for node in old.nodes_on_lines(cf.removed):
        if not isinstance(node, ast.If) or not _WIDE_NAME.search(short(node.test, 200)):
            continue
        if (old.qualname(node), ast.dump(node.test)) in kept:
            continue
        out.append(
            Signal(
                GUARD,
                f"removes the selection `if {short(node.test, 80)}: {short(node.body[0], 60)}` "
                f"({old.qualname(node).replace('<module>', 'module level')}): what it refused or redirected now runs",
                (_ev(cf, node.lineno, "-"),),
                data={"kind": "widened", "widened": True, "names": []},
            )
        )
    funcs = {old.qualname(n) for n in old.statements_touching(cf.removed)}
    funcs |= {new.qualname(n) for n in new.statements_touching(cf.added)}
    old_tests, new_tests = _conditions(old, funcs), _conditions(new, funcs)
    for cond_key, tests in new_tests.items():
        olds = old_tests.get(cond_key, [])
        if len(olds) != len(tests):
            continue
        for (o, o_line), (n, n_line) in zip(olds, tests, strict=True):
            if not (_spans(o, cf.removed) or _spans(n, cf.added)) or ast.dump(o) == ast.dump(n):
                continue
            if implies(n, o) and not implies(o, n):
                out.append(_narrowed(cf, cond_key[0], o, n, o_line, n_line))
                continue
            if not implies(o, n) or implies(n, o):
                continue  # not strictly wider or narrower: rewritten, or the same cases
            o_or, n_or = _conjuncts(o, ast.Or), _conjuncts(n, ast.Or)
            how = (
                "adds an alternative to"
                if len(n_or) > len(o_or) and all(c in n_or for c in o_or)
                else "drops a condition from"
            )
            evidence = [_ev(cf, ln, "-") for ln in sorted(cf.removed) if _spans(o, frozenset({ln}))][:3]
            evidence += [_ev(cf, ln, "+") for ln in sorted(cf.added) if _spans(n, frozenset({ln}))][:3]
            out.append(
                Signal(
                    GUARD,
                    f"{how} `{short(o, 100)}` in {cond_key[0].replace('<module>', 'module level')} "
                    f"(now `{short(n, 100)}`): the guarded path runs in more cases",
                    tuple(evidence) or (_ev(cf, o_line, "-"), _ev(cf, n_line, "+")),
                    data={
                        "kind": "widened",
                        "widened": True,
                        "names": [],
                        "function": cond_key[0],
                        "dropped": [x for x in _names_in(o) if x not in _names_in(n)],
                    },
                )
            )
    return out


def _narrowed(cf: ChangedFile, where: str, o: ast.expr, n: ast.expr, o_line: int, n_line: int) -> Signal:
    """A condition strictly narrower than before (the new one implies the old, not the reverse): the cases only
    the old one covered (an alternative dropped, a conjunct added) now take the other path."""
    o_or, n_or = _conjuncts(o, ast.Or), _conjuncts(n, ast.Or)
    lost = [
        v
        for v in (o.values if isinstance(o, ast.BoolOp) and isinstance(o.op, ast.Or) else [])
        if ast.dump(v) not in n_or
    ]
    dropped = lost and len(n_or) < len(o_or) and all(c in o_or for c in n_or)
    how = f"drops the alternative `{short(lost[0], 80)}` from" if dropped else "narrows"
    evidence = [_ev(cf, ln, "-") for ln in sorted(cf.removed) if _spans(o, frozenset({ln}))][:3]
    evidence += [_ev(cf, ln, "+") for ln in sorted(cf.added) if _spans(n, frozenset({ln}))][:3]
    return Signal(
        GUARD,
        f"{how} `{short(o, 100)}` in {where.replace('<module>', 'module level')} (now `{short(n, 100)}`): "
        "the cases it no longer covers take the other path",
        tuple(evidence) or (_ev(cf, o_line, "-"), _ev(cf, n_line, "+")),
        data={"kind": "narrowed", "narrowed": True, "names": [], "function": where},
    )


def _names_in(test: ast.AST) -> list[str]:
    """The names and attribute names a condition reads, in order, once each."""
    out: list[str] = []
    for sub in ast.walk(test):
        name = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else None
        if name is not None and name not in out:
            out.append(name)
    return out


def _node_of(node: ast.AST, dump: str) -> ast.AST:
    for sub in ast.walk(node):
        if ast.dump(sub) == dump:
            return sub
    return node


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
        if isinstance(node, ast.Call) and _callee(node) in _ALLOC:
            hits.append((node.lineno, f"allocates a buffer ({_callee(node)}) in {scope}"))
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
                tuple(_ev(cf, ln, "+") for ln in lines[:4]),
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
                    (_ev(cf, node.lineno, "-"),),
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
                (_ev(cf, old_node.lineno, "-"), _ev(cf, node.lineno, "+")),
                data={"kind": "graph constant", "function": func},
            )
        )
    return out


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
                        (_ev(cf, stmt.lineno, "+"), Evidence(cf.path, node.lineno, " ", cf.added_text(node.lineno))),
                        data={"dtypes": [low]},
                    )
                )
    return out


def _calls_in(mod: Module, funcs: set[str]) -> dict[tuple[str, str], list[ast.Call]]:
    out: dict[tuple[str, str], list[ast.Call]] = {}
    for node in sorted((n for n in mod.nodes if isinstance(n, ast.Call)), key=_pos):
        where = mod.qualname(node)
        if where in funcs:
            out.setdefault((where, short(node.func, 80)), []).append(node)
    return out


def _calls_that_stay(cf: ChangedFile, old: Module, new: Module) -> Iterator[tuple[tuple[str, str], ast.Call, ast.Call]]:
    """Each call on a removed line of a changed function with its counterpart in the new version (same function,
    same callee, same count of such calls there): (function and callee, old call, new call)."""
    funcs = {old.qualname(n) for n in old.statements_touching(cf.removed)}
    before, after = _calls_in(old, funcs), _calls_in(new, funcs)
    for key, olds in before.items():
        news = after.get(key, [])
        if len(news) == len(olds):
            yield from ((key, o, n) for o, n in zip(olds, news, strict=True) if _spans(o, cf.removed))


def dropped_arguments(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    """A keyword argument deleted from a call that stays (same function, same callee, the positional
    arguments not grown to take it): the callee now computes with its default for that parameter."""
    out: list[Signal] = []
    for key, o, n in _calls_that_stay(cf, old, new):
        if len(n.args) > len(o.args):
            continue
        if any(k.arg is None for k in n.keywords):
            continue  # a **mapping may pass it now
        kept = {k.arg for k in n.keywords}
        for kw in o.keywords:
            if kw.arg is None or kw.arg in kept or not _spans(kw, cf.removed):
                continue
            out.append(
                Signal(
                    GUARD,
                    f"drops `{kw.arg}={short(kw.value, 60)}` from the call `{key[1]}(...)` in "
                    f"{key[0].replace('<module>', 'module level')}: the callee now uses its default for "
                    f"`{kw.arg}`",
                    (_ev(cf, kw.lineno, "-"),),
                    data={"kind": "argument dropped", "argument": True, "names": [kw.arg]},
                )
            )
    return out


def _parameters(resolver: Resolver, mod: Module, call: ast.Call) -> list[str] | None:
    """The positional parameter names of the plain function a call runs (``kernel[grid](...)``, a Triton launch,
    runs ``kernel``), or None when it cannot be read (a method, a class, ``*args`` first, not found)."""
    func = call.func.value if isinstance(call.func, ast.Subscript) else call.func
    found = resolver.callee(mod, ast.copy_location(ast.Call(func=func, args=[], keywords=[]), call))
    if found is None or not isinstance(found.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    names = [a.arg for a in (*found.node.args.posonlyargs, *found.node.args.args)]
    return None if names[:1] in (["self"], ["cls"]) else names


def shifted_arguments(cf: ChangedFile, old: Module, new: Module, resolver: Resolver) -> list[Signal]:
    """A keyword argument turned positional at a call that stays (same function, same callee): bound against the
    callee's signature, the new positional argument lands in another parameter (one inserted before the keyword's,
    say), and the keyword's parameter takes its default."""
    out: list[Signal] = []
    for key, o, n in _calls_that_stay(cf, old, new):
        if len(n.args) <= len(o.args):
            continue
        if any(isinstance(a, ast.Starred) for a in n.args) or any(k.arg is None for k in n.keywords):
            continue
        kept = {k.arg for k in n.keywords}
        dropped = [k for k in o.keywords if k.arg is not None and k.arg not in kept and _spans(k, cf.removed)]
        params = _parameters(resolver, new, n) if dropped else None
        if not params:
            continue
        bound = {j: params[j] for j in range(len(o.args), len(n.args)) if j < len(params)}
        for kw in dropped:
            if kw.arg not in params or kw.arg in bound.values() or not bound:
                continue
            j, name = next(iter(bound.items()))
            out.append(
                Signal(
                    GUARD,
                    f"passes `{short(n.args[j], 60)}` positionally to `{key[1]}(...)` in "
                    f"{key[0].replace('<module>', 'module level')} instead of `{kw.arg}=`: bound against the "
                    f"callee's signature it lands in `{name}` (argument {j + 1}), and `{kw.arg}` takes its default",
                    (_ev(cf, kw.lineno, "-"), _ev(cf, n.args[j].lineno, "+")),
                    data={"kind": "argument shifted", "argument": True, "names": [kw.arg, name]},
                )
            )
    return out


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
                (_ev(cf, node.lineno, "+"),),
                data={"change": "in place in a loop", "target": short(node.target, 80)},
            )
        )
    return out


def class_signals(cf: ChangedFile, old: Module, new: Module) -> list[Signal]:
    return [
        *inplace_in_loop(cf, old, new),
        *kernel_indexing(cf, old, new),
        *moved_slices(cf, old, new),
        *buffer_to_float(cf, old, new),
        *uninitialised(cf, old, new),
        *dropped_arguments(cf, old, new),
        *widened(cf, old, new),
        *cuda_graph(cf, old, new),
        *precision_under_new_condition(cf, new),
    ]
