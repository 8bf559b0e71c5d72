"""Platform tests read in three values (true, false, not decided) on the AST, for ``_platform``.

Kleene's ``and``/``or``/``not`` over vLLM's ``current_platform.is_rocm()`` (``is_cuda``, ``is_cpu``, ``is_xpu``,
``is_tpu``, ``is_cuda_alike``, ...), SGLang's imported ``is_hip()`` / ``is_cuda()`` / ``is_cpu()`` / ``is_npu()`` /
..., ``torch.version.hip``, and module-level names bound once to such a test in the same file (``_is_hip =
is_hip()``, ``_use_aiter = get_bool_env_var(...) and _is_hip``). Anything else (an environment variable, a device
capability) is not decided, so ``if _is_cuda or _is_hip`` runs on both. A local or parameter of the same name hides
a module-level alias.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

from speedtrap.spec import Platform
from speedtrap.triage.source import Module

CUDA, ROCM, CPU, XPU, TPU, NPU = (
    Platform.CUDA,
    Platform.ROCM,
    Platform.CPU,
    Platform.XPU,
    Platform.TPU,
    Platform.NPU,
)
Truth = bool | None  # true, false, or not decided

# A predicate: the platforms it is true on, and those it may be either on (false on the rest).
_Pred = tuple[frozenset[Platform], frozenset[Platform]]


def _p(true: Iterable[Platform], unsure: Iterable[Platform] = ()) -> _Pred:
    return frozenset(true), frozenset(unsure)


# vLLM: methods of ``current_platform`` (vllm/platforms/interface.py: ``self._enum == PlatformEnum.X``).
# An out-of-tree platform (vllm-ascend's NPU, tpu_inference) is OOT; it may also be TPU.
VLLM_METHODS: dict[str, _Pred] = {
    "is_cuda": _p([CUDA]),
    "is_rocm": _p([ROCM]),
    "is_cpu": _p([CPU]),
    "is_xpu": _p([XPU]),
    "is_tpu": _p([TPU]),
    "is_cuda_alike": _p([CUDA, ROCM]),
    "is_neuron": _p([]),
    "is_hpu": _p([]),
    "is_unspecified": _p([]),
    "is_zen_cpu": _p([], [CPU]),
    "is_out_of_tree": _p([], [TPU, NPU]),
    "is_hip": _p([ROCM]),  # SGLang's multimodal runtime has its own current_platform
    "is_npu": _p([NPU]),
    "is_mps": _p([]),
}
# SGLang: functions of sglang/srt/utils (``torch.version.hip is not None``, ``torch.npu.is_available()``,
# ``SGLANG_USE_CPU_ENGINE=1`` on an x86 or arm64 host, ...), called bare after ``from ... import is_hip``.
# ``is_cuda_alike`` is also true on SGLang 0.5.23's "sail" devices, which are none of the choices.
SGLANG_FUNCTIONS: dict[str, _Pred] = {
    "is_cuda": _p([CUDA]),
    "is_hip": _p([ROCM]),
    "is_cuda_alike": _p([CUDA, ROCM]),
    "is_cpu": _p([CPU]),
    "is_npu": _p([NPU]),
    "is_xpu": _p([XPU]),
    "is_hpu": _p([]),
    "is_musa": _p([]),
    "is_mps": _p([]),
}
# ``torch.version.hip`` / ``.cuda``: set by the torch build (a CPU host may run either build).
TORCH_VERSION: dict[str, _Pred] = {"hip": _p([ROCM], [CPU]), "cuda": _p([CUDA], [CPU])}


def _value(pred: _Pred, platform: Platform) -> Truth:
    true, unsure = pred
    return True if platform in true else (None if platform in unsure else False)


def t_not(a: Truth) -> Truth:
    return None if a is None else not a


def t_and(values: Iterable[Truth]) -> Truth:
    out: Truth = True
    for v in values:
        if v is False:
            return False
        if v is None:
            out = None
    return out


def t_or(values: Iterable[Truth]) -> Truth:
    out: Truth = False
    for v in values:
        if v is True:
            return True
        if v is None:
            out = None
    return out


@dataclass
class Conditions:
    """The platform tests of one file: its imported predicate names and module-level aliases."""

    mod: Module

    @cached_property
    def imported(self) -> frozenset[str]:
        """Predicate names the file imports (``from sglang.srt.utils import is_hip``) or defines."""
        out: set[str] = set()
        if not any(name in self.mod.source for name in SGLANG_FUNCTIONS):
            return frozenset()
        for node in _module_level(self.mod.tree.body):
            if isinstance(node, ast.ImportFrom):
                out.update(a.asname or a.name for a in node.names if a.name in SGLANG_FUNCTIONS and not a.asname)
        out.update(n.name for n in self.mod.tree.body if isinstance(n, ast.FunctionDef) and n.name in SGLANG_FUNCTIONS)
        return frozenset(out)

    @cached_property
    def aliases(self) -> dict[str, tuple[ast.expr, int]]:
        """Names bound exactly once, at the top level of the module, and never declared ``global``."""
        seen: dict[str, list[tuple[ast.expr | None, int]]] = {}
        for node in self.mod.tree.body:
            for target, value in _bindings(node):
                seen.setdefault(target, []).append((value, node.lineno))
        nested = set(_nested_bindings(self.mod.tree.body))
        out: dict[str, tuple[ast.expr, int]] = {}
        for name, found in seen.items():
            value, line = found[0]
            if len(found) == 1 and value is not None and name not in nested and f"global {name}" not in self.mod.source:
                out[name] = (value, line)
        return out

    def truth(self, expr: ast.expr, platform: Platform, local: frozenset[str] = frozenset(), depth: int = 0) -> Truth:
        """``expr``'s truth on ``platform`` (None: not decided); ``local``: names a function around it binds,
        which hide the module's aliases (an alias's own value is read at module level)."""
        if depth > 8:
            return None
        if isinstance(expr, ast.BoolOp):
            vals = (self.truth(v, platform, local, depth + 1) for v in expr.values)
            return t_and(vals) if isinstance(expr.op, ast.And) else t_or(vals)
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            return t_not(self.truth(expr.operand, platform, local, depth + 1))
        if isinstance(expr, ast.Constant) and isinstance(expr.value, (bool, int, str, type(None))):
            return bool(expr.value)
        if isinstance(expr, ast.Name):
            bound = None if expr.id in local else self.aliases.get(expr.id)
            return self.truth(bound[0], platform, frozenset(), depth + 1) if bound is not None else None
        pred = self.predicate(expr, local)
        if pred is not None:
            return _value(pred, platform)
        if (
            isinstance(expr, ast.Compare)
            and len(expr.ops) == 1
            and isinstance(expr.ops[0], (ast.Is, ast.IsNot))
            and isinstance(expr.comparators[0], ast.Constant)
            and expr.comparators[0].value is None
        ):
            left = self.predicate(expr.left, local)  # ``torch.version.hip is not None``
            if left is not None:
                v = _value(left, platform)
                return v if isinstance(expr.ops[0], ast.IsNot) else t_not(v)
        return None

    def predicate(self, expr: ast.expr, local: frozenset[str] = frozenset()) -> _Pred | None:
        if isinstance(expr, ast.Call) and not expr.args and not expr.keywords:
            f = expr.func
            if isinstance(f, ast.Attribute) and f.attr in VLLM_METHODS and _ends(f.value, "current_platform"):
                return None if _root(f.value) in local else VLLM_METHODS[f.attr]
            if isinstance(f, ast.Name) and f.id in SGLANG_FUNCTIONS and f.id in self.imported and f.id not in local:
                return SGLANG_FUNCTIONS[f.id]
        if isinstance(expr, ast.Attribute) and expr.attr in TORCH_VERSION and _dotted(expr.value) == "torch.version":
            return TORCH_VERSION[expr.attr]
        return None

    def reads_platform(self, expr: ast.expr, local: frozenset[str] = frozenset(), depth: int = 0) -> bool:
        """Whether ``expr`` reads a platform predicate at all (itself or through an alias)."""
        for n in ast.walk(expr):
            if isinstance(n, ast.expr) and self.predicate(n, local) is not None:
                return True
            if (
                isinstance(n, ast.Name)
                and n.id in self.aliases
                and n.id not in local
                and depth < 8
                and self.reads_platform(self.aliases[n.id][0], frozenset(), depth + 1)
            ):
                return True
        return False


def _dotted(expr: ast.expr) -> str:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return f"{_dotted(expr.value)}.{expr.attr}"
    return ""


def _root(expr: ast.expr) -> str:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else ""


def local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> frozenset[str]:
    """The names a function binds (parameters, assignments, imports, loop targets): they hide the module's."""
    a = fn.args
    out = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    out.update(x.arg for x in (a.vararg, a.kwarg) if x is not None)
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((x.asname or x.name).split(".")[0] for x in n.names)
    return frozenset(out)


