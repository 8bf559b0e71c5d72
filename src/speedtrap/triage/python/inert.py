"""Proof that a change to a Python file is inert: both versions normalise to the same AST.

The normal form drops what cannot change a computed value and canonicalises rewrites that are
equal by construction:

- docstrings (comments and layout are not in the AST at all), and any other statement that is a bare constant
  (a string below the docstring, ``...``): it computes nothing;
- logging and messages: ``logger.info(...)``, ``print(...)``, ``warnings.warn(...)`` statements whose
  arguments call nothing but pure formatting helpers, and the text of exception and assert messages;
  a log call whose arguments compute is kept and compared, with only its printed text masked (a
  %-format string reduced to its directives, the literal parts of an f-string dropped);
- renamed locals: names a function binds (its parameters excepted) become ``_v0``, ``_v1`` ... in
  order of first appearance, so a consistent rename normalises away and a changed data flow does not;
- ``x *= a`` / ``x.mul_(a)``, ``x /= a`` / ``x.div_(a)``, ``x += a`` / ``x.add_(a)``, ``x -= a`` / ``x.sub_(a)``;
  ``torch.mul(a, b)`` / ``a.mul(b)`` / ``a * b`` (and ``div``); ``a * b`` / ``b * a`` (the two operands of
  one product; a regrouped chain rounds differently and is a change);
- ``x in (c,)`` / ``x in [c]`` / ``x in {c}`` / ``x == c`` (and ``not in`` / ``!=``); ``c == x`` / ``x == c``;
  ``not (a == b)`` / ``a != b``.

Anything else is a change: :func:`inert` returns ``None`` and the caller must not say "same math".
"""

from __future__ import annotations

import ast
import copy
import re

_LOG_ROOTS = {"logger", "logging", "log", "_logger", "LOGGER", "warnings"}
_LOG_METHODS = {
    "debug",
    "info",
    "warning",
    "warn",
    "error",
    "exception",
    "critical",
    "log",
    "info_once",
    "warning_once",
    "debug_once",
    "warn_once",
}
_PURE = {"str", "repr", "len", "format", "join", "type", "getattr", "hasattr", "isinstance", "int", "float", "round"}
_DIRECTIVE = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]")
_INPLACE = {"mul_": ast.Mult, "div_": ast.Div, "add_": ast.Add, "sub_": ast.Sub}
_OUT_OF_PLACE = {"mul": ast.Mult, "multiply": ast.Mult, "div": ast.Div, "divide": ast.Div, "true_divide": ast.Div}
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_NEGATE: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_log_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not _logs(node):
        return False
    for arg in [*node.args, *(k.value for k in node.keywords)]:
        for sub in ast.walk(arg):
            if isinstance(sub, ast.Call) and _name_of(sub.func) not in _PURE:
                return False  # the message computes something: not provably free of effects
            if isinstance(sub, ast.NamedExpr):
                return False
    return True


def _logs(node: ast.Call) -> bool:
    """Whether a call is a logging or print call (by its name)."""
    func = node.func
    if isinstance(func, ast.Name):
        logging = func.id == "print"
    elif isinstance(func, ast.Attribute):
        root = _name_of(func.value)
        logging = func.attr in _LOG_METHODS and (root in _LOG_ROOTS or (root or "").endswith("logger"))
        logging = logging or (root == "warnings" and func.attr == "warn")
    else:
        logging = False
    return logging


def _directives(text: str) -> str:
    """A %-format message reduced to its conversion directives: the text around them is only printed."""
    return "\x00".join(m.group(0) for m in _DIRECTIVE.finditer(text))


def _mask_message(call: ast.Call) -> None:
    """The printed text of a log call that computes is masked; its arguments (and the directives that
    decide how they are converted) stay and are compared."""
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            call.args[i] = ast.Constant(value=_directives(arg.value))
        elif isinstance(arg, ast.JoinedStr):
            arg.values = [v for v in arg.values if not isinstance(v, ast.Constant)]


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1:]
    return body


def _no_effect(value: ast.expr) -> bool:
    """A statement of this expression alone changes no value: a log call that computes nothing, or a bare constant
    (a string left where a docstring no longer is, ``...``, a number). An f-string is not a constant: it may format."""
    return isinstance(value, ast.Constant) or _is_log_call(value)


