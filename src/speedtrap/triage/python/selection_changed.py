"""A selection widened or narrowed: a ``_supports_*``/``*_SUPPORTED``/membership collection given more
members, or an ``if``/``while`` condition or returned predicate strictly wider (the old one implies the new
and not the reverse) or strictly narrower, read on the ``and``/``or`` tree::

    return [64, 128, 256]   ->   return [64, 128, 256, 512]
    if is_cuda and head_dim in (64, 128) and sm >= 80:   ->   if is_cuda and head_dim in (64, 128):
"""

from __future__ import annotations

import ast
import re

from speedtrap.triage.evidence import GUARD, Signal, line_evidence, spans
from speedtrap.triage.source import ChangedFile, Module, position, short

_WIDE_NAME = re.compile(r"support|allow|compatib|capab|enabl|whitelist|valid|known|choices", re.I)


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
    for stmt in sorted((n for n in mod.nodes if isinstance(n, (ast.If, ast.While, ast.Return))), key=position):
        where = mod.qualname(stmt)
        if where not in funcs:
            continue
        if isinstance(stmt, (ast.If, ast.While)):
            out.setdefault((where, 0), []).append((stmt.test, stmt.lineno))
        elif isinstance(stmt.value, (ast.BoolOp, ast.Compare, ast.UnaryOp)):
            out.setdefault((where, 1), []).append((stmt.value, stmt.lineno))
    return out


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
                (line_evidence(cf, old_line, "-"), line_evidence(cf, line, "+")),
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
                (line_evidence(cf, node.lineno, "-"),),
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
            if not (spans(o, cf.removed) or spans(n, cf.added)) or ast.dump(o) == ast.dump(n):
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
            evidence = [line_evidence(cf, ln, "-") for ln in sorted(cf.removed) if spans(o, frozenset({ln}))][:3]
            evidence += [line_evidence(cf, ln, "+") for ln in sorted(cf.added) if spans(n, frozenset({ln}))][:3]
            out.append(
                Signal(
                    GUARD,
                    f"{how} `{short(o, 100)}` in {cond_key[0].replace('<module>', 'module level')} "
                    f"(now `{short(n, 100)}`): the guarded path runs in more cases",
                    tuple(evidence) or (line_evidence(cf, o_line, "-"), line_evidence(cf, n_line, "+")),
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
    evidence = [line_evidence(cf, ln, "-") for ln in sorted(cf.removed) if spans(o, frozenset({ln}))][:3]
    evidence += [line_evidence(cf, ln, "+") for ln in sorted(cf.added) if spans(n, frozenset({ln}))][:3]
    return Signal(
        GUARD,
        f"{how} `{short(o, 100)}` in {where.replace('<module>', 'module level')} (now `{short(n, 100)}`): "
        "the cases it no longer covers take the other path",
        tuple(evidence) or (line_evidence(cf, o_line, "-"), line_evidence(cf, n_line, "+")),
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