def _ends(expr: ast.expr, name: str) -> bool:
    return (isinstance(expr, ast.Name) and expr.id == name) or (isinstance(expr, ast.Attribute) and expr.attr == name)


def _bindings(node: ast.stmt) -> Iterator[tuple[str, ast.expr | None]]:
    """Names a top-level statement binds, with the value where it is one plain ``name = value``."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        yield node.targets[0].id, node.value
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        yield node.target.id, node.value
    elif isinstance(node, (ast.Assign, ast.AugAssign)):  # unpacking, chained, augmented: not an alias
        for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    yield n.id, None


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at import: the module's, and those in its top-level ``if``/``try``/``with``."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in [node.body, node.orelse] if isinstance(node, ast.If) else stmt_blocks(node):
                yield from _module_level(block)


def _nested_bindings(body: list[ast.stmt]) -> Iterator[str]:
    """Names (re)bound at module level inside a block (``if``, ``try``, ``for``, ``with``), or imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from ((a.asname or a.name).split(".")[0] for a in node.names)
        if isinstance(node, (ast.If, ast.Try, ast.For, ast.While, ast.With)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    yield sub.id
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    yield from ((a.asname or a.name).split(".")[0] for a in sub.names)
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    yield sub.name


def stmt_blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.With, ast.AsyncWith)):
        return [node.body]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        return [node.body, node.orelse]
    if isinstance(node, (ast.Try, ast.TryStar)):
        return [node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody]
    if isinstance(node, ast.Match):
        return [c.body for c in node.cases]
    return []