class _Normal(ast.NodeTransformer):
    def generic_visit(self, node: ast.AST) -> ast.AST:
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and all(isinstance(s, ast.stmt) for s in block):
                if name == "body" and isinstance(
                    node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
                ):
                    block = _strip_docstring(block)
                kept = [s for s in block if not (isinstance(s, ast.Expr) and _no_effect(s.value))]
                if not kept and name == "body" and not isinstance(node, ast.Module):
                    kept = [ast.Pass()]
                setattr(node, name, kept)
        return super().generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.exc, ast.Call):
            node.exc.args = [_blank(a) for a in node.exc.args]
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        self.generic_visit(node)
        node.msg = None
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        self.generic_visit(node)
        call = node.value
        if isinstance(call, ast.Call) and _logs(call):
            _mask_message(call)
            return node
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in _INPLACE
            and len(call.args) == 1
            and not call.keywords
            and isinstance(call.func.value, (ast.Name, ast.Attribute, ast.Subscript))
        ):
            target = copy.deepcopy(call.func.value)
            _store(target)
            return ast.AugAssign(target=target, op=_INPLACE[call.func.attr](), value=call.args[0])
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _OUT_OF_PLACE and not node.keywords:
            op = _OUT_OF_PLACE[func.attr]
            if _name_of(func.value) == "torch" and len(node.args) == 2:
                return self.visit_BinOp(ast.BinOp(left=node.args[0], op=op(), right=node.args[1]))
            if _name_of(func.value) != "torch" and len(node.args) == 1:
                return self.visit_BinOp(ast.BinOp(left=func.value, op=op(), right=node.args[0]))
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Mult) and ast.dump(node.right) < ast.dump(node.left):
            # a*b and b*a are the same IEEE product; (a*b)*c and a*(b*c) are not (rounding), so only the
            # two operands of each product are ordered, never a chain regrouped.
            node.left, node.right = node.right, node.left
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        inner = node.operand
        if (
            isinstance(node.op, ast.Not)
            and isinstance(inner, ast.Compare)
            and len(inner.ops) == 1
            and type(inner.ops[0]) in _NEGATE
        ):
            inner.ops = [_NEGATE[type(inner.ops[0])]()]
            return inner
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1:
            return node
        op, right = node.ops[0], node.comparators[0]
        elts = right.elts if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else []
        if isinstance(op, (ast.In, ast.NotIn)) and len(elts) == 1 and not isinstance(elts[0], ast.Starred):
            node.ops = [ast.Eq() if isinstance(op, ast.In) else ast.NotEq()]
            node.comparators = [elts[0]]
        flip = isinstance(node.left, ast.Constant) and not isinstance(node.comparators[0], ast.Constant)
        if isinstance(node.ops[0], (ast.Eq, ast.NotEq)) and flip:
            node.left, node.comparators = node.comparators[0], [node.left]
        return node


def _blank(node: ast.expr) -> ast.expr:
    if isinstance(node, (ast.Constant, ast.JoinedStr)) and not isinstance(getattr(node, "value", ""), bytes):
        return ast.Constant(value="")
    return node


def _store(node: ast.expr) -> None:
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
        node.ctx = ast.Store()


def _rename_locals(tree: ast.AST) -> None:
    """Canonical names for what each function binds (parameters and global/nonlocal names excepted)."""
    for func in [n for n in ast.walk(tree) if isinstance(n, _FUNCS)]:
        args = func.args
        params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        shared: set[str] = set()
        for sub in ast.walk(func):
            if isinstance(sub, (ast.Global, ast.Nonlocal)):
                shared.update(sub.names)
        mapping: dict[str, str] = {}
        for sub in ast.walk(func):
            if not (isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)):
                continue
            if sub.id not in params and sub.id not in shared and not sub.id.startswith("_v"):
                mapping.setdefault(sub.id, f"_v{len(mapping)}")
        for sub in ast.walk(func):
            if isinstance(sub, ast.Name) and sub.id in mapping:
                sub.id = mapping[sub.id]


def normal_form(tree: ast.Module) -> str:
    """The normalised dump of a module (the input is not modified)."""
    work = copy.deepcopy(tree)
    work = _Normal().visit(work)
    _rename_locals(work)
    return ast.dump(work)


def inert(old: ast.Module, new: ast.Module) -> str | None:
    """Why the change from ``old`` to ``new`` cannot change a computed value, or None when unproven."""
    if ast.dump(old) == ast.dump(new):
        return "comments or layout only"
    try:
        if normal_form(old) == normal_form(new):
            return "docstrings, log messages, renamed locals or rewrites equal on the AST only"
    except RecursionError:
        return None
    return None
